"""CRBC, the Cross-Rollout Bellman Closure (arXiv 2609.35082, section 4; shared/CRBC_SPEC.md).

Each task group's steps are an empirical Markov process over its anchors (level-0 state keys):
N(s, a, x) counts the steps from anchor s by action a to successor x, the next step's anchor or
a boundary, success (worth 1) or failure (0). The closure solves ``(I - beta M) V = b`` on it,
``Q(s, a) = beta * E[V(x) | s, a]``, and a step's credit is ``Q - V`` at its anchor, scaled by the
anchor's spread, where at least two actions were tried. The finite depths K apply the Bellman
operator K times to the visit-averaged discounted success instead of solving.

Two identities keep it a few array passes at batch scale. ``mu(a|s) P(x|s, a)`` is the share of
the visits to s that went to x, so every expectation is a mean over visits (a ``bincount``).
And anchors are per group, so the batch's system is block diagonal: one sparse LU solves every
group's exactly at once (SuperLU orders the nearly acyclic blocks with little fill); no dense
solve over a group's anchors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from hgpo_train.advantage.columns import level0
from hgpo_train.advantage.config import AdvantageConfig
from hgpo_train.advantage.grouping import nested_codes, next_rows, positions, rollout_success
from hgpo_train.advantage.grpo import episode_advantages
from hgpo_train.advantage.returns import episode_scores
from hgpo_train.advantage.rows import Rows, StepCredit
from hgpo_train.advantage.settings import CLOSURE, CRBCSettings


@dataclass(frozen=True)
class _Process:
    """One batch's empirical process: per row its anchor, (anchor, action) pair and successor;
    successors ``anchors`` and ``anchors + 1`` are the success and failure boundaries."""

    anchor: np.ndarray
    pair: np.ndarray
    successor: np.ndarray
    anchors: int
    visits: np.ndarray
    """Visits per anchor, N(s)."""
    success: np.ndarray
    """Per row, its rollout succeeded."""

    @property
    def internal(self) -> np.ndarray:
        return self.successor < self.anchors

    @staticmethod
    def mean_over_visits(codes: np.ndarray, values: np.ndarray, size: int) -> np.ndarray:
        """Per code, the mean of ``values`` over the rows with that code."""
        return np.bincount(codes, weights=values, minlength=size) / np.bincount(codes, minlength=size)

    def backup(self, values: np.ndarray) -> np.ndarray:
        """Per row, V of its successor, from the anchors' ``values`` and the boundaries' 1 and 0."""
        return np.concatenate([values, [1.0, 0.0]])[self.successor]

    @property
    def eligible(self) -> np.ndarray:
        """Per row, two or more distinct actions were taken from its anchor."""
        pair_anchor = np.zeros(int(self.pair.max(initial=-1)) + 1, dtype=np.int64)
        pair_anchor[self.pair] = self.anchor
        return (np.bincount(pair_anchor, minlength=self.anchors) >= 2)[self.anchor]


def _process(rows: Rows) -> _Process:
    """The rows' empirical process, after checking the columns CRBC reads."""
    fingerprints = rows.state_keys("crbc")
    if rows.action_keys is None:
        raise ValueError("the crbc estimator needs each step's action key (action_keys, info['action_key'])")
    if rows.won is None:
        raise ValueError("the crbc estimator needs the env's won flag per step (won, info['won'])")
    n = len(rows)
    try:
        actions = level0(rows.action_keys, n)
    except ValueError as error:  # its message names fingerprints
        raise ValueError(f"action_keys: {error}".replace("fingerprints", "keys")) from None
    anchor, pair = nested_codes(rows.groups, level0(fingerprints), actions)
    anchors = int(anchor.max(initial=-1)) + 1
    after = next_rows(rows.rollouts)
    last = after < 0
    succeeded = rollout_success(rows.won, rows.rollouts)
    success = succeeded[rows.rollouts]
    boundary = np.where(success, anchors, anchors + 1)
    successor = np.where(last, boundary, anchor[np.maximum(after, 0)])
    visits = np.bincount(anchor, minlength=anchors)
    return _Process(anchor, pair, successor, anchors, visits, success)


