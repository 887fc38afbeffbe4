"""G2PO, as its released code computes it: a step is credited with the value of the state it
leads to, normalised within its state and within its task."""

from __future__ import annotations

from typing import Any

import numpy as np

from hgpo_train.advantage.columns import (
    Mode,
    check_mode,
    float_column,
    id_codes,
    invalid_penalties,
    level0,
    real_setting,
)
from hgpo_train.advantage.config import AdvantageConfig
from hgpo_train.advantage.grouping import next_rows, normalise, pair_codes, positions, rollout_success
from hgpo_train.advantage.grpo import episode_advantages
from hgpo_train.advantage.rows import Rows, StepCredit
from hgpo_train.advantage.settings import SUCCESS_REWARD


def g2po_advantages(
    rewards: Any,
    traj_ids: Any,
    group_ids: Any,
    states: Any,
    invalid: Any = None,
    mode: Mode = "mean_std_norm",
    gamma: float = 0.95,
    invalid_penalty: float = 0.1,
    step_weight: float = 1.0,
    success_reward: float = SUCCESS_REWARD,
    won: Any = None,
) -> np.ndarray:
    """G2PO, as its released code (Nala-YN/G2PO ``g2po/core_g2po.py``) computes it.

    Steps of a task group that act in one state (level 0 of ``states``) form a state group whose
    value is the mean over its steps of ``gamma ** (T - t) * E``: ``E`` the rollout's episode
    reward (the sum of its rewards, before invalid penalties), ``T`` its length, ``t`` the step's
    0-based position, so a rollout's last step is discounted once. A step leads to the state group
    of the next step of its rollout; a last step to a terminal worth ``success_reward`` when
    ``E == success_reward`` exactly (the code's success test) and 0 otherwise; given ``won`` (the
    env's flag after each step, as every other estimator reads success), a rollout whose last row
    won ends at a terminal worth its ``E``, which is the code's value wherever the win's reward is
    the episode's only reward (every env here), and right where it is not (0/1 rewards: the code's
    test against 10 would call every win a loss). The advantage is
    GRPO's episode term (as :func:`grpo_advantages`) plus ``step_weight`` times (a) the value led
    to minus the step's invalid penalty, normalised within the state group (0 in a group of one),
    and (b) that value minus the state group's own, normalised over the task group. Statistics
    use the unbiased std. ``traj_ids`` must identify rollouts uniquely across the batch.
    """
    check_mode(mode)
    r = float_column(rewards, "rewards")
    n = len(r)
    rollout = id_codes(traj_ids, "traj_ids", n)
    return _g2po(
        r,
        rollout,
        id_codes(group_ids, "group_ids", n),
        level0(states, n),
        invalid_penalties(invalid, invalid_penalty, n),
        mode,
        real_setting(gamma, "gamma", 0.0, 1.0),
        real_setting(step_weight, "step_weight"),
        real_setting(success_reward, "success_reward"),
        None if won is None else rollout_success(won, rollout)[rollout],
    )[0]


def _g2po(
    r: np.ndarray,
    rollout: np.ndarray,
    groups: np.ndarray,
    states: np.ndarray,
    penalty: np.ndarray,
    mode: str,
    gamma: float,
    step_weight: float,
    success_reward: float,
    succeeded: np.ndarray | None,
) -> tuple[np.ndarray, np.ndarray]:
    """G2PO's advantages and what it credits each step with: the value of the state it led to,
    minus its invalid penalty (see :func:`g2po_advantages`; ``succeeded``: per row, its rollout
    won, or None for the code's test)."""
    episode = np.bincount(rollout, weights=r)[rollout]
    position, length = positions(rollout)
    state = pair_codes(groups, states)
    members = np.bincount(state)
    value = np.bincount(state, weights=gamma ** (length - position).astype(np.float64) * episode) / members
    after = next_rows(rollout)
    if succeeded is None:
        terminal = np.where(episode == success_reward, success_reward, 0.0)
    else:
        terminal = np.where(succeeded, episode, 0.0)
    value_next = np.where(after >= 0, value[state[np.maximum(after, 0)]], terminal)
    credited = value_next - penalty
    within_state = normalise(credited, state, mode, ddof=1)
    gain = normalise(value_next - value[state], groups, mode, ddof=1)
    return episode_advantages(episode - penalty, groups, mode) + step_weight * (within_state + gain), credited


def credit(rows: Rows, config: AdvantageConfig) -> StepCredit:
    """G2PO's advantages, crediting each step with the value of the state it led to."""
    fingerprints = rows.state_keys(config.estimator)
    n = len(rows)
    advantages, credited = _g2po(
        rows.reward,
        rows.rollouts,
        rows.groups,
        level0(fingerprints),
        invalid_penalties(rows.invalid, config.invalid_penalty, n),
        config.mode,
        config.gamma,
        config.step_weight,
        config.success_reward,
        None if rows.won is None else rollout_success(rows.won, rows.rollouts)[rows.rollouts],
    )
    return StepCredit(advantages, credited)
