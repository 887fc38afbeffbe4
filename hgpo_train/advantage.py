"""GRPO, GiGPO, HGPO, GraphGPO and G2PO step advantages over columnar arrays (shared/HGPO_SPEC.md).

One row is one step sample. Inputs are numpy arrays (torch tensors and lists are converted),
outputs are float64 numpy arrays in row order. Ids (group, rollout) may be ints or strings.

Everything is vectorised: ids are factorised into dense integer codes once, the rows are sorted
by (group, fingerprint) once per level so that every cluster is a contiguous run, rows alone in
their cluster are skipped (their item is 0), and per-group / per-cluster statistics are
``np.bincount`` reductions. The only Python loops run over the K+1 context levels and, for
discounted returns, over step positions (at most the episode step limit), never over rows or
clusters. GraphGPO's distances to success are one breadth-first search over the state graphs
of all groups at once, a Python loop over distance levels only.

Row order: the rows of one rollout must appear in chronological order, but rollouts need not
be contiguous; rows are grouped with a stable sort, so interleaved rollouts give the same
result as contiguous ones.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

Mode = Literal["mean_norm", "mean_std_norm"]
Estimator = Literal["grpo", "gigpo", "hgpo", "graphgpo", "g2po"]
StepReturn = Literal["discounted", "graph"]
MODES: tuple[str, ...] = ("mean_norm", "mean_std_norm")
ESTIMATORS: tuple[str, ...] = ("grpo", "gigpo", "hgpo", "graphgpo", "g2po")
STEP_RETURNS: tuple[str, ...] = ("discounted", "graph")
GRAPH_RETURN_SCALE = 10.0
"""GraphGPO's step return at distance 0 (the recipe's constant: ALFWorld's win reward)."""
G2PO_SUCCESS_REWARD = 10.0
"""The episode reward G2PO's code counts as success, and the value of its success terminal."""

EPS = 1e-6
"""Added to the std and to the weight sum, as in the released code."""
ZERO_TOL = 1e-6
"""An HGPO item with ``|a| <= ZERO_TOL`` counts as zero and is dropped (spec, HGPO step 4)."""
PARALLEL_ROWS = 100_000
"""From this many rows, HGPO's levels run on threads (below, starting them costs more)."""

# Odd 64-bit constant (2**64 / golden ratio): multiplying by it carries a key's low bits upwards.
_SPREAD = np.uint64(0x9E3779B97F4A7C15)

# ----------------------------------------------------------------------------- input checks


def _to_numpy(x: Any) -> np.ndarray:
    """numpy array of ``x``; a torch tensor is converted without this module importing torch."""
    torch = sys.modules.get("torch")  # if torch was never imported, x cannot be a tensor
    if torch is not None and isinstance(x, torch.Tensor):
        t = x.detach().cpu()
        return (t.double() if t.is_floating_point() else t).numpy()
    return np.asarray(x)


def _check_rows(a: np.ndarray, name: str, n: int | None) -> None:
    if n is not None and len(a) != n:
        raise ValueError(f"{name} has {len(a)} rows, expected {n}")


def _values(x: Any, name: str, n: int | None = None) -> np.ndarray:
    """1-D finite float64 column."""
    a = _to_numpy(x)
    if a.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {a.shape}")
    if a.dtype.kind not in "biuf":
        raise ValueError(f"{name} must be numeric, got dtype {a.dtype}")
    a = a.astype(np.float64, copy=False)
    if not np.isfinite(a).all():
        raise ValueError(f"{name} contains NaN or inf")
    _check_rows(a, name, n)
    return a


def _codes(ids: Any, name: str, n: int | None = None) -> np.ndarray:
    """Dense int64 codes 0..m-1 of 1-D ids (ints or strings): equal ids get equal codes."""
    a = _to_numpy(ids)
    if a.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {a.shape}")
    if a.dtype.kind not in "iuUSO" and a.size:  # an empty list comes as float64
        raise ValueError(f"{name} must hold integers or strings, got dtype {a.dtype}")
    _check_rows(a, name, n)
    if a.dtype.kind in "iu" and a.size and 0 <= a.min() and a.max() <= 4 * a.size:
        a = a.astype(np.int64, copy=False)  # small non-negative ints: dense codes in O(n), no sort
        return (np.cumsum(np.bincount(a) > 0) - 1)[a]
    try:
        return np.unique(a, return_inverse=True)[1].astype(np.int64, copy=False)
    except TypeError as err:  # object array of mutually unorderable values
        raise ValueError(f"{name} mixes id types that cannot be compared: {err}") from err


