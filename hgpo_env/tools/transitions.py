"""Does a state key see the state? Statistics of a batch's (key, action, next key) transitions.

Every state-keyed estimator (GiGPO, GraphGPO, G2PO, CRBC) assumes that two steps with the same key
are in the same state. Where a key hides state, one (key, action) leads to different next states
depending on what happened before: :func:`aliased_visits` counts those visits. Where it does not,
what the estimators live on is how often rollouts meet at a key and try different actions there:
:func:`merging`. Both read columns (numpy only), so the audit command and the trainers' logs use
the same definitions. Rows of one rollout are in chronological order; rollouts may interleave.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a bijection of uint64 that spreads every input bit."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _dense(*columns: np.ndarray) -> np.ndarray:
    """Dense codes of the rows' tuples of integer columns: equal tuples, equal codes. Column by
    column, the codes so far and the next column's pair into one int64 (both are < n)."""
    codes = np.zeros(len(columns[0]), dtype=np.int64)
    for column in columns:
        values = np.unique(np.asarray(column), return_inverse=True)[1].reshape(-1)
        codes = np.unique(codes * (int(values.max(initial=0)) + 1) + values, return_inverse=True)[1].reshape(
            -1
        )
    return codes


def _sizes(codes: np.ndarray) -> np.ndarray:
    """Per row, how many rows share its code."""
    return np.bincount(codes)[codes]


def _rollout_order(rollouts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The rows sorted rollout by rollout (each in its own order), and each row's next row in its
    rollout (-1 on a last row)."""
    order = np.argsort(rollouts, kind="stable")
    after = np.full(len(rollouts), -1, dtype=np.int64)
    continues = rollouts[order[1:]] == rollouts[order[:-1]]
    after[order[:-1][continues]] = order[1:][continues]
    return order, after


def history_keys(rollouts: np.ndarray, states: np.ndarray, actions: np.ndarray) -> np.ndarray:
    """Per row, a 64-bit key of its whole history: every earlier (state, action) of its rollout
    and its own state. Two steps share it exactly when they got there the same way."""
    rollouts = np.asarray(rollouts)
    order, _ = _rollout_order(rollouts)
    r, s, a = rollouts[order], np.asarray(states, np.uint64)[order], np.asarray(actions, np.uint64)[order]
    first = np.ones(len(r), dtype=bool)
    first[1:] = r[1:] != r[:-1]
    step = mix64(s * _GOLDEN + np.uint64(1)) ^ mix64(a + _GOLDEN)  # what one step contributes
    keys = np.empty(len(r), dtype=np.uint64)
    starts = np.flatnonzero(first)
    lengths = np.diff(np.append(starts, len(r)))
    running = np.zeros(len(starts), dtype=np.uint64)
    for position in range(int(lengths.max(initial=0))):  # one pass per step position, not per row
        live = lengths > position
        rows = starts[live] + position
        keys[rows] = mix64(running[live] * _GOLDEN ^ mix64(s[rows] + np.uint64(position)))
        running[live] = mix64(running[live] ^ step[rows])
    out = np.empty_like(keys)
    out[order] = keys
    return out


def aliased_visits(
    groups: np.ndarray, keys: np.ndarray, actions: np.ndarray, histories: np.ndarray, successors: np.ndarray
) -> np.ndarray:
    """Per row: another visit of its task group with the same key and action, but another history,
    went to another successor. Such a key merges states its history tells apart (an env's own
    randomness under one history is not counted). Rows with key 0 (level not shown) are False."""
    shown = np.asarray(keys) != 0
    out = np.zeros(len(shown), dtype=bool)
    if not shown.any():
        return out
    g, k, a = np.asarray(groups)[shown], np.asarray(keys)[shown], np.asarray(actions)[shown]
    h, x = np.asarray(histories)[shown], np.asarray(successors)[shown]
    cluster = _dense(g, k, a)
    same_successor = _dense(cluster, x)
    same_history = _dense(cluster, h)
    same_both = _dense(cluster, h, x)
    other_successor = _sizes(cluster) - _sizes(same_successor)
    other_successor_same_history = _sizes(same_history) - _sizes(same_both)
    out[shown] = other_successor - other_successor_same_history > 0
    return out


@dataclass(frozen=True)
class Merging:
    """Per row, how much of its group's evidence meets at its state key (level 0)."""

    eligible: np.ndarray
    """Two or more distinct actions were taken from the row's key in its group."""
    visited: np.ndarray
    """Share of the group's rollouts that visited the row's key."""
    reached: np.ndarray
    """Share of the group's rollouts that visited a key reachable from the row's key along the
    group's transitions (the evidence a Bellman closure draws on)."""


def merging(groups: np.ndarray, rollouts: np.ndarray, states: np.ndarray, actions: np.ndarray) -> Merging:
    """How the rollouts of each task group meet: see :class:`Merging`. A row's successor is the
    next row's key in its rollout. Rollout sets are bitsets (a uint64 word per 64 rollouts of a
    group), widened along the transitions until nothing changes: one pass per step of the
    longest path."""
    groups, rollouts = np.asarray(groups), np.asarray(rollouts)
    anchor = _dense(groups, states)
    anchors = int(anchor.max(initial=-1)) + 1
    pair = _dense(anchor, actions)
    pair_anchor = np.zeros(int(pair.max(initial=-1)) + 1, dtype=np.int64)
    pair_anchor[pair] = anchor
    eligible = (np.bincount(pair_anchor, minlength=anchors) >= 2)[anchor]

    member = _dense(groups, rollouts)
    group = _dense(groups)
    rollout_group = np.zeros(int(member.max(initial=-1)) + 1, dtype=np.int64)
    rollout_group[member] = group
    order = np.argsort(rollout_group, kind="stable")
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order)) - np.searchsorted(rollout_group[order], rollout_group[order])
    row_rank = rank[member]
    words = int(row_rank.max(initial=0)) // 64 + 1
    own = np.zeros((anchors, words), dtype=np.uint64)
    bits = np.left_shift(np.uint64(1), (row_rank % 64).astype(np.uint64))
    np.bitwise_or.at(own, (anchor, row_rank // 64), bits)
    _, after = _rollout_order(rollouts)
    moves = after >= 0
    source, target = anchor[moves], anchor[after[moves]]
    reach = own.copy()
    while True:
        widened = reach.copy()
        np.bitwise_or.at(widened, source, reach[target])
        if (widened == reach).all():
            break
        reach = widened
    anchor_group = np.zeros(anchors, dtype=np.int64)
    anchor_group[anchor] = group
    members = np.bincount(rollout_group)[anchor_group]
    return Merging(
        eligible, _bits_set(own)[anchor] / members[anchor], _bits_set(reach)[anchor] / members[anchor]
    )


def _bits_set(bitsets: np.ndarray) -> np.ndarray:
    """Per row of a (n, words) uint64 bitset, how many bits are set."""
    return np.unpackbits(bitsets.view(np.uint8), axis=1).sum(axis=1)
