"""The two sides of every estimator: the batch's columns, checked once (:class:`Rows`), and
what it returns (:class:`StepCredit`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from hgpo_train.advantage.columns import as_fingerprints, float_column, id_codes


@dataclass(frozen=True)
class Rows:
    """One batch's step rows as every estimator reads them. Rows of a rollout are in
    chronological order; the optional columns are None where the caller did not give them."""

    reward: np.ndarray
    """float64 (n,): the env's reward after each step."""
    groups: np.ndarray
    """Dense task-group codes."""
    rollouts: np.ndarray
    """Dense rollout codes 0..R-1, unique across the batch (a rollout is a (group, traj) pair)."""
    invalid: Any
    """0/1 per row, the response was invalid, or None (no step was)."""
    fingerprints: np.ndarray | None
    """uint64 (n, K+1) context fingerprints; level 0 is the state key."""
    next_states: Any
    """Each step's next-state key (graph returns)."""
    action_keys: Any
    """Each step's action key (CRBC)."""
    won: Any
    """Per row, the env's ``won`` after the step; a rollout succeeded when its last row's is set (CRBC)."""

    @classmethod
    def from_columns(
        cls,
        rewards: Any,
        traj_ids: Any,
        group_ids: Any,
        fingerprints: Any = None,
        invalid: Any = None,
        next_states: Any = None,
        action_keys: Any = None,
        won: Any = None,
    ) -> Rows:
        """Checked rows; traj ids may restart in every group."""
        reward = float_column(rewards, "rewards")
        n = len(reward)
        groups = id_codes(group_ids, "group_ids", n)
        trajs = id_codes(traj_ids, "traj_ids", n)
        fp = None if fingerprints is None else as_fingerprints(fingerprints, n)
        return cls(reward, groups, rollout_codes(groups, trajs), invalid, fp, next_states, action_keys, won)

    def __len__(self) -> int:
        return len(self.reward)

    def state_keys(self, estimator: str) -> np.ndarray:
        """The fingerprints, which every stepwise estimator needs."""
        if self.fingerprints is None:
            raise ValueError(f"the {estimator} estimator needs fingerprints")
        return self.fingerprints


@dataclass(frozen=True)
class StepCredit:
    """A batch's advantages and the per-step values its estimator normalised to make them."""

    advantages: np.ndarray
    returns: np.ndarray
    """What each step is credited with: its discounted or graph return, minus its invalid
    penalty (gigpo, hgpo, graphgpo); its episode score (grpo); the value of the state it led to,
    minus its penalty (g2po); Q(s, a) of its anchor and action (crbc). Diagnostics describe
    these, so they describe what the update used."""
    state_values: np.ndarray | None = None
    """crbc: V(s) of each step's anchor, the baseline its Q was compared with; None otherwise."""


def rollout_codes(groups: np.ndarray, trajs: np.ndarray) -> np.ndarray:
    """Dense codes of the (group, traj) pairs: the traj codes themselves when each belongs to one
    group (ids unique across the batch, the common case), else the pairs' codes."""
    owner = np.empty(int(trajs.max(initial=-1)) + 1, dtype=np.int64)
    owner[trajs] = groups
    if (owner[trajs] == groups).all():
        return trajs
    return id_codes(groups * len(owner) + trajs, "traj_ids")