def _real(value: Any, name: str, low: float = -math.inf, high: float = math.inf) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{name} must be a real number, got {value!r}") from err
    if not (math.isfinite(v) and low <= v <= high):
        raise ValueError(f"{name} must be finite and in [{low}, {high}], got {value!r}")
    return v


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; expected one of {MODES}")


def as_fingerprints(fingerprints: Any, n: int | None = None) -> np.ndarray:
    """Fingerprints as a uint64 array of shape (n, K+1); 0 means the level is missing.

    Accepts a 2-D array or tensor, a list of per-row tuples (``info["fingerprints"]``), or a 1-D
    column (level 0 only). Signed 64-bit integers are reinterpreted bit for bit, because torch
    and some storage formats keep 64-bit hashes as int64.
    """
    if isinstance(fingerprints, (list, tuple)):
        try:
            a = np.array(fingerprints, dtype=np.uint64)
        except (OverflowError, TypeError, ValueError) as err:
            raise ValueError(f"fingerprints must be rows of equally many ints in [0, 2**64): {err}") from err
    else:
        a = _to_numpy(fingerprints)
        if a.dtype.kind == "i":
            a = a.astype(np.int64, copy=False).view(np.uint64)
        elif a.dtype.kind == "u":
            a = a.astype(np.uint64, copy=False)
        else:
            raise ValueError(f"fingerprints must be integers, got dtype {a.dtype}")
    if a.ndim == 1:
        a = a.reshape(-1, 1)
    if a.ndim != 2 or a.shape[1] == 0:
        raise ValueError(f"fingerprints must have shape (n, K+1) with K >= 0, got {a.shape}")
    _check_rows(a, "fingerprints", n)
    return a


def _penalties(invalid: Any, invalid_penalty: float, n: int) -> np.ndarray:
    """Per-row invalid-action penalty ``invalid_penalty * invalid`` (zeros when invalid is None)."""
    coef = _real(invalid_penalty, "invalid_penalty", 0.0)
    if invalid is None:
        return np.zeros(n)
    flags = _values(invalid, "invalid", n)
    if not np.isin(flags, (0.0, 1.0)).all():
        raise ValueError("invalid must hold only 0/1 (or booleans)")
    return coef * flags


# ------------------------------------------------------------------- returns and scores


def step_returns(
    rewards: Any,
    traj_ids: Any,
    gamma: float = 0.95,
    invalid: Any = None,
    invalid_penalty: float = 0.1,
) -> np.ndarray:
    """Discounted return of every step, ``R_t = r_t + gamma * R_{t+1}``, minus the step's own
    invalid penalty (the penalty is not discounted into earlier steps). A rollout ends at its
    last row (no bootstrap). ``traj_ids`` must identify rollouts uniquely across the batch.
    """
    r = _values(rewards, "rewards")
    rollout = _codes(traj_ids, "traj_ids", len(r))
    g = _real(gamma, "gamma", 0.0, 1.0)
    penalty = _penalties(invalid, invalid_penalty, len(r))

    order = np.argsort(rollout, kind="stable")  # rollouts contiguous, each in row order
    lengths = np.bincount(rollout)
    starts = np.cumsum(lengths) - lengths
    by_length = np.argsort(-lengths, kind="stable")  # longest first: active rollouts = a prefix
    starts, neg_lengths = starts[by_length], -lengths[by_length]

    r_sorted = r[order]
    ret = r_sorted.copy()  # the last step of each rollout: R = r
    for pos in range(int(lengths.max(initial=0)) - 2, -1, -1):
        active = np.searchsorted(neg_lengths, -(pos + 1), side="left")  # length > pos + 1
        rows = starts[:active] + pos
        ret[rows] = r_sorted[rows] + g * ret[rows + 1]
    out = np.empty_like(ret)
    out[order] = ret
    return out - penalty


def episode_scores(
    rewards: Any, traj_ids: Any, invalid: Any = None, invalid_penalty: float = 0.1
) -> np.ndarray:
    """Per-row episode score: the rollout's total reward minus this row's invalid penalty."""
    r = _values(rewards, "rewards")
    rollout = _codes(traj_ids, "traj_ids", len(r))
    penalty = _penalties(invalid, invalid_penalty, len(r))
    return np.bincount(rollout, weights=r)[rollout] - penalty