def _closure_values(process: _Process, beta: float) -> np.ndarray:
    """V of every anchor from ``N(s) V(s) - beta * sum over visits of V(x) = beta * N(s, z+)``,
    the closure multiplied through by N(s), in one sparse solve."""
    from scipy.sparse import csc_matrix, diags
    from scipy.sparse.linalg import spsolve

    m = process.anchors
    if m == 0:
        return np.zeros(0)
    internal = process.internal
    coupling = csc_matrix(
        (np.full(int(internal.sum()), -beta), (process.anchor[internal], process.successor[internal])),
        shape=(m, m),
    )
    reached = np.bincount(process.anchor, weights=process.successor == m, minlength=m)
    system = (coupling + diags(process.visits.astype(np.float64))).tocsc()
    # anchor codes run group by group, so the system is block diagonal in its own order: no
    # fill-reducing permutation is needed to keep the factors within the blocks
    return np.atleast_1d(spsolve(system, beta * reached, permc_spec="NATURAL"))


def _values(rows: Rows, process: _Process, settings: CRBCSettings) -> tuple[np.ndarray, np.ndarray]:
    """(Q of each (anchor, action) pair, V of each anchor) at the settings' depth."""
    beta, m = settings.beta, process.anchors
    pairs = int(process.pair.max(initial=-1)) + 1
    if settings.depth == CLOSURE:
        v = _closure_values(process, beta)
        return beta * process.mean_over_visits(process.pair, process.backup(v), pairs), v
    position, length = positions(rows.rollouts)
    realised = np.where(process.success, beta ** (length - position).astype(np.float64), 0.0)
    v = process.mean_over_visits(process.anchor, realised, m)
    q = process.mean_over_visits(process.pair, realised, pairs)
    for _ in range(int(settings.depth)):
        backed = beta * process.backup(v)
        q = process.mean_over_visits(process.pair, backed, pairs)
        v = process.mean_over_visits(process.anchor, backed, m)
    return q, v


def _step_credit(
    process: _Process, q: np.ndarray, v: np.ndarray, sigma_min: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row: the gated, scaled step credit A^S, its Q and its anchor's V."""
    q_row, v_row = q[process.pair], v[process.anchor]
    gap = q_row - v_row
    spread = np.sqrt(process.mean_over_visits(process.anchor, gap * gap, process.anchors))
    scaled = np.where(process.eligible, gap / np.maximum(spread[process.anchor], sigma_min), 0.0)
    return scaled, q_row, v_row


def crbc_advantages(
    rewards: Any,
    traj_ids: Any,
    group_ids: Any,
    states: Any,
    action_keys: Any,
    won: Any,
    invalid: Any = None,
    config: AdvantageConfig | None = None,
) -> np.ndarray:
    """CRBC's advantages, ``w_G * A^G + w_S * A^S``, from raw columns (see :func:`credit`);
    ``config`` defaults to ``AdvantageConfig(estimator="crbc")``."""
    from hgpo_train.advantage.config import AdvantageConfig

    rows = Rows.from_columns(rewards, traj_ids, group_ids, states, invalid, action_keys=action_keys, won=won)
    return credit(rows, config or AdvantageConfig(estimator="crbc")).advantages


def credit(rows: Rows, config: AdvantageConfig) -> StepCredit:
    """CRBC: GRPO's episode term (``episode_weight``, ``mode``, ``invalid_penalty``) plus
    ``crbc.step_weight`` times the step credit from the group's own transitions. Rewards and
    the invalid penalty enter the episode term only; the process sees each rollout's success
    (the env's ``won`` on its last step) and nothing else. Returns Q(s, a) per row as
    ``returns`` and V(s) as ``state_values``."""
    settings = config.crbc
    process = _process(rows)
    q, v = _values(rows, process, settings)
    step, q_row, v_row = _step_credit(process, q, v, settings.sigma_min)
    scores = episode_scores(rows.reward, rows.rollouts, rows.invalid, config.invalid_penalty)
    episode = episode_advantages(scores, rows.groups, config.mode)
    return StepCredit(config.episode_weight * episode + settings.step_weight * step, q_row, v_row)
