"""HGPO: each step's return normalised at K+1 context levels, the non-zero items blended with
weights that grow with the context they share (shared/HGPO_SPEC.md)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from hgpo_train.advantage.columns import (
    Mode,
    as_fingerprints,
    check_mode,
    float_column,
    id_codes,
    real_setting,
)
from hgpo_train.advantage.config import AdvantageConfig
from hgpo_train.advantage.grouping import EPS, PairSorter, normalise_clusters, threads_for
from hgpo_train.advantage.grpo import episode_advantages
from hgpo_train.advantage.returns import credited_returns, episode_scores
from hgpo_train.advantage.rows import Rows, StepCredit

ZERO_TOL = 1e-6
"""An HGPO item with ``|a| <= ZERO_TOL`` counts as zero and is dropped (spec, HGPO step 4)."""


def _level_items(
    x: np.ndarray, groups: np.ndarray, fp: np.ndarray, mode: str
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """HGPO items level by level, k = 0..K, as (rows, values): the rows in level-k clusters of
    >= 2 rows and their returns normalised there (population std). Other items are 0."""
    sorter = PairSorter(groups)
    for keys in fp.T:
        yield normalise_clusters(x, sorter, np.ascontiguousarray(keys), mode, ddof=0)


def _weighted_level_sums(
    x: np.ndarray, groups: np.ndarray, fp: np.ndarray, mode: str, weights: list[float]
) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the sum over levels of ``weights[k] * item`` and of ``weights[k]``, kept items only.

    Levels are independent and numpy's sorts, reductions and scatters release the GIL, so a
    large batch computes each level's dense contribution on a thread (one per core); the sums
    still add the levels in order, so the result does not depend on the threads.
    """
    sorter = PairSorter(groups)
    n = len(x)

    def level(k: int) -> tuple[np.ndarray, np.ndarray]:
        rows, values = normalise_clusters(x, sorter, np.ascontiguousarray(fp[:, k]), mode, ddof=0)
        kept = np.abs(values) > ZERO_TOL
        num, den = np.zeros(n), np.zeros(n)
        num[rows[kept]] = weights[k] * values[kept]
        den[rows[kept]] = weights[k]
        return num, den

    num, den = np.zeros(n), np.zeros(n)
    with ThreadPoolExecutor(threads_for(n, fp.shape[1])) as pool:
        for level_num, level_den in pool.map(level, range(fp.shape[1])):
            num += level_num
            den += level_den
    return num, den


def hgpo_level_items(
    returns: Any, clusters: np.ndarray, mode: Mode = "mean_std_norm"
) -> tuple[np.ndarray, np.ndarray]:
    """HGPO items before weighting: (advantage, kept), both of shape (n, K+1).

    ``advantage[i, k]`` is row i's return normalised in its level-k cluster (population std), 0
    where the level is missing; ``kept`` marks items that exist (cluster of >= 2 rows) and are
    non-zero (``|a| > ZERO_TOL``). ``clusters`` is the output of :func:`level_clusters`.
    """
    check_mode(mode)
    clusters = np.asarray(clusters)
    if clusters.ndim != 2:
        raise ValueError(f"clusters must have shape (n, K+1), got {clusters.shape}")
    keys = (clusters + 1).astype(np.uint64)  # cluster codes as keys, missing (-1) as 0
    x = float_column(returns, "returns", len(clusters))
    items = np.zeros(clusters.shape)
    for k, (rows, values) in enumerate(_level_items(x, np.zeros(len(x), np.int64), keys, mode)):
        items[rows, k] = values
    return items, np.abs(items) > ZERO_TOL


def hgpo_advantages(
    returns: Any,
    group_ids: Any,
    fingerprints: Any,
    mode: Mode = "mean_std_norm",
    alpha: float = 1.0,
    base_group: bool = False,
    scores: Any = None,
    weight_offset: float = 2,
) -> np.ndarray:
    """HGPO: weighted mean of the non-zero per-level items of each row.

    Level k's item has length ``L = k + weight_offset`` and the base item (``base_group=True``,
    the GRPO value of ``scores``) has ``L = 1``; weights are ``L**alpha / (sum + 1e-6)`` over the
    row's kept items. A row without a kept item gets 0.
    """
    check_mode(mode)
    a = real_setting(alpha, "alpha")
    offset = real_setting(weight_offset, "weight_offset", 0.0)
    if offset <= 0:
        raise ValueError(f"weight_offset must be > 0, got {weight_offset!r}")
    ret = float_column(returns, "returns")
    groups = id_codes(group_ids, "group_ids", len(ret))
    fp = as_fingerprints(fingerprints, len(ret))
    if base_group and scores is None:
        raise ValueError("base_group=True needs the episode scores")

    weights = [(k + offset) ** a for k in range(fp.shape[1])]
    num, den = _weighted_level_sums(ret, groups, fp, mode, weights)
    if base_group:  # the base item, length 1, after the levels
        base = episode_advantages(float_column(scores, "scores", len(ret)), groups, mode)
        kept = np.abs(base) > ZERO_TOL
        num[kept] += base[kept]
        den[kept] += 1.0
    return num / (den + EPS)


def credit(rows: Rows, config: AdvantageConfig) -> StepCredit:
    """HGPO's advantages, crediting each step with ``config.returns``."""
    returns, _ = credited_returns(rows, config)
    scores = episode_scores(rows.reward, rows.rollouts, rows.invalid, config.invalid_penalty)
    advantages = hgpo_advantages(
        returns,
        rows.groups,
        rows.fingerprints,
        config.mode,
        config.alpha,
        config.base_group,
        scores,
        config.weight_offset,
    )
    return StepCredit(advantages, returns)
