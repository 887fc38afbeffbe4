"""Step samples for OpenRLHF: one ``Experience`` per environment step, plus a side table.

OpenRLHF's multi-turn agent API trains a whole trajectory as one sample with its rewards summed;
HGPO trains each step as its own (prompt, response) sample with its own advantage. So every row
of the shared :class:`~hgpo_train.batch.StepBatch` becomes a one-row ``Experience``.

``Experience.info`` may only hold tensors or per-sample numbers (OpenRLHF concatenates and splits
it), so ids, fingerprints and episode data stay in :class:`StepTable`, keyed by the position of
the sample in the rollout list, which is what ``RemoteExperienceMaker.split_rollout_samples``
writes into ``Experience.index`` and what survives ``Experience.concat_experiences``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from openrlhf.trainer.ppo_utils.experience import Experience

from hgpo_train.advantage import AdvantageConfig, StepCredit
from hgpo_train.batch import StepBatch
from hgpo_train.openrlhf.padding import padded_size, padding_sources


@dataclass
class StepTable:
    """What OpenRLHF's samples cannot carry, by sample position (``Experience.index``).

    ``source[i]`` is the StepBatch row of sample ``i``; padding samples copy a real row and have
    ``padding[i]`` set. Advantages are computed once, by the shared code, over the real rows.
    """

    batch: StepBatch
    source: np.ndarray
    padding: np.ndarray
    credit: StepCredit | None = field(default=None, repr=False)

    def __len__(self) -> int:
        return len(self.source)

    def rows(self, index: Sequence[int]) -> np.ndarray:
        """StepBatch rows of the samples at ``index``."""
        return self.source[np.asarray(index, dtype=np.int64)]

    def compute_advantages(self, config: AdvantageConfig) -> np.ndarray:
        """The StepBatch rows' advantages, by the local trainer's path (:meth:`StepBatch.credit`),
        kept with the values they were made from for the logs."""
        self.credit = self.batch.credit(config)
        return self.credit.advantages

    def sample_advantages(self, index: Sequence[int]) -> np.ndarray:
        """Advantages of the samples at ``index``: their row's, and 0 for padding."""
        if self.credit is None:
            raise RuntimeError("call compute_advantages first")
        index = np.asarray(index, dtype=np.int64)
        return np.where(self.padding[index], 0.0, self.credit.advantages[self.source[index]])


def step_experience(
    prompt: np.ndarray, response: np.ndarray, reward: float, *, truncated: bool, padding: bool = False
) -> Experience:
    """One sample: ``sequences`` = prompt + response, the action mask over the response.

    OpenRLHF's action mask is shifted by one (``samples_generator.py``: ``action_mask[1:]``):
    entry ``t`` says whether token ``t + 1`` was generated, matching log-probs of next tokens.
    A padding sample's mask is all zero.
    """
    sequence = torch.from_numpy(np.concatenate([prompt, response]).astype(np.int64))
    total = len(sequence)
    action_mask = torch.zeros(total - 1, dtype=torch.bool)
    if not padding:
        action_mask[len(prompt) - 1 :] = True
    reward = 0.0 if padding else float(reward)
    return Experience(
        sequences=sequence.unsqueeze(0),
        attention_mask=torch.ones(1, total, dtype=torch.long),
        action_mask=action_mask.unsqueeze(0),
        rewards=torch.tensor([reward]),
        scores=torch.tensor([reward]),
        response_length=torch.tensor([0 if padding else len(response)]),
        total_length=torch.tensor([float(total)]),
        truncated=torch.tensor([truncated and not padding]),
        info={"reward": torch.tensor([reward])},
    )


def step_experiences(
    batch: StepBatch, multiple: int, end_ids: Sequence[int]
) -> tuple[list[Experience], StepTable]:
    """One Experience per row of ``batch``, padded to a multiple of ``multiple`` samples.

    A response that does not end in one of ``end_ids`` hit the token limit (``truncated``).
    """
    if not len(batch):
        raise ValueError("the rollout produced no step samples")
    n = len(batch)
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
                batch.prompt_ids[row], response, batch.reward[row], truncated=truncated, padding=bool(pad)
            )
        )
    return samples, StepTable(batch, source, padding)
