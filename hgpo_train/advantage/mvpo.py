"""MVPO: GiGPO's credit, and where an anchor group's returns do not differ (all its rollouts failed
alike) a potential difference built from milestones the env sees, per ``shared/MVPO_SPEC.md``
(arXiv 2609.37111, section 4; no code is public, so the spec's equations E1-E19 and its choices are
the contract; the comments name them).

Besides GiGPO's columns it reads, per row, the progress signature and the five milestone triggers
of the observation the step acted on and of the one it produced (for a rollout's last row, the
final observation), and the rollout's success (``won`` on its last row). It keeps state across
iterations (:class:`MVPOState`: the milestone weights and the success EMA), which a trainer saves
with its checkpoints.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from hgpo_train.advantage.columns import id_codes, level0, real_setting, to_numpy
from hgpo_train.advantage.config import AdvantageConfig
from hgpo_train.advantage.gigpo import _step_term
from hgpo_train.advantage.grouping import EPS, normalise, pair_codes, rollout_success, threads_for
from hgpo_train.advantage.grpo import episode_advantages
from hgpo_train.advantage.returns import episode_scores, step_returns
from hgpo_train.advantage.rows import ProgressColumns, Rows, StepCredit
from hgpo_train.advantage.settings import INITIAL_WEIGHTS, INVALID, MILESTONES, MVPOSettings

BRANCHES = ("singleton", "anchor", "potential")
"""Where a row's routed credit comes from (E18), as :attr:`MVPOCredit.branch` codes 0, 1, 2."""


@dataclass(frozen=True)
class MVPOState:
    """What MVPO carries from one iteration to the next (no gradients): the milestone weights w_k,
    the success EMA s̄_k and its anchor s_0 (None before the first iteration)."""

    weights: tuple[float, ...] = INITIAL_WEIGHTS
    success_anchor: float | None = None
    success_ema: float | None = None

    @classmethod
    def start(cls, settings: MVPOSettings) -> MVPOState:
        """The state before the first iteration."""
        return cls(weights=tuple(settings.initial_weights))

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe, for checkpoints."""
        return {
            "weights": list(self.weights),
            "success_anchor": self.success_anchor,
            "success_ema": self.success_ema,
        }

    @classmethod
    def from_dict(cls, saved: dict[str, Any]) -> MVPOState:
        return cls(tuple(float(w) for w in saved["weights"]), saved["success_anchor"], saved["success_ema"])


@dataclass(frozen=True)
class MVPOCredit(StepCredit):
    """MVPO's credit, the state for the next iteration, and what it routed where."""

    state: MVPOState = field(default_factory=MVPOState)
    kappa: float = 1.0
    """κ_k of this iteration (E3)."""
    potential: np.ndarray | None = None
    """Ā^pot per row: the scaled potential difference (E17), whatever branch the row took."""
    branch: np.ndarray | None = None
    """Per row, an index into :data:`BRANCHES` (E18)."""

    def carried(self) -> dict[str, Any]:
        return self.state.to_dict()


def mvpo_advantages(
    rewards: Any,
    traj_ids: Any,
    group_ids: Any,
    fingerprints: Any,
    won: Any,
    signatures: Any,
    next_signatures: Any,
    milestones: Any,
    next_milestones: Any,
    invalid: Any = None,
    *,
    state: MVPOState | None = None,
    settings: MVPOSettings = MVPOSettings(),
    gamma: float = 0.95,
    invalid_penalty: float = 0.1,
) -> MVPOCredit:
    """MVPO's step advantages (E1-E19) from raw columns, rows of a rollout in chronological order.

    ``won``: the env's flag after each step (a rollout succeeded when its last row's is set);
    ``signatures``/``milestones``: the progress signature (ints or strings) and the five 0/1
    milestone flags (:data:`MILESTONES`) of the observation each row acted on;
    ``next_signatures``/``next_milestones``: those of the observation it produced. ``state``: the
    previous iteration's (:attr:`MVPOCredit.state`), None for the first. Level 0 of
    ``fingerprints`` is the anchor key, as GiGPO's; the mode is mean_std_norm (spec A25).
    """
    n = len(to_numpy(rewards))
    progress = ProgressColumns.from_columns(signatures, next_signatures, milestones, next_milestones, n)
    rows = Rows.from_columns(rewards, traj_ids, group_ids, fingerprints, invalid, won=won, progress=progress)
    return mvpo_credit(
        rows,
        state=state,
        settings=settings,
        gamma=real_setting(gamma, "gamma", 0.0, 1.0),
        invalid_penalty=real_setting(invalid_penalty, "invalid_penalty", 0.0),
    )


