"""The configured estimator rebuilt from its own function in ``hgpo_train.advantage``: the golden
value the trainers' and integrations' credit paths are checked against, independently of them."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hgpo_train.advantage import (
    AdvantageConfig,
    MVPOState,
    ProgressColumns,
    crbc_advantages,
    episode_scores,
    g2po_advantages,
    gigpo_advantages,
    graph_returns,
    grpo_advantages,
    hgpo_advantages,
    mvpo_advantages,
    step_returns,
)
from hgpo_train.rollout.batch import StepBatch


def reference_advantages(
    rewards: Sequence[float],
    rollouts: Sequence[str],
    groups: Sequence[object],
    invalid: Sequence[bool],
    fingerprints: np.ndarray,
    config: AdvantageConfig,
    next_states: Sequence[int] | None = None,
    action_keys: Sequence[int] | None = None,
    won: Sequence[bool] | None = None,
    progress: ProgressColumns | None = None,
    state: MVPOState | None = None,
) -> np.ndarray:
    """The configured estimator on raw step columns (rows of a rollout in chronological order);
    ``progress`` and ``state`` are MVPO's milestones and carried state."""
    scores = episode_scores(rewards, rollouts, invalid, config.invalid_penalty)
    if config.estimator == "mvpo":
        assert progress is not None
        return mvpo_advantages(
            rewards, rollouts, groups, fingerprints, won, progress.signatures, progress.next_signatures,
            progress.milestones, progress.next_milestones, invalid, state=state, settings=config.mvpo,
            gamma=config.gamma, invalid_penalty=config.invalid_penalty,
        ).advantages  # fmt: skip
    if config.estimator == "grpo":
        return grpo_advantages(scores, groups, config.mode)
    if config.estimator == "crbc":
        return crbc_advantages(rewards, rollouts, groups, fingerprints, action_keys, won, invalid, config)
    if config.estimator == "g2po":
        return g2po_advantages(
            rewards, rollouts, groups, fingerprints, invalid, config.mode, config.gamma,
            config.invalid_penalty, config.step_weight, config.success_reward, won,
        )  # fmt: skip
    if config.returns == "graph":
        returns = graph_returns(
            rewards, rollouts, groups, fingerprints[:, 0], next_states, config.gamma, invalid,
            config.invalid_penalty, config.normalize_distance,
        )  # fmt: skip
    else:
        returns = step_returns(rewards, rollouts, config.gamma, invalid, config.invalid_penalty)
    if config.estimator in ("gigpo", "graphgpo"):
        return gigpo_advantages(
            returns, scores, groups, fingerprints, config.mode, config.step_weight, config.episode_weight
        )
    return hgpo_advantages(
        returns,
        groups,
        fingerprints,
        config.mode,
        config.alpha,
        config.base_group,
        scores,
        config.weight_offset,
    )


def batch_reference_advantages(
    batch: StepBatch, config: AdvantageConfig, state: MVPOState | None = None
) -> np.ndarray:
    """:func:`reference_advantages` on a trainer's batch; rollouts are keyed by "group/traj"."""
    rollouts = [f"{g}/{t}" for g, t in zip(batch.group_id, batch.traj_id)]
    return reference_advantages(
        batch.reward, rollouts, batch.group_id, batch.invalid, batch.fingerprints, config,
        next_states=batch.next_state, action_keys=batch.action_key, won=batch.outcome == "won",
        progress=batch.progress, state=state,
    )  # fmt: skip
