"""The two sides of every estimator: the batch's columns, checked once (:class:`Rows`), and
what it returns (:class:`StepCredit`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from hgpo_train.advantage.columns import as_fingerprints, float_column, id_codes, to_numpy

MILESTONE_COUNT = 5
"""Flags per observation: three kinds of progress, success, an invalid step (:mod:`hgpo_env.contract.milestones`)."""


@dataclass(frozen=True)
class ProgressColumns:
    """Per row, the progress signature and milestone flags (``info["progress_signature"]``,
    ``info["milestones"]``) of the observation the step acted on, and of the one it produced (for
    a rollout's last row, the final observation): what MVPO's potential reads."""

    signatures: np.ndarray
    next_signatures: np.ndarray
    milestones: np.ndarray
    """int32 (n, 5), 0/1."""
    next_milestones: np.ndarray

    @classmethod
    def from_columns(
        cls, signatures: Any, next_signatures: Any, milestones: Any, next_milestones: Any, n: int
    ) -> ProgressColumns:
        """Checked columns of ``n`` rows (signatures: ints or strings; milestones: 0/1 or booleans)."""
        return cls(
            _signature_column(signatures, "signatures", n),
            _signature_column(next_signatures, "next_signatures", n),
            _milestone_column(milestones, "milestones", n),
            _milestone_column(next_milestones, "next_milestones", n),
        )

    @classmethod
    def from_steps(cls, steps: Sequence[tuple[Any, Any, Any, Any] | None]) -> ProgressColumns | None:
        """Columns of per-step ``(signature, milestones, next_signature, next_milestones)``; None
        unless every step has them."""
        if not steps or any(step is None for step in steps):
            return None
        signatures, milestones, next_signatures, next_milestones = zip(*steps)
        return cls.from_columns(
            np.array(signatures),
            np.array(next_signatures),
            np.array(milestones),
            np.array(next_milestones),
            len(steps),
        )

    def take(self, rows: np.ndarray) -> ProgressColumns:
        """These columns' ``rows``, in that order."""
        return ProgressColumns(*(getattr(self, f.name)[rows] for f in fields(ProgressColumns)))

    @staticmethod
    def concatenate(parts: list[ProgressColumns | None]) -> ProgressColumns | None:
        """The rows of ``parts`` in order; None unless every part has milestones."""
        if not parts or any(part is None for part in parts):
            return None
        return ProgressColumns(
            *(np.concatenate([getattr(part, f.name) for part in parts]) for f in fields(ProgressColumns))
        )


def _signature_column(values: Any, name: str, n: int) -> np.ndarray:
    a = to_numpy(values)
    if a.shape != (n,):
        raise ValueError(f"{name} must hold one signature per row ({n}), got shape {a.shape}")
    return a


def _milestone_column(values: Any, name: str, n: int) -> np.ndarray:
    a = to_numpy(values)
    if a.shape != (n, MILESTONE_COUNT):
        raise ValueError(f"{name} must be {MILESTONE_COUNT} 0/1 flags per row, got shape {a.shape}")
    if not ((a == 0) | (a == 1)).all():
        raise ValueError(f"{name} must hold only 0/1 (or booleans)")
    return a.astype(np.int32)


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
    """Per row, the env's ``won`` after the step; a rollout succeeded when its last row's is set
    (CRBC, MVPO; G2PO when given)."""
    progress: ProgressColumns | None = None
    """The milestones of each row's observations (MVPO)."""

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
        progress: ProgressColumns | None = None,
    ) -> Rows:
        """Checked rows; traj ids may restart in every group."""
        reward = float_column(rewards, "rewards")
        n = len(reward)
        groups = id_codes(group_ids, "group_ids", n)
        trajs = id_codes(traj_ids, "traj_ids", n)
        fp = None if fingerprints is None else as_fingerprints(fingerprints, n)
        if progress is not None and len(progress.signatures) != n:
            raise ValueError(f"progress columns have {len(progress.signatures)} rows, expected {n}")
        rollouts = rollout_codes(groups, trajs)
        return cls(reward, groups, rollouts, invalid, fp, next_states, action_keys, won, progress)

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

    def carried(self) -> dict[str, Any] | None:
        """What the estimator carries to the next iteration (JSON-safe, saved with checkpoints);
        None for the estimators that carry nothing."""
        return None


def rollout_codes(groups: np.ndarray, trajs: np.ndarray) -> np.ndarray:
    """Dense codes of the (group, traj) pairs: the traj codes themselves when each belongs to one
    group (ids unique across the batch, the common case), else the pairs' codes."""
    owner = np.empty(int(trajs.max(initial=-1)) + 1, dtype=np.int64)
    owner[trajs] = groups
    if (owner[trajs] == groups).all():
        return trajs
    return id_codes(groups * len(owner) + trajs, "traj_ids")
