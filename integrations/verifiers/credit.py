"""Step credit into verifiers traces: any of our estimators over one group of traces (the
rollouts of one task), each turn's advantage written where verifiers' trainers read it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from hgpo_train.advantage import AdvantageConfig, StepCredit, step_credit
from hgpo_train.advantage.settings import SUCCESS_REWARD
from integrations.verifiers.steps import TraceSteps, trace_steps


def assign_step_credit(
    traces: Sequence[Any],
    config: AdvantageConfig = AdvantageConfig(),
    *,
    history_length: int = 2,
    success_reward: float = 1.0,
) -> StepCredit:
    """Credit every model turn of ``traces`` (finished ``verifiers.v1.Trace`` objects, all of one
    task) under ``config`` and write it into the traces.

    Each turn's advantage fills its assistant node's per-token ``advantages`` (one value over its
    sampled tokens, as verifiers' ``Branch.advantages`` spreads them) and, per turn, the list
    ``trace.info["step_advantages"]`` (for traces whose nodes carry no tokens, as an eval client's).
    Returns the credit, rows in trace order then turn order. ``history_length`` and
    ``success_reward`` apply to traces whose keys are computed (:func:`trace_steps`); a trace
    whose reward reaches ``success_reward`` won, and every estimator that reads success reads that
    (``config.success_reward`` may only repeat it).
    """
    if not traces:
        raise ValueError("assign_step_credit needs at least one trace")
    for item in traces:
        if not hasattr(item, "nodes"):
            hint = (
                ": pass their traces, [t for e in episodes for t in e.traces]"
                if hasattr(item, "traces")
                else ""
            )
            raise TypeError(f"assign_step_credit takes verifiers Traces, got a {type(item).__name__}{hint}")
    if config.success_reward not in (SUCCESS_REWARD, success_reward):
        raise ValueError(
            f"two success definitions: success_reward={success_reward} and AdvantageConfig.success_reward="
            f"{config.success_reward}; a trace's success is success_reward's here, so set only that"
        )
    keys = {trace.task.key for trace in traces}
    if len(keys) > 1:
        raise ValueError(f"a group is the rollouts of one task; these traces have {len(keys)} task keys")
    steps = [trace_steps(t, history_length=history_length, success_reward=success_reward) for t in traces]
    widths = {s.fingerprints.shape[1] for s in steps}
    if len(widths) > 1:
        raise ValueError(f"the traces' fingerprints have different depths {sorted(widths)}: one K per group")
    credit = step_credit(
        np.concatenate([s.reward for s in steps]),
        np.repeat(np.arange(len(steps)), [len(s.nodes) for s in steps]),
        np.zeros(sum(len(s.nodes) for s in steps), dtype=np.int64),
        np.concatenate([s.fingerprints for s in steps]),
        np.concatenate([s.invalid for s in steps]),
        config,
        next_states=np.concatenate([s.next_state for s in steps]),
        action_keys=np.concatenate([s.action_key for s in steps]),
        won=np.concatenate(
            [
                np.arange(len(s.nodes)) == len(s.nodes) - 1 if s.won else np.zeros(len(s.nodes), bool)
                for s in steps
            ]
        ),
    )
    start = 0
    for trace, rollout in zip(traces, steps, strict=True):
        advantages = credit.advantages[start : start + len(rollout.nodes)]
        _write(trace, rollout, advantages)
        start += len(rollout.nodes)
    return credit


def _write(trace: Any, steps: TraceSteps, advantages: np.ndarray) -> None:
    for node_index, advantage in zip(steps.nodes, advantages, strict=True):
        node = trace.nodes[node_index]
        node.advantages = [float(advantage)] * sum(node.mask)
    trace.info["step_advantages"] = [float(a) for a in advantages]