def credit(rows: Rows, config: AdvantageConfig, state: dict[str, Any] | None) -> MVPOCredit:
    """The registry's entry: ``config.mvpo``'s settings, GiGPO's discount and invalid penalty,
    and the state the last iteration carried (:meth:`MVPOCredit.carried`)."""
    if config.mode != "mean_std_norm":
        raise ValueError(
            f"mvpo normalises with mean_std_norm in every env (MVPO_SPEC A25), got advantage.mode="
            f"{config.mode}: set advantage.mode=mean_std_norm"
        )
    return mvpo_credit(
        rows,
        state=None if state is None else MVPOState.from_dict(state),
        settings=config.mvpo,
        gamma=config.gamma,
        invalid_penalty=config.invalid_penalty,
        episode_weight=config.episode_weight,
    )


def mvpo_credit(
    rows: Rows,
    *,
    state: MVPOState | None,
    settings: MVPOSettings,
    gamma: float,
    invalid_penalty: float,
    episode_weight: float = 1.0,
) -> MVPOCredit:
    """:func:`mvpo_advantages` of checked rows (with their progress columns). GiGPO's side
    (E4-E6, E18's spread) and the potential's (E7-E17) read none of each other's results: on a
    large batch the first runs on a thread meanwhile. ``episode_weight`` scales the episode term
    (1 in the paper, E19)."""
    if rows.progress is None:
        raise ValueError(
            "the mvpo estimator needs the env's milestones (info['progress_signature'] and "
            "info['milestones']): ALFWorld, WebShop and Rooms report them, a TextEnvSpec with progress= too"
        )
    state = state or MVPOState.start(settings)
    succeeded = _rollout_success(rows)
    kappa, anchor, ema = _kappa(float(succeeded.mean()) if len(succeeded) else 0.0, state, settings)  # E1-E3
    anchors = level0(rows.state_keys("mvpo"))
    with ThreadPoolExecutor(threads_for(len(rows), 2)) as pool:
        gigpo_side = pool.submit(_gigpo_terms, rows, anchors, gamma, invalid_penalty, settings.zero_spread)
        occurrences = _Occurrences.of(rows, rows.progress, settings.latch)
        weights = _milestone_weights(
            occurrences, succeeded, np.asarray(state.weights, float), settings
        )  # E10-E11
        potential = _scaled_potential(
            rows, occurrences, succeeded, weights, gamma, settings
        )  # E7-E9, E12-E17
        returns, episode, anchored, branch = gigpo_side.result()
    route = np.where(branch == 1, anchored, np.where(branch == 2, kappa * potential, 0.0))  # E18
    advantages = episode_weight * episode + settings.omega * route  # E19, as GiGPO blends its two terms
    new_state = replace(state, weights=tuple(weights.tolist()), success_anchor=anchor, success_ema=ema)
    return MVPOCredit(advantages, returns, None, new_state, kappa, potential, branch)


