"""What a step is credited with before grouping: discounted returns, episode scores, and
GraphGPO's distance-to-success returns in each task group's state graph."""

from __future__ import annotations

from typing import Any

import numpy as np

from hgpo_train.advantage.columns import (
    float_column,
    id_codes,
    invalid_penalties,
    level0,
    real_setting,
)
from hgpo_train.advantage.config import AdvantageConfig
from hgpo_train.advantage.grouping import PairSorter, last_rows
from hgpo_train.advantage.rows import Rows

GRAPH_RETURN_SCALE = 10.0
"""GraphGPO's step return at distance 0 (the recipe's constant: ALFWorld's win reward)."""


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
    r = float_column(rewards, "rewards")
    rollout = id_codes(traj_ids, "traj_ids", len(r))
    g = real_setting(gamma, "gamma", 0.0, 1.0)
    penalty = invalid_penalties(invalid, invalid_penalty, len(r))

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
    r = float_column(rewards, "rewards")
    rollout = id_codes(traj_ids, "traj_ids", len(r))
    penalty = invalid_penalties(invalid, invalid_penalty, len(r))
    return np.bincount(rollout, weights=r)[rollout] - penalty


def distinct(values: np.ndarray) -> np.ndarray:
    """The distinct values, sorted: one in-place sort, where ``np.unique`` hashes first (10x slower here)."""
    values.sort()
    first = np.ones(len(values), dtype=bool)
    np.not_equal(values[1:], values[:-1], out=first[1:])
    return values[first]


def node_codes(groups: np.ndarray, state: np.ndarray, after: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Dense codes of the (group, state) and (group, next state) pairs, shape (n, 2), and each
    code's group; ``groups`` are dense codes.

    Each row's state goes beside its next state, so the pairs stay in group order (no sort by
    group), and a pair equal to the one before it (a step's next state is mostly the next row's
    state) takes its code without being sorted again.
    """
    key = np.column_stack([state, after]).ravel()
    new = np.empty(len(key), dtype=bool)
    new[:1] = True
    np.not_equal(key[1:], key[:-1], out=new[1:])
    new[2::2] |= groups[1:] != groups[:-1]  # a group starts only at a row's state
    kept = np.flatnonzero(new)
    kept_groups = groups[kept >> 1]
    rows, kept_codes = PairSorter(kept_groups).clusters(key[kept], zero_is_missing=False)
    codes = np.empty(len(kept), np.int64)
    codes[rows] = kept_codes
    first = np.flatnonzero(np.diff(kept_codes, prepend=-1))  # codes come cluster by cluster
    return codes[np.cumsum(new) - 1].reshape(-1, 2), kept_groups[rows[first]]


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
    d_state, d_next, _ = _graph_distances(group_ids, states, next_states, success)
    return d_state, d_next


def _graph_distances(
    group_ids: Any, states: Any, next_states: Any, success: Any
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`graph_distances` and each row's state node: a dense code of its (group, state)."""
    state = level0(states)
    n = len(state)
    after = level0(next_states, n)
    done = float_column(success, "success", n) != 0
    groups = id_codes(group_ids, "group_ids", n)
    nodes, state_group = node_codes(groups, state, after)
    first_success = len(state_group)  # success nodes follow, one per group
    size = first_success + int(groups.max(initial=-1)) + 1
    source = nodes[:, 0]
    target = np.where(done, first_success + groups, nodes[:, 1])
    node_group = np.concatenate([state_group, np.arange(size - first_success)])

    # the distinct edges into each node, as a CSR table: one value sort of (target, source) words
    words = target.astype(np.uint64)
    words <<= np.uint64(32)
    words |= source.view(np.uint64)
    edges = distinct(words)
    sources = (edges & np.uint64(0xFFFFFFFF)).astype(np.int64)
    into = np.bincount((edges >> np.uint64(32)).astype(np.int64), minlength=size)
    first_edge = np.cumsum(into) - into
    distance = np.full(size, -1, dtype=np.int64)
    frontier = np.arange(first_success, size)
    distance[frontier] = 0
    level = 0
    while frontier.size:  # one pass per distance: the edges into the frontier, in one gather
        counts = into[frontier]
        within = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
        reached = sources[np.repeat(first_edge[frontier], counts) + within]
        frontier = distinct(reached[distance[reached] < 0])
        level += 1
        distance[frontier] = level
    far = np.zeros(size - first_success, dtype=np.int64)
    np.maximum.at(far, node_group, distance)
    distance = np.where(distance < 0, far[node_group] + 1, distance)
    return distance[source], distance[target], source


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
    r = float_column(rewards, "rewards")
    g = real_setting(gamma, "gamma", 0.0, 1.0)
    penalty = invalid_penalties(invalid, invalid_penalty, len(r))
    rollout = id_codes(traj_ids, "traj_ids", len(r))
    return _graph_returns(r, rollout, group_ids, states, next_states, g, penalty, normalize_distance)[0]


def _graph_returns(
    r: np.ndarray, rollout: np.ndarray, group_ids: Any, states: Any, next_states: Any, g: float,
    penalty: np.ndarray, normalize_distance: bool,
) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """:func:`graph_returns` on checked columns, and each row's state node (see
    :func:`_graph_distances`)."""
    if normalize_distance and g == 0:
        raise ValueError("normalize_distance needs gamma > 0 (a step away from success has exponent < 0)")
    won = (np.bincount(rollout, weights=r) > 0)[rollout]
    d_state, d_next, nodes = _graph_distances(group_ids, states, next_states, won & last_rows(rollout))
    exponent = d_next - d_state + 1 if normalize_distance else d_next
    low = int(exponent.min(initial=0))  # a few distinct exponents: one power each, then a gather
    power = GRAPH_RETURN_SCALE * g ** np.arange(low, int(exponent.max(initial=0)) + 1, dtype=np.float64)
    return power[exponent - low] - penalty, nodes


def credited_returns(rows: Rows, config: AdvantageConfig) -> tuple[np.ndarray, np.ndarray | None]:
    """The return gigpo, graphgpo and hgpo credit each step with (``config.returns``) and, for
    graph returns, each row's state node: the dense (group, state) codes GiGPO's grouping needs,
    which the graph has already made."""
    fingerprints = rows.state_keys(config.estimator)
    if config.returns == "discounted":
        returns = step_returns(rows.reward, rows.rollouts, config.gamma, rows.invalid, config.invalid_penalty)
        return returns, None
    if rows.next_states is None:
        raise ValueError("graph returns need each step's next-state key (next_states)")
    penalty = invalid_penalties(rows.invalid, config.invalid_penalty, len(rows))
    return _graph_returns(
        rows.reward, rows.rollouts, rows.groups, fingerprints[:, 0], rows.next_states, config.gamma,
        penalty, config.normalize_distance,
    )  # fmt: skip
