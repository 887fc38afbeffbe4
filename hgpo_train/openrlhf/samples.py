"""Step samples for OpenRLHF: one ``Experience`` per environment step, carrying its advantage.

OpenRLHF's multi-turn agent API trains a whole trajectory as one sample with its rewards summed;
HGPO trains each step as its own (prompt, response) sample with its own advantage. So every row
of the shared :class:`~hgpo_train.rollout.batch.StepBatch` becomes a one-row ``Experience``, and the
step's advantage, computed by the trainer before the samples are made, rides in its
``info[ADVANTAGE]``: ``Experience.info`` holds per-sample tensors, which OpenRLHF keeps through
``split_rollout_samples``, ``concat_experiences`` and the model forward passes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch
from openrlhf.trainer.ppo_utils.experience import Experience

from hgpo_train.openrlhf.padding import padded_size, padding_sources
from hgpo_train.rollout.batch import StepBatch

ADVANTAGE = "step_advantage"
"""The ``Experience.info`` key of a sample's step advantage (0 for a padding sample)."""


class SampleLayout(NamedTuple):
    """Which StepBatch row each sample was made from: ``source[i]``; padding samples copy a real
    row (the shortest) and have ``padding[i]`` set."""

    source: np.ndarray
    padding: np.ndarray


def step_experience(
    prompt: np.ndarray,
    response: np.ndarray,
    reward: float,
    advantage: float,
    *,
    truncated: bool,
    padding: bool = False,
    behaviour_logprobs: np.ndarray | None = None,
) -> Experience:
    """One sample: ``sequences`` = prompt + response, the action mask over the response.

    OpenRLHF's action mask is shifted by one (``samples_generator.py``: ``action_mask[1:]``):
    entry ``t`` says whether token ``t + 1`` was generated, matching log-probs of next tokens.
    A padding sample's mask is all zero, and so are its reward and advantage. The engine's
    ``behaviour_logprobs`` of the response tokens, when given, are ``rollout_log_probs`` on the
    same columns (OpenRLHF's off-policy correction reads them).
    """
    sequence = torch.from_numpy(np.concatenate([prompt, response]).astype(np.int64))
    total = len(sequence)
    action_mask = torch.zeros(total - 1, dtype=torch.bool)
    if not padding:
        action_mask[len(prompt) - 1 :] = True
    reward, advantage = (0.0, 0.0) if padding else (float(reward), float(advantage))
    rollout_log_probs = None
    if behaviour_logprobs is not None:
        rollout_log_probs = torch.zeros(1, total - 1, dtype=torch.float32)
        if not padding:
            rollout_log_probs[0, len(prompt) - 1 :] = torch.from_numpy(behaviour_logprobs.astype(np.float32))
    return Experience(
        sequences=sequence.unsqueeze(0),
        attention_mask=torch.ones(1, total, dtype=torch.long),
        action_mask=action_mask.unsqueeze(0),
        rewards=torch.tensor([reward]),
        scores=torch.tensor([reward]),
        response_length=torch.tensor([0 if padding else len(response)]),
        total_length=torch.tensor([float(total)]),
        truncated=torch.tensor([truncated and not padding]),
        rollout_log_probs=rollout_log_probs,
        info={"reward": torch.tensor([reward]), ADVANTAGE: torch.tensor([advantage], dtype=torch.float64)},
    )


def step_experiences(
    batch: StepBatch, advantages: np.ndarray, multiple: int, end_ids: Sequence[int]
) -> tuple[list[Experience], SampleLayout]:
    """One Experience per row of ``batch`` with the row's advantage, padded to a multiple of
    ``multiple`` samples.

    A response that does not end in one of ``end_ids`` hit the token limit (``truncated``).
    The batch's behaviour log-probs, when recorded, go with every sample.
    """
    if not len(batch):
        raise ValueError("the rollout produced no step samples")
    n = len(batch)
    if len(advantages) != n:
        raise ValueError(f"{len(advantages)} advantages for {n} step rows")
    extra = padding_sources(batch.prompt_lengths + batch.response_lengths, padded_size(n, multiple) - n)
    source = np.concatenate([np.arange(n), extra])
    padding = np.arange(len(source)) >= n
    ends = set(end_ids)
    samples = []
    for row, pad in zip(source, padding):
        response = batch.response_ids[row]
        truncated = not len(response) or int(response[-1]) not in ends
        samples.append(
            step_experience(
                batch.prompt_ids[row],
                response,
                batch.reward[row],
                advantages[row],
                truncated=truncated,
                padding=bool(pad),
                behaviour_logprobs=batch.behaviour_logprobs[row]
                if batch.behaviour_logprobs is not None
                else None,
            )
        )
    return samples, SampleLayout(source, padding)
