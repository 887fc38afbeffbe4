"""Speed of the vectorised advantage estimators against the obvious per-cluster implementation.

    python benchmarks/advantage_speed.py [--rows 1000000] [--levels 4] [--seed 0]

HGPO is compared with a dict of clusters and numpy per cluster; GraphGPO with a loop written the
way its recipe computes it, per task group (a dict graph, a breadth-first search from success,
each trajectory's returns) and per step group; CRBC with a dense solve of each task group's
closure in turn; all must agree with the vectorised ones (1e-9). MVPO is timed beside GiGPO, whose
terms it contains (its worked cases are the tests').

Synthetic batches shaped like the paper's: 16 task groups of 8 rollouts each, repeated (with
new group ids) until --rows step rows. Each group walks a small random state graph from one
initial state, so its rollouts share early states, diverge and revisit states; the level-k key of
a step hashes its window of the last k+1 states, so higher levels collide less. Keys are not
salted per group, so equal keys in different groups also test that clusters are per group.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from collections import defaultdict, deque
from collections.abc import Callable

import numpy as np

from hgpo_env.tools.transitions import mix64
from hgpo_train import advantage as adv

GROUPS_PER_BATCH = 16
ROLLOUTS_PER_GROUP = 8


def synthetic_batch(
    rows: int, levels: int, seed: int, max_steps: int = 50, states: int = 24, branching: int = 3
) -> dict[str, np.ndarray]:
    """Columns group_id, traj_id, reward, invalid, fingerprints ((rows, levels+1) uint64),
    next_state (the level-0 key of the state each step led to), action_key (the branch taken; an
    invalid step's is one key of its own), won (the rollout reached the goal) and MVPO's: the
    signature (state and depth bin) and the five milestone triggers (state id mod 8 in 1..3 for the
    first three, the goal, the step's invalid flag) of the observation each step acted on and of
    the one it produced."""
    rng = np.random.default_rng(seed)
    batches = -(-rows // (GROUPS_PER_BATCH * ROLLOUTS_PER_GROUP * 10))  # enough at >= 10 steps a rollout
    n_groups = GROUPS_PER_BATCH * batches
    n_rollouts = n_groups * ROLLOUTS_PER_GROUP
    group = np.repeat(np.arange(n_groups), ROLLOUTS_PER_GROUP)
    successors = rng.integers(0, states, size=(n_groups, states, branching))
    goal = states - 1

    walk = np.zeros((n_rollouts, max_steps), dtype=np.int64)  # state 0 = the group's initial state
    invalid = rng.random((n_rollouts, max_steps)) < 0.1  # an invalid step leaves the state unchanged
    branch = rng.integers(0, branching, (n_rollouts, max_steps))
    for t in range(1, max_steps):
        moved = successors[group, walk[:, t - 1], branch[:, t - 1]]
        walk[:, t] = np.where(invalid[:, t - 1], walk[:, t - 1], moved)
    action = np.where(invalid, branching, branch).astype(np.uint64) + np.uint64(1)
    at_goal = walk == goal
    won = at_goal.any(axis=1)
    length = np.where(won, at_goal.argmax(axis=1) + 1, max_steps)

    # level k of step t hashes states t-k..t; missing (0) when t < k
    keys = np.zeros((levels + 1, n_rollouts, max_steps), dtype=np.uint64)
    h = mix64(walk.astype(np.uint64) + np.uint64(1))
    keys[0] = np.maximum(h, 1)  # 0 is reserved for "missing"
    for k in range(1, levels + 1):
        h = mix64(h[:, 1:] ^ (mix64(walk[:, :-k].astype(np.uint64) + np.uint64(k)) * np.uint64(31)))
        keys[k, :, k:] = np.maximum(h, 1)

    after = np.empty_like(keys[0])  # the state each step led to; past the horizon a state of its own
    after[:, :-1] = keys[0][:, 1:]
    after[:, -1] = np.maximum(mix64(walk[:, -1].astype(np.uint64) + np.uint64(states + 1)), 1)
    step = np.arange(max_steps)
    mask = step[None, :] < length[:, None]
    seen = np.concatenate([walk, walk[:, -1:]], axis=1)  # the observation after the last step: its state
    signature = seen * 100 + 3 * (np.arange(max_steps + 1) // 3)
    invalid_before = np.concatenate([np.zeros((n_rollouts, 1), bool), invalid], axis=1)
    triggers = np.stack(
        [seen % 8 == 1, seen % 8 == 2, seen % 8 == 3, seen == goal, invalid_before], axis=-1
    ).astype(np.int8)
    reward = np.where(won[:, None] & (step[None, :] == length[:, None] - 1), 10.0, 0.0)
    cols = {
        "group_id": np.broadcast_to(group[:, None], mask.shape)[mask],
        "traj_id": np.broadcast_to(np.arange(n_rollouts)[:, None], mask.shape)[mask],
        "reward": reward[mask],
        "invalid": invalid[mask].astype(np.float64),
        "fingerprints": keys.transpose(1, 2, 0)[mask],
        "next_state": after[mask],
        "action_key": action[mask],
        "won": np.broadcast_to(won[:, None], mask.shape)[mask],
        "signature": signature[:, :-1][mask],
        "next_signature": signature[:, 1:][mask],
        "triggers": triggers[:, :-1][mask],
        "next_triggers": triggers[:, 1:][mask],
    }
    return {name: col[:rows] for name, col in cols.items()}


def straightforward_hgpo(
    returns: np.ndarray,
    group_ids: np.ndarray,
    fingerprints: np.ndarray,
    mode: str,
    alpha: float = 1.0,
    weight_offset: int = 2,
) -> np.ndarray:
    """The obvious way: a dict of clusters, then numpy on each cluster in turn."""
    clusters: dict[tuple[int, int, int], list[int]] = defaultdict(list)
    for i, (g, row) in enumerate(zip(group_ids.tolist(), fingerprints.tolist())):
        for k, key in enumerate(row):
            if key:
                clusters[(g, k, key)].append(i)
    num = np.zeros(len(returns))
    den = np.zeros(len(returns))
    for (_, k, _), members in clusters.items():
        if len(members) < 2:
            continue
        idx = np.array(members)
        x = returns[idx]
        a = x - x.mean()
        if mode == "mean_std_norm":
            a = a / (x.std() + 1e-6)
        keep = np.abs(a) > 1e-6
        num[idx[keep]] += (k + weight_offset) ** alpha * a[keep]
        den[idx[keep]] += (k + weight_offset) ** alpha
    return num / (den + 1e-6)


def straightforward_graphgpo(
    rewards: np.ndarray,
    traj_ids: np.ndarray,
    group_ids: np.ndarray,
    states: np.ndarray,
    next_states: np.ndarray,
    invalid: np.ndarray,
    mode: str,
    gamma: float = 0.1,
) -> np.ndarray:
    """GraphGPO as its recipe computes it: a graph and a search per task group, returns per
    trajectory, then GiGPO's normalisation per step group and per task group, in Python loops."""
    rows_of: dict[int, list[int]] = defaultdict(list)
    for i, t in enumerate(traj_ids.tolist()):
        rows_of[t].append(i)
    totals = {t: float(rewards[rows].sum()) for t, rows in rows_of.items()}
    after = [("s", int(x)) for x in next_states.tolist()]
    for t, rows in rows_of.items():
        if totals[t] > 0:
            after[rows[-1]] = ("success",)
    before = [("s", int(x)) for x in states.tolist()]
    into: dict[int, dict] = defaultdict(lambda: defaultdict(set))
    nodes: dict[int, set] = defaultdict(set)
    for i, g in enumerate(group_ids.tolist()):
        into[g][after[i]].add(before[i])
        nodes[g].update((before[i], after[i]))
    distance: dict[int, dict] = {}
    for g, graph in into.items():
        d = {("success",): 0}
        queue = deque([("success",)])
        while queue:
            node = queue.popleft()
            for previous in graph.get(node, ()):
                if previous not in d:
                    d[previous] = d[node] + 1
                    queue.append(previous)
        far = max(d.values())
        distance[g] = {node: d.get(node, far + 1) for node in nodes[g]}
    returns = (
        np.array([10 * gamma ** distance[g][after[i]] for i, g in enumerate(group_ids.tolist())])
        - 0.1 * invalid
    )
    scores = np.array([totals[t] for t in traj_ids.tolist()]) - 0.1 * invalid

    def normalise(values: np.ndarray, keys: list, alone: Callable[[float], float]) -> np.ndarray:
        members: dict = defaultdict(list)
        for i, key in enumerate(keys):
            members[key].append(i)
        out = np.zeros(len(values))
        for idx in members.values():
            x = values[idx]
            if len(idx) == 1:
                out[idx] = alone(x[0])
                continue
            a = x - x.mean()
            out[idx] = a / (x.std(ddof=1) + 1e-6) if mode == "mean_std_norm" else a
        return out

    groups = group_ids.tolist()
    step = normalise(returns, list(zip(groups, states.tolist())), lambda x: 0.0)
    episode_alone = (lambda x: x / (1 + 1e-6)) if mode == "mean_std_norm" else (lambda x: x)  # mean 0, std 1
    return step + normalise(scores, groups, episode_alone)


def per_group_crbc(
    rewards: np.ndarray,
    traj_ids: np.ndarray,
    group_ids: np.ndarray,
    states: np.ndarray,
    actions: np.ndarray,
    won: np.ndarray,
    invalid: np.ndarray,
    mode: str,
    config: adv.CRBCSettings,
) -> np.ndarray:
    """CRBC's closure one task group at a time: the group's anchors and (anchor, action) pairs by
    np.unique, M and b as dense matrices, ``np.linalg.solve``, then Q, V, the spread and the gate.
    Rows must be grouped by rollout, each in order (as :func:`synthetic_batch` makes them)."""
    beta = config.beta
    step = np.zeros(len(rewards))
    bounds = np.flatnonzero(np.diff(group_ids, prepend=-1, append=-1))
    for start, end in itertools.pairwise(bounds):
        rows = np.arange(start, end)
        anchors, anchor = np.unique(states[rows], return_inverse=True)
        m = len(anchors)
        last = np.append(traj_ids[rows][1:] != traj_ids[rows][:-1], True)
        successor = np.where(last, np.where(won[rows], m, m + 1), np.append(anchor[1:], 0))
        visits = np.bincount(anchor, minlength=m)
        transitions = np.zeros((m, m + 2))
        np.add.at(transitions, (anchor, successor), 1.0)
        transitions /= visits[:, None]
        values = np.linalg.solve(np.eye(m) - beta * transitions[:, :m], beta * transitions[:, m])
        after = np.append(values, [1.0, 0.0])[successor]
        pairs, pair = np.unique(
            anchor * (int(actions.max()) + 1) + actions[rows].astype(np.int64), return_inverse=True
        )
        q = beta * np.bincount(pair, weights=after) / np.bincount(pair)
        gap = q[pair] - values[anchor]
        spread = np.sqrt(np.bincount(anchor, weights=gap * gap) / visits)
        choices = np.bincount(pairs // (int(actions.max()) + 1), minlength=m)
        step[rows] = np.where(choices[anchor] >= 2, gap / np.maximum(spread[anchor], config.sigma_min), 0.0)
    scores = adv.episode_scores(rewards, traj_ids, invalid=invalid)
    return adv.grpo_advantages(scores, group_ids, mode) + config.step_weight * step


def timed(fn: Callable[[], np.ndarray], repeats: int) -> tuple[float, float, np.ndarray]:
    """Best wall and best CPU seconds over ``repeats`` runs, and the result.

    CPU time is printed beside wall time because this machine's cores may be shared.
    """
    wall, cpu, out = float("inf"), float("inf"), None
    for _ in range(repeats):
        w, c = time.perf_counter(), time.process_time()
        out = fn()
        wall, cpu = min(wall, time.perf_counter() - w), min(cpu, time.process_time() - c)
    return wall, cpu, out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=1_000_000, help="step rows in the batch")
    parser.add_argument("--levels", type=int, default=4, help="K: fingerprint levels above 0")
    parser.add_argument("--mode", choices=("mean_norm", "mean_std_norm"), default="mean_std_norm")
    parser.add_argument(
        "--repeats", type=int, default=3, help="runs of each vectorised estimator (best shown)"
    )
    parser.add_argument(
        "--reference-rows", type=int, default=0, help="time the straightforward one on a prefix"
    )
    parser.add_argument(
        "--shuffle-rows", action="store_true", help="compare on the rows in random order (groups interleaved)"
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    b = synthetic_batch(args.rows, args.levels, args.seed)
    n = len(b["reward"])
    lengths = np.unique(b["traj_id"], return_counts=True)[1]
    groups = len(np.unique(b["group_id"]))
    print(
        f"batch: {n} rows, K={args.levels}, {groups} groups x {ROLLOUTS_PER_GROUP} rollouts, "
        f"mean rollout length {lengths.mean():.1f}, mode={args.mode}"
    )

    returns = adv.step_returns(b["reward"], b["traj_id"], invalid=b["invalid"])
    scores = adv.episode_scores(b["reward"], b["traj_id"], invalid=b["invalid"])
    graphgpo = adv.AdvantageConfig(estimator="graphgpo", gamma=0.1, mode=args.mode)
    crbc = adv.AdvantageConfig(estimator="crbc", mode=args.mode)

    def crbc_run(c: dict[str, np.ndarray]) -> Callable[[], np.ndarray]:
        return lambda: adv.compute_advantages(
            c["reward"], c["traj_id"], c["group_id"], c["fingerprints"], c["invalid"], crbc,
            action_keys=c["action_key"], won=c["won"],
        )  # fmt: skip

    def mvpo_run() -> np.ndarray:
        columns = ("won", "signature", "next_signature", "triggers", "next_triggers", "invalid")
        keys = b["reward"], b["traj_id"], b["group_id"], b["fingerprints"]
        return adv.mvpo_advantages(*keys, *(b[c] for c in columns)).advantages

    runs = {
        "step_returns": lambda: adv.step_returns(b["reward"], b["traj_id"], invalid=b["invalid"]),
        "grpo_advantages": lambda: adv.grpo_advantages(scores, b["group_id"], args.mode),
        "gigpo_advantages": lambda: adv.gigpo_advantages(
            returns, scores, b["group_id"], b["fingerprints"], args.mode
        ),
        "hgpo_advantages": lambda: adv.hgpo_advantages(returns, b["group_id"], b["fingerprints"], args.mode),
        "graph_returns": lambda: adv.graph_returns(
            b["reward"],
            b["traj_id"],
            b["group_id"],
            b["fingerprints"][:, 0],
            b["next_state"],
            0.1,
            b["invalid"],
        ),
        "graphgpo": lambda: adv.compute_advantages(
            b["reward"],
            b["traj_id"],
            b["group_id"],
            b["fingerprints"],
            b["invalid"],
            graphgpo,
            b["next_state"],
        ),
        "crbc": crbc_run(b),
        "mvpo": mvpo_run,
    }
    print(f"{'':>18}  {'wall':>8}  {'cpu':>8}")
    for name, run in runs.items():
        wall, cpu, _ = timed(run, args.repeats)
        print(f"{name:>18}: {wall:7.3f}s  {cpu:7.3f}s")

    m = min(args.reference_rows or n, n)
    rows = np.random.default_rng(args.seed).permutation(m) if args.shuffle_rows else slice(m)
    scope = "all rows" if m == n else f"a PREFIX of {m} rows only"
    scope += ", shuffled" if args.shuffle_rows else ""
    c = {k: v[rows] for k, v in b.items()}
    ret = returns[rows]
    comparisons = {
        "hgpo": (
            "straightforward",
            lambda: adv.hgpo_advantages(ret, c["group_id"], c["fingerprints"], args.mode),
            lambda: straightforward_hgpo(ret, c["group_id"], c["fingerprints"], args.mode),
        ),
        "graphgpo": (
            "per-group",
            lambda: adv.compute_advantages(
                c["reward"],
                c["traj_id"],
                c["group_id"],
                c["fingerprints"],
                c["invalid"],
                graphgpo,
                c["next_state"],
            ),
            lambda: straightforward_graphgpo(
                c["reward"],
                c["traj_id"],
                c["group_id"],
                c["fingerprints"][:, 0],
                c["next_state"],
                c["invalid"],
                args.mode,
            ),
        ),
        "crbc": (
            "per-group dense",
            crbc_run(c),
            lambda: per_group_crbc(
                c["reward"],
                c["traj_id"],
                c["group_id"],
                c["fingerprints"][:, 0],
                c["action_key"],
                c["won"],
                c["invalid"],
                args.mode,
                crbc.crbc,
            ),
        ),
    }
    for name, (baseline, fast_run, slow_run) in comparisons.items():
        if not compare(name, baseline, scope, fast_run, slow_run, args.repeats):
            return 1
    return 0


def compare(
    name: str,
    baseline: str,
    scope: str,
    fast_run: Callable[[], np.ndarray],
    slow_run: Callable[[], np.ndarray],
    repeats: int,
) -> bool:
    """Time both on the same rows, print the speed-up, and whether their results agree to 1e-9."""
    fast_wall, fast_cpu, fast = timed(fast_run, repeats)
    slow_wall, slow_cpu, slow = timed(slow_run, 1)
    print(f"{baseline} {name} on {scope}: {slow_wall:.3f}s wall, {slow_cpu:.3f}s cpu")
    print(f"vectorised {name} on the same rows: {fast_wall:.3f}s wall, {fast_cpu:.3f}s cpu")
    print(f"speed-up: {slow_wall / fast_wall:.1f}x wall, {slow_cpu / fast_cpu:.1f}x cpu")
    max_diff = float(np.abs(fast - slow).max(initial=0.0))
    if not np.allclose(fast, slow, rtol=0.0, atol=1e-9):
        print(f"MISMATCH: max |difference| {max_diff:.2e}")
        return False
    print(f"results agree: max |difference| {max_diff:.2e}")
    return True


if __name__ == "__main__":
    sys.exit(main())
