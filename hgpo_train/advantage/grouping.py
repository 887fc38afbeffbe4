"""Which rows belong together: (group, key) clusters, normalisation within them, and the
order of the rows of each rollout.

Ids are factorised into dense integer codes once, a cluster is a contiguous run after one sort,
and per-cluster statistics are ``np.bincount`` reductions: no Python loop over rows or clusters.
Rows of one rollout must be in chronological order; rollouts may interleave (sorts are stable).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from hgpo_train.advantage.columns import as_fingerprints, float_column, id_codes

EPS = 1e-6
"""Added to the std and to the weight sum, as in the released code."""
PARALLEL_ROWS = 100_000
"""From this many rows, independent parts of an estimator run on threads (below, starting them
costs more than they save); numpy's sorts, gathers and arithmetic release the GIL."""

# Odd 64-bit constant (2**64 / golden ratio): multiplying by it carries a key's low bits upwards.
_SPREAD = np.uint64(0x9E3779B97F4A7C15)


class PairSorter:
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
        starts = np.empty(len(keys), dtype=bool)  # whether a sorted row starts a new cluster
        starts[:1] = True
        np.logical_not(same, out=starts[1:])
        if singletons and not zero_is_missing:  # every row stays
            rows, codes = order, np.cumsum(starts) - 1
        else:
            keep = sorted_keys != 0 if zero_is_missing else np.ones(len(keys), dtype=bool)
            if not singletons:
                shared = np.zeros(len(keys), dtype=bool)
                shared[1:] = same  # continues the previous row's cluster
                shared[:-1] |= same  # or is continued by the next row
                keep &= shared
            rows, codes = order[keep], np.cumsum(starts[keep]) - 1
        return (rows if self.perm is None else self.perm[rows]), codes

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
    rows, codes = PairSorter(id_codes(groups, "groups", len(keys))).clusters(keys, zero_is_missing=False)
    out = np.empty(len(keys), np.int64)
    out[rows] = codes
    return out


def nested_codes(groups: np.ndarray, keys: np.ndarray, subkeys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Dense codes of the (group, key) pairs and of the (group, key, subkey) triples, as
    :func:`pair_codes` twice but with one row sort: the second sort runs on rows already
    ordered by the first's codes, where it needs no argsort."""
    rows, codes = PairSorter(id_codes(groups, "groups", len(keys))).clusters(keys, zero_is_missing=False)
    inner_rows, inner_codes = PairSorter(codes).clusters(subkeys[rows], zero_is_missing=False)
    outer, inner = np.empty(len(keys), np.int64), np.empty(len(keys), np.int64)
    outer[rows] = codes
    inner[rows[inner_rows]] = inner_codes
    return outer, inner


def _clusters(groups: np.ndarray, fp: np.ndarray) -> np.ndarray:
    """Level-major (K+1, n) cluster codes, -1 where the level is missing."""
    sorter = PairSorter(groups)
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
    return _clusters(id_codes(group_ids, "group_ids", len(fp)), fp).T


def threads_for(n: int, tasks: int) -> int:
    """Threads for ``tasks`` independent jobs over ``n`` rows: one per core from
    :data:`PARALLEL_ROWS` rows, else one."""
    return max(1, min(tasks, os.cpu_count() or 1)) if n >= PARALLEL_ROWS else 1


def normalise(x: np.ndarray, codes: np.ndarray, mode: str, ddof: int) -> np.ndarray:
    """``x`` normalised within the clusters given by dense ``codes``.

    A singleton gives exactly 0 (its mean is itself); callers that want otherwise override it.
    """
    count = np.bincount(codes)
    dev = x - (np.bincount(codes, weights=x) / np.maximum(count, 1))[codes]  # codes may skip some
    if mode == "mean_std_norm":
        var = np.bincount(codes, weights=dev * dev) / np.maximum(count - ddof, 1)
        dev /= (np.sqrt(var) + EPS)[codes]
    return dev


def normalise_clusters(
    x: np.ndarray, sorter: PairSorter, keys: np.ndarray, mode: str, ddof: int
) -> tuple[np.ndarray, np.ndarray]:
    """``x`` normalised within its (group, key) cluster, as (rows, values) for the rows in
    clusters of >= 2 rows with a non-zero key; every other row's value is exactly 0.

    Skipping the singletons skips most rows at high levels. The statistics run over the rows
    sorted by cluster, so every reduction reads memory in sequence; each cluster keeps its rows
    in row order, so sums match a row-order loop bit for bit.
    """
    rows, codes = sorter.clusters(keys, singletons=False)
    return rows, normalise(x[rows], codes, mode, ddof)


def last_rows(rollout: np.ndarray) -> np.ndarray:
    """Whether each row is the last (chronologically) of its rollout."""
    order = np.argsort(rollout, kind="stable")
    last = np.ones(len(rollout), dtype=bool)
    last[order[:-1]] = rollout[order[1:]] != rollout[order[:-1]]
    return last


def rollout_success(won: Any, rollout: np.ndarray) -> np.ndarray:
    """Per rollout (dense codes), whether it succeeded: the env's ``won`` on its last row, the one
    success every estimator reads (0/1 or booleans only)."""
    flags = float_column(won, "won", len(rollout))
    if not np.isin(flags, (0.0, 1.0)).all():
        raise ValueError("won must hold only 0/1 (or booleans)")
    succeeded = np.zeros(int(rollout.max(initial=-1)) + 1, dtype=bool)
    last = last_rows(rollout)
    succeeded[rollout[last]] = flags[last] != 0
    return succeeded


def positions(rollout: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's 0-based step in its rollout and its rollout's length (rows in chronological order)."""
    order = np.argsort(rollout, kind="stable")
    lengths = np.bincount(rollout)
    starts = np.cumsum(lengths) - lengths
    position = np.empty(len(rollout), dtype=np.int64)
    position[order] = np.arange(len(rollout)) - starts[rollout[order]]
    return position, lengths[rollout]


def next_rows(rollout: np.ndarray) -> np.ndarray:
    """Each row's next row in its rollout, -1 on a rollout's last row."""
    order = np.argsort(rollout, kind="stable")
    after = np.full(len(rollout), -1, dtype=np.int64)
    continues = rollout[order[1:]] == rollout[order[:-1]]
    after[order[:-1][continues]] = order[1:][continues]
    return after