def _last_rows(rollout: np.ndarray) -> np.ndarray:
    """Whether each row is the last (chronologically) of its rollout."""
    order = np.argsort(rollout, kind="stable")
    last = np.ones(len(rollout), dtype=bool)
    last[order[:-1]] = rollout[order[1:]] != rollout[order[:-1]]
    return last


def graph_distances(
    group_ids: Any, states: Any, next_states: Any, success: Any
) -> tuple[np.ndarray, np.ndarray]:
    """Each row's state's and next state's distance to success in its group's state graph.

    Every row is a unit edge from its state to its next state, or to the group's success node
    where ``success`` is set (GraphGPO: the last step of a won episode, whose own terminal
    state is then not a node). Distances come from one breadth-first search backwards from all
    success nodes; a node that cannot reach success gets its group's largest finite distance
    + 1, the success node's 0 included, so a group without success puts every node at 1.
    """
    state = as_fingerprints(states)[:, 0]
    n = len(state)
    after = as_fingerprints(next_states, n)[:, 0]
    done = _values(success, "success", n) != 0
    groups = _codes(group_ids, "group_ids", n)
    nodes = pair_codes(np.concatenate([groups, groups]), np.concatenate([state, after]))
    first_success = int(nodes.max(initial=-1)) + 1  # success nodes follow, one per group
    size = first_success + int(groups.max(initial=-1)) + 1
    source = nodes[:n]
    target = np.where(done, first_success + groups, nodes[n:])
    node_group = np.empty(size, dtype=np.int64)
    node_group[nodes] = np.concatenate([groups, groups])
    node_group[first_success:] = np.arange(size - first_success)

    sources = source[np.argsort(target, kind="stable")]  # edges into each node, as a CSR table
    into = np.bincount(target, minlength=size)
    first_edge = np.cumsum(into) - into
    distance = np.full(size, -1, dtype=np.int64)
    frontier = np.arange(first_success, size)
    distance[frontier] = 0
    level = 0
    while frontier.size:  # one pass per distance: the edges into the frontier, in one gather
        counts = into[frontier]
        within = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
        reached = sources[np.repeat(first_edge[frontier], counts) + within]
        frontier = np.unique(reached[distance[reached] < 0])
        level += 1
        distance[frontier] = level
    far = np.zeros(size - first_success, dtype=np.int64)
    np.maximum.at(far, node_group, distance)
    distance = np.where(distance < 0, far[node_group] + 1, distance)
    return distance[source], distance[target]


def graph_returns(
    rewards: Any,
    traj_ids: Any,
    group_ids: Any,
    states: Any,
    next_states: Any,
    gamma: float = 0.1,
    invalid: Any = None,
    invalid_penalty: float = 0.1,
    normalize_distance: bool = False,
) -> np.ndarray:
    """GraphGPO's step return: ``10 * gamma ** d(next state)`` in the task group's state graph
    (``normalize_distance``: ``10 * gamma ** (d(next) - d(state) + 1)``), minus the step's
    invalid penalty. The env's step rewards only decide which episodes were won (total > 0);
    see :func:`graph_distances`. ``traj_ids`` must identify rollouts uniquely across the batch.
    """
    r = _values(rewards, "rewards")
    rollout = _codes(traj_ids, "traj_ids", len(r))
    g = _real(gamma, "gamma", 0.0, 1.0)
    if normalize_distance and g == 0:
        raise ValueError("normalize_distance needs gamma > 0 (a step away from success has exponent < 0)")
    penalty = _penalties(invalid, invalid_penalty, len(r))
    won = (np.bincount(rollout, weights=r) > 0)[rollout]
    d_state, d_next = graph_distances(group_ids, states, next_states, won & _last_rows(rollout))
    exponent = d_next - d_state + 1 if normalize_distance else d_next
    return GRAPH_RETURN_SCALE * g ** exponent.astype(np.float64) - penalty


# ------------------------------------------------------------------------------ clustering


