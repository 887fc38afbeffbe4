"""The engine–policy gap: do the vLLM engines sample from the policy DeepSpeed trains?

After every weight sync the engines should hold the policy's weights. A sync that failed, was
skipped or sent stale tensors shows as a gap between the log-probs the engines and the policy
give the same tokens (what OpenRLHF and verl users watch as ``vllm_kl`` or rollout-training
mismatch). Each iteration, before the update, a few of its step samples (:data:`PROBES`) are
scored on **every** engine with ``prompt_logprobs`` (a prefill, no sampling) and by the DeepSpeed
policy (OpenRLHF's actor ``forward``). Both are log-probs of the full vocabulary at temperature
1: the engine's prompt log-probs see neither the mask of constrained decoding nor the sampling
temperature (the policy scores the probes with the constraints' store emptied),
so the gap is measured where the two are comparable (``generation.temperature == 1``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import ray

from hgpo_train.rollout.batch import StepBatch

PROBES = 4
"""Step samples per iteration scored on every engine."""


def probe_rows(batch: StepBatch, count: int = PROBES) -> list[int]:
    """Rows spread over the batch (so over task groups and steps)."""
    return sorted({int(i) for i in np.linspace(0, len(batch) - 1, min(count, len(batch)))})


def score_on_engines(
    engines: Sequence[Any], batch: StepBatch, rows: Sequence[int]
) -> list[dict[int, np.ndarray]]:
    """Per engine, each probe row's response-token log-probs as that engine computes them."""
    import vllm

    params = vllm.SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0)
    sequences = {row: [*batch.prompt_ids[row].tolist(), *batch.response_ids[row].tolist()] for row in rows}
    refs = [[engine.generate.remote(sequences[row], params) for row in rows] for engine in engines]
    scores = []
    for engine_refs in refs:
        scored = {}
        for row, output in zip(rows, ray.get(engine_refs)):
            ids, start = sequences[row], len(batch.prompt_ids[row])
            scored[row] = np.array(
                [output.prompt_logprobs[t][ids[t]].logprob for t in range(start, len(ids))]
            )
        scores.append(scored)
    return scores


def policy_logprobs(actor_group: Any, batch: StepBatch, rows: Sequence[int]) -> dict[int, np.ndarray]:
    """The DeepSpeed policy's log-probs of the probe rows' response tokens (OpenRLHF's actor ``forward``,
    on every rank, as experience making calls it)."""
    from openrlhf.trainer.ppo_utils.experience import Experience

    from hgpo_train.openrlhf.samples import step_experience

    probe = Experience.concat_experiences(
        [  # probes are scored, never trained on: no reward, no advantage
            step_experience(batch.prompt_ids[r], batch.response_ids[r], 0.0, 0.0, truncated=False)
            for r in rows
        ],
        pad_token_id=0,
    )
    scored = ray.get(
        actor_group.async_run_method(
            method_name="forward",
            sequences=probe.sequences,
            action_mask=probe.action_mask,
            attention_mask=probe.attention_mask,
        )
    )[0]
    return {row: scored[k][probe.action_mask[k]].float().numpy() for k, row in enumerate(rows)}


def gap_metrics(
    engine_scores: Sequence[dict[int, np.ndarray]], policy: dict[int, np.ndarray]
) -> dict[str, float]:
    """Mean and max |log p_engine − log p_policy| per token, per engine and over all of them."""
    out: dict[str, float] = {}
    for k, scored in enumerate(engine_scores):
        diffs = np.concatenate([np.abs(scored[row] - policy[row]) for row in policy])
        out[f"engine_gap/mean_engine{k}"] = float(diffs.mean())
        out[f"engine_gap/max_engine{k}"] = float(diffs.max())
    if engine_scores:  # the worst engine's
        out["engine_gap/mean"] = max(out[f"engine_gap/mean_engine{k}"] for k in range(len(engine_scores)))
        out["engine_gap/max"] = max(out[f"engine_gap/max_engine{k}"] for k in range(len(engine_scores)))
    return out