def _gigpo_terms(
    rows: Rows, anchors: np.ndarray, gamma: float, invalid_penalty: float, zero_spread: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The step returns (E4), GiGPO's episode and anchor terms (E5, E6) and each row's branch."""
    returns = step_returns(rows.reward, rows.rollouts, gamma, rows.invalid, invalid_penalty)
    scores = episode_scores(rows.reward, rows.rollouts, rows.invalid, invalid_penalty)
    episode = episode_advantages(scores, rows.groups, "mean_std_norm")
    anchored = _step_term(returns, rows.groups, anchors, "mean_std_norm")
    return returns, episode, anchored, _branches(rows.groups, anchors, returns, zero_spread)


def _rollout_success(rows: Rows) -> np.ndarray:
    """won_i per rollout, as a float (E1, E10)."""
    if rows.won is None:
        raise ValueError("the mvpo estimator needs the env's won flag per step (won, info['won'])")
    return rollout_success(rows.won, rows.rollouts).astype(np.float64)


def _kappa(success: float, state: MVPOState, settings: MVPOSettings) -> tuple[float, float, float]:
    """κ_k, s_0 and s̄_k (E2-E3; s_0 is the first iteration's success rate, choice A19)."""
    if state.success_ema is None or state.success_anchor is None:
        anchor = ema = success
    else:
        anchor = state.success_anchor
        ema = (1 - settings.success_rate) * state.success_ema + settings.success_rate * success
    gain = min(max((ema - anchor) / (1 - anchor + EPS), 0.0), 1.0)
    return min(max(1 - gain, settings.kappa_min), 1.0), anchor, ema


@dataclass(frozen=True)
class _Occurrences:
    """Every observation of the batch once (choice A11): row t's own, and each rollout's final one.
    Arrays are sorted by (rollout, position)."""

    rollout: np.ndarray
    starts: np.ndarray
    """Whether each occurrence is its rollout's first."""
    reached: np.ndarray
    """h: (occurrences, 5) booleans, the milestones reached, 1-4 latched (E7)."""
    looped: np.ndarray
    """ℓ: the signature occurred earlier in the rollout (E8)."""
    region: np.ndarray
    """Dense region codes (E9): signatures of a group, merged by the cycle rule."""
    row_index: np.ndarray
    """Per row, its own occurrence; :attr:`next_index`, the one it produced."""
    next_index: np.ndarray

    @classmethod
    def of(cls, rows: Rows, progress: ProgressColumns, latch: bool) -> _Occurrences:
        signatures, next_signatures = progress.signatures, progress.next_signatures
        triggers, next_triggers = progress.milestones, progress.next_milestones
        rollout = rows.rollouts
        by_rollout = np.argsort(rollout, kind="stable")  # each rollout's rows, in order
        sizes = np.bincount(rollout)
        own = np.empty(len(rows), np.int64)  # each row's place among the occurrences: its
        own[by_rollout] = np.arange(len(rows)) + rollout[by_rollout]  # rollout's finals before it
        ends = np.cumsum(sizes) + np.arange(len(sizes))  # each rollout's final occurrence
        last = by_rollout[np.cumsum(sizes) - 1]  # each rollout's last row
        total = len(rows) + len(sizes)
        occurrence_rollout = np.empty(total, np.int64)
        occurrence_rollout[own], occurrence_rollout[ends] = rollout, np.arange(len(sizes))
        group = np.empty(total, np.int64)
        group[own], group[ends] = rows.groups, rows.groups[last]
        signature = np.empty(total, np.result_type(signatures, next_signatures))
        signature[own], signature[ends] = signatures, next_signatures[last]
        seen = np.empty((total, len(MILESTONES)), np.int32)
        seen[own], seen[ends] = triggers, next_triggers[last]
        starts = np.r_[True, occurrence_rollout[1:] != occurrence_rollout[:-1]]
        reached = _latched(seen, starts) if latch else seen.astype(bool)
        reached[:, INVALID] = seen[:, INVALID]
        codes = id_codes(signature, "signatures").astype(np.uint64)
        node = pair_codes(group, codes)  # a group's own signatures: regions never span groups
        looped, earlier = _repeats(occurrence_rollout, node)
        region = _regions(node, earlier)
        return cls(occurrence_rollout, starts, reached, looped, region, own, own + 1)


def _latched(seen: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Per rollout (segments beginning at ``starts``), whether each milestone was seen so far."""
    total = np.cumsum(seen, axis=0, dtype=np.int32)
    before = (total - seen)[starts]  # the running totals where each rollout begins
    return total > before[np.cumsum(starts) - 1]


def _repeats(rollout: np.ndarray, node: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ℓ per occurrence (its signature occurred earlier in its rollout), and the index of that
    earlier occurrence (the latest one), -1 where none. Occurrences are in (rollout, step) order,
    which a stable sort by (rollout, node) keeps within each pair."""
    pair = rollout * (int(node.max(initial=0)) + 1) + node
    order = np.argsort(pair, kind="stable")
    same = pair[order][1:] == pair[order][:-1]
    earlier = np.full(len(node), -1, np.int64)
    earlier[order[1:][same]] = order[:-1][same]
    return (earlier >= 0).astype(np.float64), earlier


def _regions(node: np.ndarray, earlier: np.ndarray) -> np.ndarray:
    """Dense region codes (E9): equal signatures share a node, and the cycle rule joins every node
    a rollout visits between a signature and its return to it. Each repeat's interval is marked
    on the steps between consecutive occurrences, and the marked steps' nodes are joined by
    connected components (Union-Find's result, independent of the order of the unions)."""
    repeat = np.flatnonzero(earlier >= 0)
    cover = np.zeros(len(node) + 1, np.int64)
    np.add.at(cover, earlier[repeat], 1)
    np.add.at(cover, repeat, -1)
    joined = np.flatnonzero(np.cumsum(cover)[:-1] > 0)  # the step from occurrence s to s + 1
    size = int(node.max(initial=-1)) + 1
    edges = coo_matrix((np.ones(len(joined)), (node[joined], node[joined + 1])), shape=(size, size))
    _, labels = connected_components(edges, directed=False)
    return id_codes(labels[node], "regions")


def _milestone_weights(
    occurrences: _Occurrences, succeeded: np.ndarray, previous: np.ndarray, settings: MVPOSettings
) -> np.ndarray:
    """w_k (E10-E11): each milestone's utility, how much more often the rollouts of observations
    that reached it succeeded than those that had not, over every observation of the batch."""
    success = succeeded[occurrences.rollout]
    reached = occurrences.reached
    utility = np.zeros(len(MILESTONES))
    for m in range(len(MILESTONES)):
        hit = reached[:, m]
        if hit.any() and not hit.all():
            utility[m] = max(0.0, success[hit].mean() - success[~hit].mean())
    return (1 - settings.weight_rate) * previous + settings.weight_rate * utility / (utility.sum() + EPS)


def _scaled_potential(
    rows: Rows,
    occurrences: _Occurrences,
    succeeded: np.ndarray,
    weights: np.ndarray,
    gamma: float,
    settings: MVPOSettings,
) -> np.ndarray:
    """Ā^pot per row (E12-E17)."""
    region = occurrences.region
    count = np.bincount(region).astype(np.float64)
    loop_rate = np.bincount(region, weights=occurrences.looped) / (count + EPS)
    if settings.potential == "eq15":
        share = np.stack([np.bincount(region, weights=column) for column in occurrences.reached.T], axis=1)
        pairs = np.sort(region * len(succeeded) + occurrences.rollout)  # R(c): distinct rollouts
        pairs = pairs[np.r_[True, pairs[1:] != pairs[:-1]]]
        members = pairs // len(succeeded)
        rollouts_in = np.bincount(members, minlength=len(count)).astype(np.float64)
        wins = np.bincount(members, weights=succeeded[pairs % len(succeeded)], minlength=len(count))
        value = (share / (count + EPS)[:, None]) @ weights
        value += (
            settings.success_weight * wins / (rollouts_in + EPS) - settings.loop_weight * loop_rate
        )  # E13
    else:
        value = _appendix_value(occurrences, weights, count, loop_rate, settings.appendix_mix)
    seen = value[region]
    normalised = (value - seen.mean()) / (seen.std() + EPS)  # E14
    smoothing = count / (count + settings.count_smoothing)
    smoothed = smoothing * normalised + (1 - smoothing) * normalised[region].mean()  # E15
    difference = (
        gamma * smoothed[region[occurrences.next_index]] - smoothed[region[occurrences.row_index]]
    )  # E16
    if settings.potential_norm == "zscore":
        scaled = normalise(difference, rows.groups, "mean_std_norm", ddof=1)
    else:
        size = np.bincount(rows.groups).astype(np.float64)
        rms = np.sqrt(np.bincount(rows.groups, weights=difference * difference) / size)
        scaled = difference / (rms + EPS)[rows.groups]  # E17: the sign kept
    scaled[(np.bincount(rows.groups) == 1)[rows.groups]] = 0.0
    return scaled


def _appendix_value(
    occurrences: _Occurrences, weights: np.ndarray, count: np.ndarray, loop_rate: np.ndarray, mix: float
) -> np.ndarray:
    """The appendix's potential (choice A1): the mean over the region of milestone progress to go
    (its best from each visit on), plus δ times the share of visits after which progress improves,
    minus δ times the loop rate."""
    progress = occurrences.reached @ weights / (weights.sum() + EPS)  # in [0, 1)
    from_here = _rollout_suffix_max(progress, occurrences.starts)
    ends = np.r_[occurrences.starts[1:], True]
    later = np.where(ends, -np.inf, np.r_[from_here[1:], -np.inf])  # the best strictly after each visit
    region = occurrences.region
    improves = (later > progress).astype(np.float64)
    return (np.bincount(region, weights=from_here) + mix * np.bincount(region, weights=improves)) / count - (
        mix * loop_rate
    )


def _rollout_suffix_max(values: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Per position, the maximum of its rollout's values from it on (rollouts are contiguous runs
    beginning at ``starts``); the loop runs over step positions, never over rows."""
    first = np.flatnonzero(starts)
    length = np.diff(np.r_[first, len(values)])
    out = values.copy()
    for position in range(int(length.max(initial=0)) - 2, -1, -1):
        at = first[length > position + 1] + position
        out[at] = np.maximum(out[at], out[at + 1])
    return out


def _branches(groups: np.ndarray, anchors: np.ndarray, returns: np.ndarray, zero_spread: float) -> np.ndarray:
    """E18's branch of each row: singleton (a group of one row or no key), anchor (its anchor
    group's returns spread over ε_r) or potential."""
    anchor = pair_codes(groups, anchors)
    size = np.bincount(anchor)
    spread = np.sqrt(
        np.bincount(anchor, weights=(returns - (np.bincount(anchor, weights=returns) / size)[anchor]) ** 2)
        / np.maximum(size - 1, 1)
    )
    grouped = (size[anchor] > 1) & (anchors != 0)
    return np.where(grouped, np.where(spread[anchor] > zero_spread, 1, 2), 0)