class _PairSorter:
    """Sorts the rows of one batch by (group, key) pairs, for one key column after another.

    It works on the rows in group order (``perm``; none when the group codes are already
    sorted, as in a batch built group by group). There ``sort(keys)`` returns an order that
    makes equal pairs contiguous runs, each run in row order. It is one value sort of a packed
    64-bit word, ``group | top bits of key * _SPREAD | the row's offset in its group``, 4x
    faster than an argsort; the order never leaves a group, so gathering through it stays in
    cache. If two different keys of a group share their top bits, or the codes leave too few
    bits for the key, an exact two-key sort is used instead.
    """

    MIN_KEY_BITS = 24

    def __init__(self, groups: np.ndarray) -> None:
        """``groups``: dense non-negative int64 codes, one per row."""
        n = len(groups)
        self.perm = None
        if n and (groups[1:] < groups[:-1]).any():  # radix sort for codes of <= 16 bits
            self.perm = np.argsort(groups.astype(np.min_scalar_type(groups.max())), kind="stable")
        self.groups = groups if self.perm is None else groups[self.perm]
        sizes = np.bincount(self.groups)
        group_bits = (len(sizes) - 1).bit_length()
        offset_bits = int(sizes.max(initial=1) - 1).bit_length()
        key_bits = 64 - group_bits - offset_bits
        self.base = None
        if n and key_bits >= self.MIN_KEY_BITS:
            self.group_bits, self.offset_bits = np.uint64(group_bits), np.uint64(offset_bits)
            self.offset_mask = (np.uint64(1) << self.offset_bits) - np.uint64(1)
            self.group_start = (np.cumsum(sizes) - sizes)[self.groups]
            offset = (np.arange(n) - self.group_start).astype(np.uint64)
            top = self.groups.astype(np.uint64) << np.uint64(key_bits + offset_bits) if group_bits else 0
            self.base = offset | top  # the parts of the word that do not depend on the keys

    def clusters(
        self, keys: np.ndarray, singletons: bool = True, zero_is_missing: bool = True
    ) -> tuple[np.ndarray, np.ndarray]:
        """The rows in clusters of equal (group, key), cluster by cluster, each in row order, and
        their dense cluster codes. ``keys`` and the row indices are in row order. Rows with key 0
        (unless ``zero_is_missing`` is False) and, if ``singletons`` is False, rows alone in
        their cluster are left out."""
        order, sorted_keys, same = self.sort(keys if self.perm is None else keys[self.perm])
        keep = sorted_keys != 0 if zero_is_missing else np.ones(len(keys), dtype=bool)
        if not singletons:
            shared = np.zeros(len(keys), dtype=bool)
            shared[1:] = same  # continues the previous row's cluster
            shared[:-1] |= same  # or is continued by the next row
            keep &= shared
        starts = np.empty(len(keys), dtype=bool)  # whether a sorted row starts a new cluster
        starts[:1] = True
        np.logical_not(same, out=starts[1:])
        rows = order[keep]
        return rows if self.perm is None else self.perm[rows], np.cumsum(starts[keep]) - 1

    def sort(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For ``keys`` in group order: (order, keys[order], whether each sorted row after the
        first continues the previous row's pair)."""
        if self.base is not None:
            packed = keys * _SPREAD
            packed >>= self.group_bits
            packed &= ~self.offset_mask
            packed |= self.base
            packed.sort()
            order = (packed & self.offset_mask).view(np.intp)
            order += self.group_start  # sorting keeps every group in its own block of rows
            sorted_keys = keys[order]
            packed >>= self.offset_bits
            same = packed[1:] == packed[:-1]
            if not (same & (sorted_keys[1:] != sorted_keys[:-1])).any():
                return order, sorted_keys, same
        order = np.lexsort((keys, self.groups))
        sorted_keys, sorted_groups = keys[order], self.groups[order]
        same = (sorted_keys[1:] == sorted_keys[:-1]) & (sorted_groups[1:] == sorted_groups[:-1])
        return order, sorted_keys, same


def pair_codes(groups: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Dense int64 codes of the (integer group, uint64 key) pairs: equal pairs, equal codes."""
    rows, codes = _PairSorter(_codes(groups, "groups", len(keys))).clusters(keys, zero_is_missing=False)
    out = np.empty(len(keys), np.int64)
    out[rows] = codes
    return out


def _clusters(groups: np.ndarray, fp: np.ndarray) -> np.ndarray:
    """Level-major (K+1, n) cluster codes, -1 where the level is missing."""
    sorter = _PairSorter(groups)
    out = np.full(fp.shape[::-1], -1, dtype=np.int64)
    for k, keys in enumerate(np.ascontiguousarray(fp.T)):
        rows, codes = sorter.clusters(keys)
        out[k, rows] = codes
    return out


def level_clusters(group_ids: Any, fingerprints: Any) -> np.ndarray:
    """Cluster code of every row at every level, shape (n, K+1), -1 where the level is missing.

    Rows share a level-k code exactly when they have the same group id and the same non-zero
    level-k fingerprint. Codes of each level are dense (0..C_k-1).
    """
    fp = as_fingerprints(fingerprints)
    return _clusters(_codes(group_ids, "group_ids", len(fp)), fp).T


def _normalise(x: np.ndarray, codes: np.ndarray, mode: str, ddof: int) -> np.ndarray:
    """``x`` normalised within the clusters given by dense ``codes``.

    A singleton gives exactly 0 (its mean is itself); callers that want otherwise override it.
    """
    count = np.bincount(codes)
    dev = x - (np.bincount(codes, weights=x) / count)[codes]
    if mode == "mean_std_norm":
        var = np.bincount(codes, weights=dev * dev) / np.maximum(count - ddof, 1)
        dev /= (np.sqrt(var) + EPS)[codes]
    return dev


def _normalise_clusters(
    x: np.ndarray, sorter: _PairSorter, keys: np.ndarray, mode: str, ddof: int
) -> tuple[np.ndarray, np.ndarray]:
    """``x`` normalised within its (group, key) cluster, as (rows, values) for the rows in
    clusters of >= 2 rows with a non-zero key; every other row's value is exactly 0.

    Skipping the singletons skips most rows at high levels. The statistics run over the rows
    sorted by cluster, so every reduction reads memory in sequence; each cluster keeps its rows
    in row order, so sums match a row-order loop bit for bit.
    """
    rows, codes = sorter.clusters(keys, singletons=False)
    return rows, _normalise(x[rows], codes, mode, ddof)


def _level_items(
    x: np.ndarray, groups: np.ndarray, fp: np.ndarray, mode: str
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """HGPO items level by level, k = 0..K, as (rows, values): the rows in level-k clusters of
    >= 2 rows and their returns normalised there (population std). Other items are 0."""
    sorter = _PairSorter(groups)
    for keys in fp.T:
        yield _normalise_clusters(x, sorter, np.ascontiguousarray(keys), mode, ddof=0)


def _weighted_level_sums(
    x: np.ndarray, groups: np.ndarray, fp: np.ndarray, mode: str, weights: list[float]
) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the sum over levels of ``weights[k] * item`` and of ``weights[k]``, kept items only.

    Levels are independent and numpy's sorts, reductions and scatters release the GIL, so a
    large batch computes each level's dense contribution on a thread (one per core); the sums
    still add the levels in order, so the result does not depend on the threads.
    """
    sorter = _PairSorter(groups)
    n = len(x)

    def level(k: int) -> tuple[np.ndarray, np.ndarray]:
        rows, values = _normalise_clusters(x, sorter, np.ascontiguousarray(fp[:, k]), mode, ddof=0)
        kept = np.abs(values) > ZERO_TOL
        num, den = np.zeros(n), np.zeros(n)
        num[rows[kept]] = weights[k] * values[kept]
        den[rows[kept]] = weights[k]
        return num, den

    workers = min(fp.shape[1], os.cpu_count() or 1)
    num, den = np.zeros(n), np.zeros(n)
    with ThreadPoolExecutor(workers if n >= PARALLEL_ROWS else 1) as pool:
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
    _check_mode(mode)
    clusters = np.asarray(clusters)
    if clusters.ndim != 2:
        raise ValueError(f"clusters must have shape (n, K+1), got {clusters.shape}")
    keys = (clusters + 1).astype(np.uint64)  # cluster codes as keys, missing (-1) as 0
    x = _values(returns, "returns", len(clusters))
    items = np.zeros(clusters.shape)
    for k, (rows, values) in enumerate(_level_items(x, np.zeros(len(x), np.int64), keys, mode)):
        items[rows, k] = values
    return items, np.abs(items) > ZERO_TOL


# ------------------------------------------------------------------------------ estimators


def _grpo(scores: np.ndarray, groups: np.ndarray, mode: str) -> np.ndarray:
    a = _normalise(scores, groups, mode, ddof=1)
    single = (np.bincount(groups) == 1)[groups]  # released code: mean 0, std 1
    a[single] = scores[single] / (1.0 + EPS) if mode == "mean_std_norm" else scores[single]
    return a


def grpo_advantages(scores: Any, group_ids: Any, mode: Mode = "mean_std_norm") -> np.ndarray:
    """Episode score normalised among all rows of its task group (unbiased std).

    A group with a single row uses mean 0 and std 1, as in the released code.
    """
    _check_mode(mode)
    x = _values(scores, "scores")
    return _grpo(x, _codes(group_ids, "group_ids", len(x)), mode)


def gigpo_advantages(
    returns: Any,
    scores: Any,
    group_ids: Any,
    fingerprints: Any,
    mode: Mode = "mean_std_norm",
    step_weight: float = 1.0,
    episode_weight: float = 1.0,
) -> np.ndarray:
    """GiGPO: ``episode_weight * A_episode + step_weight * A_step`` (GiGPO's episode weight is 1;
    GraphGPO's is a setting, and its returns are :func:`graph_returns`).

    ``A_step`` normalises the return among the rows of the task group that share the level-0
    fingerprint (unbiased std); a singleton cluster or a missing level 0 gives 0. Only level 0 of
    ``fingerprints`` is used.
    """
    _check_mode(mode)
    w = _real(step_weight, "step_weight")
    w_episode = _real(episode_weight, "episode_weight")
    ret = _values(returns, "returns")
    n = len(ret)
    x = _values(scores, "scores", n)
    groups = _codes(group_ids, "group_ids", n)
    level0 = as_fingerprints(fingerprints, n)[:, 0]
    rows, values = _normalise_clusters(ret, _PairSorter(groups), level0, mode, ddof=1)
    step = np.zeros(n)
    step[rows] = values
    if w_episode == 0:  # as the recipe, which then skips the episode term
        return w * step
    return w_episode * _grpo(x, groups, mode) + w * step


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
    _check_mode(mode)
    a = _real(alpha, "alpha")
    offset = _real(weight_offset, "weight_offset", 0.0)
    if offset <= 0:
        raise ValueError(f"weight_offset must be > 0, got {weight_offset!r}")
    ret = _values(returns, "returns")
    groups = _codes(group_ids, "group_ids", len(ret))
    fp = as_fingerprints(fingerprints, len(ret))
    if base_group and scores is None:
        raise ValueError("base_group=True needs the episode scores")

    weights = [(k + offset) ** a for k in range(fp.shape[1])]
    num, den = _weighted_level_sums(ret, groups, fp, mode, weights)
    if base_group:  # the base item, length 1, after the levels
        base = _grpo(_values(scores, "scores", len(ret)), groups, mode)
        kept = np.abs(base) > ZERO_TOL
        num[kept] += base[kept]
        den[kept] += 1.0
    return num / (den + EPS)


def _positions(rollout: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's 0-based step in its rollout and its rollout's length (rows in chronological order)."""
    order = np.argsort(rollout, kind="stable")
    lengths = np.bincount(rollout)
    starts = np.cumsum(lengths) - lengths
    position = np.empty(len(rollout), dtype=np.int64)
    position[order] = np.arange(len(rollout)) - starts[rollout[order]]
    return position, lengths[rollout]


def _next_rows(rollout: np.ndarray) -> np.ndarray:
    """Each row's next row in its rollout, -1 on a rollout's last row."""
    order = np.argsort(rollout, kind="stable")
    after = np.full(len(rollout), -1, dtype=np.int64)
    continues = rollout[order[1:]] == rollout[order[:-1]]
    after[order[:-1][continues]] = order[1:][continues]
    return after


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
    success_reward: float = G2PO_SUCCESS_REWARD,
) -> np.ndarray:
    """G2PO, as its released code (Nala-YN/G2PO ``g2po/core_g2po.py``) computes it.

    Steps of a task group that act in one state (level 0 of ``states``) form a state group whose
    value is the mean over its steps of ``gamma ** (T - t) * E``: ``E`` the rollout's episode
    reward (the sum of its rewards, before invalid penalties), ``T`` its length, ``t`` the step's
    0-based position, so a rollout's last step is discounted once. A step leads to the state group
    of the next step of its rollout; a last step to a terminal worth ``success_reward`` when
    ``E == success_reward`` exactly (the code's success test) and 0 otherwise. The advantage is
    GRPO's episode term (as :func:`grpo_advantages`) plus ``step_weight`` times (a) the value led
    to minus the step's invalid penalty, normalised within the state group (0 in a group of one),
    and (b) that value minus the state group's own, normalised over the task group. Statistics
    use the unbiased std. ``traj_ids`` must identify rollouts uniquely across the batch.
    """
    _check_mode(mode)
    r = _values(rewards, "rewards")
    n = len(r)
    return _g2po(
        r,
        _codes(traj_ids, "traj_ids", n),
        _codes(group_ids, "group_ids", n),
        as_fingerprints(states, n)[:, 0],
        _penalties(invalid, invalid_penalty, n),
        mode,
        _real(gamma, "gamma", 0.0, 1.0),
        _real(step_weight, "step_weight"),
        _real(success_reward, "success_reward"),
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
) -> tuple[np.ndarray, np.ndarray]:
    """G2PO's advantages and what it credits each step with: the value of the state it led to,
    minus its invalid penalty (see :func:`g2po_advantages`)."""
    episode = np.bincount(rollout, weights=r)[rollout]
    position, length = _positions(rollout)
    state = pair_codes(groups, states)
    members = np.bincount(state)
    value = np.bincount(state, weights=gamma ** (length - position).astype(np.float64) * episode) / members
    after = _next_rows(rollout)
    terminal = np.where(episode == success_reward, success_reward, 0.0)
    value_next = np.where(after >= 0, value[state[np.maximum(after, 0)]], terminal)
    credited = value_next - penalty
    within_state = _normalise(credited, state, mode, ddof=1)
    gain = _normalise(value_next - value[state], groups, mode, ddof=1)
    return _grpo(episode - penalty, groups, mode) + step_weight * (within_state + gain), credited


# --------------------------------------------------------------------------- trainer entry


@dataclass(frozen=True)
class AdvantageConfig:
    """Which estimator and its settings; defaults are the paper's (ALFWorld).

    An estimator is a pair of choices: the return a step is credited with and how steps are
    grouped. ``grpo`` normalises the episode score in the task group; ``gigpo`` the discounted
    return among steps of the task in the same state (plus GRPO's episode term); ``hgpo`` the
    discounted return at K+1 context levels; ``graphgpo`` is GiGPO's grouping with the graph
    return (:func:`graph_returns`). ``step_return`` swaps the return of the three stepwise ones,
    e.g. ``hgpo`` with ``graph``: graph returns under HGPO's context hierarchy. ``g2po`` credits
    the value of the state a step leads to (:func:`g2po_advantages`).
    """

    estimator: Estimator = "hgpo"
    """grpo (episode level), gigpo (episode + level-0 step groups), hgpo (K+1 context levels),
    graphgpo (gigpo's groups, distance-to-success returns in the task's state graph) or g2po (the
    value of the state a step leads to, within its state and its task)."""
    gamma: float = 0.95
    """Discount (HGPO and GiGPO: 0.95); for graph returns the base of ``gamma ** distance``
    (GraphGPO's scripts: 0.1 on ALFWorld, 0.2 on WebShop)."""
    invalid_penalty: float = 0.1
    """Subtracted from the return of a step whose response was invalid."""
    mode: Mode = "mean_std_norm"
    """mean_norm or mean_std_norm inside groups (paper: ALFWorld mean_std_norm, WebShop mean_norm)."""
    alpha: float = 1.0
    """HGPO level weights grow as L**alpha (0: uniform)."""
    base_group: bool = False
    """HGPO: add the episode-level (GRPO) item to every row."""
    weight_offset: float = 2.0
    """HGPO: level k has length L = k + weight_offset (released code: 2)."""
    step_weight: float = 1.0
    """GiGPO, GraphGPO and G2PO: weight of the step-level advantage."""
    episode_weight: float = 1.0
    """Weight of the episode (GRPO) term of ``gigpo`` and ``graphgpo``; 0 drops it."""
    step_return: StepReturn | None = None
    """``discounted`` or ``graph``; None: the estimator's own (``graph`` for graphgpo)."""
    normalize_distance: bool = False
    """Graph returns: ``gamma ** (d(next) - d(state) + 1)`` instead of ``gamma ** d(next)``."""
    success_reward: float = G2PO_SUCCESS_REWARD
    """G2PO: the episode reward that counts as success (its code's constant, the win reward of
    verl-agent's ALFWorld and WebShop and of every env here)."""

    def __post_init__(self) -> None:
        if self.estimator not in ESTIMATORS:
            raise ValueError(f"unknown estimator {self.estimator!r}; expected one of {ESTIMATORS}")
        _check_mode(self.mode)
        _real(self.gamma, "gamma", 0.0, 1.0)
        _real(self.invalid_penalty, "invalid_penalty", 0.0)
        _real(self.alpha, "alpha")
        _real(self.step_weight, "step_weight")
        _real(self.episode_weight, "episode_weight")
        if _real(self.weight_offset, "weight_offset") <= 0:
            raise ValueError(f"weight_offset must be > 0, got {self.weight_offset!r}")
        if self.step_return is not None and self.step_return not in STEP_RETURNS:
            raise ValueError(f"unknown step_return {self.step_return!r}; expected one of {STEP_RETURNS}")
        _real(self.success_reward, "success_reward")
        credits = {"grpo": "the episode score", "g2po": "the value of the state a step leads to"}
        if self.step_return is not None and self.estimator in credits:
            raise ValueError(
                f"{self.estimator} credits {credits[self.estimator]}; step_return applies to gigpo, "
                "hgpo and graphgpo"
            )

    @property
    def returns(self) -> StepReturn:
        """The step return this estimator credits (stepwise estimators only)."""
        return self.step_return or ("graph" if self.estimator == "graphgpo" else "discounted")


@dataclass(frozen=True)
class StepCredit:
    """A batch's advantages and the per-step values its estimator normalised to make them."""

    advantages: np.ndarray
    returns: np.ndarray
    """What each step is credited with: its discounted or graph return, minus its invalid
    penalty (gigpo, hgpo, graphgpo); its episode score (grpo); the value of the state it led to,
    minus its penalty (g2po). Diagnostics describe these, so they describe what the update used."""


def compute_advantages(*columns: Any, **options: Any) -> np.ndarray:
    """Step advantages of a batch from its raw columns: :func:`step_credit` (same arguments)
    without the values they were made from."""
    return step_credit(*columns, **options).advantages


def step_credit(
    rewards: Any,
    traj_ids: Any,
    group_ids: Any,
    fingerprints: Any = None,
    invalid: Any = None,
    config: AdvantageConfig = AdvantageConfig(),
    next_states: Any = None,
) -> StepCredit:
    """Step advantages of a batch from its raw columns, as every trainer computes them, with the
    values they were made from.

    A rollout is keyed by (group_id, traj_id), so traj ids may restart in every group.
    ``fingerprints`` may be None for GRPO only. ``next_states`` (graph returns only) is each
    step's next-state key: level 0 of the fingerprints the step returned, the terminal
    observation's for a rollout's last step.
    """
    r = _values(rewards, "rewards")
    groups = _codes(group_ids, "group_ids", len(r))
    trajs = _codes(traj_ids, "traj_ids", len(r))
    rollouts = groups * (int(trajs.max(initial=0)) + 1) + trajs
    scores = episode_scores(r, rollouts, invalid, config.invalid_penalty)
    if config.estimator == "grpo":
        return StepCredit(_grpo(scores, groups, config.mode), scores)
    if fingerprints is None:
        raise ValueError(f"the {config.estimator} estimator needs fingerprints")
    fingerprints = as_fingerprints(fingerprints, len(r))
    if config.estimator == "g2po":
        return StepCredit(
            *_g2po(
                r,
                rollouts,
                groups,
                fingerprints[:, 0],
                _penalties(invalid, config.invalid_penalty, len(r)),
                config.mode,
                config.gamma,
                config.step_weight,
                config.success_reward,
            )
        )
    if config.returns == "graph":
        if next_states is None:
            raise ValueError("graph returns need each step's next-state key (next_states)")
        returns = graph_returns(
            r,
            rollouts,
            groups,
            fingerprints[:, 0],
            next_states,
            config.gamma,
            invalid,
            config.invalid_penalty,
            config.normalize_distance,
        )
    else:
        returns = step_returns(r, rollouts, config.gamma, invalid, config.invalid_penalty)
    if config.estimator in ("gigpo", "graphgpo"):
        advantages = gigpo_advantages(
            returns, scores, groups, fingerprints, config.mode, config.step_weight, config.episode_weight
        )
    else:
        advantages = hgpo_advantages(
            returns,
            groups,
            fingerprints,
            config.mode,
            config.alpha,
            config.base_group,
            scores,
            config.weight_offset,
        )
    return StepCredit(advantages, returns)
