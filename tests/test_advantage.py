"""hgpo_train.advantage against shared/HGPO_SPEC.md: the worked example, a plain-loop reference
written from the spec text, invariants and input errors."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hgpo_train.advantage import (
    AdvantageConfig,
    Rows,
    as_fingerprints,
    compute_advantages,
    episode_scores,
    gigpo_advantages,
    grpo_advantages,
    hgpo_advantages,
    hgpo_level_items,
    level_clusters,
    pair_codes,
    step_returns,
)

# ---------------------------------------------------------------------------------------------
# Reference: the spec, one sentence at a time, with dicts and for-loops. Lists in, lists out.
# ---------------------------------------------------------------------------------------------


def rows_by(keys):
    """{key: [its rows, in order]}; rows whose key is None are left out."""
    rows = {}
    for i, key in enumerate(keys):
        if key is not None:
            rows.setdefault(key, []).append(i)
    return rows


def seq_sum(values):
    """Left-to-right float sum (Python 3.12's sum() compensates, numpy's bincount does not)."""
    total = 0.0
    for v in values:
        total += v
    return total


def ref_returns(rewards, trajs, gamma, invalid, penalty):
    """Per rollout, backwards: R_t = r_t + gamma R_{t+1}; then R~_t = R_t - penalty * invalid_t."""
    out = [0.0] * len(rewards)
    for rows in rows_by(trajs).values():
        running = 0.0
        for i in reversed(rows):
            running = rewards[i] + gamma * running
            out[i] = running - penalty * invalid[i]
    return out


def ref_scores(rewards, trajs, invalid, penalty):
    """sum_t r_t over the row's rollout - penalty * invalid of this row."""
    total = {t: seq_sum(rewards[i] for i in rows) for t, rows in rows_by(trajs).items()}
    return [total[t] - penalty * inv for t, inv in zip(trajs, invalid)]


def ref_norm(values, mode, mean, std):
    if mode == "mean_norm":
        return [v - mean for v in values]
    return [(v - mean) / (std + 1e-6) for v in values]


def ref_stats(values, ddof):
    mean = seq_sum(values) / len(values)
    var = seq_sum((v - mean) ** 2 for v in values) / (len(values) - ddof)
    return mean, math.sqrt(var)


def ref_grpo(scores, groups, mode):
    """Normalise the score among all rows of the group, unbiased std; one row: mean 0, std 1."""
    out = [0.0] * len(scores)
    for rows in rows_by(groups).values():
        values = [scores[i] for i in rows]
        mean, std = (0.0, 1.0) if len(rows) == 1 else ref_stats(values, ddof=1)
        for i, a in zip(rows, ref_norm(values, mode, mean, std)):
            out[i] = a
    return out


def ref_clusters(groups, fingerprints, level):
    """Rows of a group sharing the non-zero level fingerprint."""
    keys = [(g, fp[level]) if fp[level] != 0 else None for g, fp in zip(groups, fingerprints)]
    return list(rows_by(keys).values())


def ref_gigpo(returns, scores, groups, fingerprints, mode, step_weight):
    """A_episode + w * A_step; A_step: level-0 clusters, unbiased std, singleton gives 0."""
    step = [0.0] * len(returns)
    for rows in ref_clusters(groups, fingerprints, 0):
        if len(rows) < 2:
            continue
        values = [returns[i] for i in rows]
        mean, std = ref_stats(values, ddof=1)
        for i, a in zip(rows, ref_norm(values, mode, mean, std)):
            step[i] = a
    episode = ref_grpo(scores, groups, mode)
    return [e + step_weight * s for e, s in zip(episode, step)]


def ref_hgpo(returns, groups, fingerprints, mode, alpha, base_group, scores, weight_offset):
    """Items (L, a) per row from every cluster of >= 2 rows (population std) and the optional
    base item; drop |a| <= 1e-6; weights L**alpha / (sum + 1e-6); A = sum w a."""
    items = [[] for _ in returns]
    for level in range(len(fingerprints[0]) if fingerprints else 0):
        for rows in ref_clusters(groups, fingerprints, level):
            if len(rows) < 2:
                continue
            values = [returns[i] for i in rows]
            mean, std = ref_stats(values, ddof=0)
            for i, a in zip(rows, ref_norm(values, mode, mean, std)):
                items[i].append((level + weight_offset, a))
    if base_group:
        for i, a in enumerate(ref_grpo(scores, groups, mode)):
            items[i].append((1, a))
    out = []
    for row in items:
        kept = [(length, a) for length, a in row if abs(a) > 1e-6]
        total = sum(length**alpha for length, _ in kept)
        out.append(sum(length**alpha / (total + 1e-6) * a for length, a in kept))
    return out


# ---------------------------------------------------------------------------------------------
# Random batches: groups of rollouts walking a tiny shared state space
# ---------------------------------------------------------------------------------------------


def random_batch(rng: np.random.Generator, levels: int, string_ids: bool) -> dict:
    """Rows of rollouts grouped by task, states drawn from a tiny vocabulary (revisits, shared
    prefixes, the same state in several groups), occasionally a level blanked out (0)."""
    window_key: dict = {}
    groups, trajs, rewards, invalid, fps = [], [], [], [], []
    for g in range(int(rng.integers(1, 4))):
        states = int(rng.integers(1, 4))
        for t in range(int(rng.integers(1, 5))):
            walk = [0] + [int(s) for s in rng.integers(0, states, int(rng.integers(0, 6)))]
            for step, _ in enumerate(walk):
                row = []
                for k in range(levels + 1):
                    window = tuple(walk[step - k : step + 1]) if step >= k else None
                    if window is None or rng.random() < 0.05:
                        row.append(0)
                    else:
                        row.append(
                            window_key.setdefault(window, int(rng.integers(1, 2**64, dtype=np.uint64)))
                        )
                fps.append(tuple(row))
                groups.append(f"task-{g}" if string_ids else g * 7)
                trajs.append(f"{g}/{t}" if string_ids else 100 * g + t)
                last = step == len(walk) - 1
                rewards.append(
                    float(rng.choice([0.0, 10.0]))
                    if last
                    else float(rng.choice([0.0, 0.0, 0.5, rng.normal()]))
                )
                invalid.append(int(rng.random() < 0.2))
    return {"groups": groups, "trajs": trajs, "rewards": rewards, "invalid": invalid, "fps": fps}


def assert_close(actual, expected, tol=1e-9):
    np.testing.assert_allclose(np.asarray(actual), np.asarray(expected, dtype=float), rtol=0, atol=tol)


# ---------------------------------------------------------------------------------------------
# The worked example of HGPO_SPEC.md
# ---------------------------------------------------------------------------------------------

S, X, Y, SX, SY = 11, 22, 33, 1122, 1133
EXAMPLE = {
    "returns": [1.0, 2.0, 0.0, 0.0, 3.0, 3.0],
    "groups": [0] * 6,
    "fps": [(S, 0), (X, SX), (S, 0), (X, SX), (S, 0), (Y, SY)],
}


def test_worked_example_exact_with_weight_epsilon():
    got = hgpo_advantages(EXAMPLE["returns"], EXAMPLE["groups"], EXAMPLE["fps"], mode="mean_norm", alpha=1.0)
    expected = [
        2 * (-1 / 3) / (2 + 1e-6),
        (2 * 1 + 3 * 1) / (5 + 1e-6),
        2 * (-4 / 3) / (2 + 1e-6),
        (2 * -1 + 3 * -1) / (5 + 1e-6),
        2 * (5 / 3) / (2 + 1e-6),
        0.0,
    ]
    assert_close(got, expected, 1e-12)
    assert_close(got, [-1 / 3, 1, -4 / 3, -1, 5 / 3, 0], 1e-5)


def test_worked_example_weights_k2():
    # K = 2, alpha = 1, all three levels present and kept: weights 2/9, 3/9, 4/9
    returns = [1.0, 0.0]
    fps = [(5, 6, 7), (5, 6, 7)]
    items, kept = hgpo_level_items(returns, level_clusters([0, 0], fps), "mean_norm")
    assert kept.all()
    assert_close(items, [[0.5] * 3, [-0.5] * 3])
    assert_close(
        hgpo_advantages(returns, [0, 0], fps, mode="mean_norm"), [0.5 * 9 / (9 + 1e-6), -0.5 * 9 / (9 + 1e-6)]
    )


# ---------------------------------------------------------------------------------------------
# Agreement with the reference on thousands of random batches
# ---------------------------------------------------------------------------------------------


def check_against_reference(
    b: dict, gamma: float, penalty: float, mode: str, alpha: float, base: bool, offset: int
) -> None:
    rewards, trajs, groups, invalid, fps = b["rewards"], b["trajs"], b["groups"], b["invalid"], b["fps"]
    returns = step_returns(rewards, trajs, gamma, invalid, penalty)
    scores = episode_scores(rewards, trajs, invalid, penalty)
    assert_close(returns, ref_returns(rewards, trajs, gamma, invalid, penalty))
    assert_close(scores, ref_scores(rewards, trajs, invalid, penalty))
    # as given (groups contiguous) and with the rows shuffled (groups interleaved)
    shuffled = np.random.default_rng(len(groups)).permutation(len(groups))
    for rows in (range(len(groups)), shuffled):
        r, s = returns[rows].tolist(), scores[rows].tolist()
        g, f = [groups[i] for i in rows], [fps[i] for i in rows]
        assert_close(grpo_advantages(s, g, mode), ref_grpo(s, g, mode))
        assert_close(gigpo_advantages(r, s, g, f, mode, 0.7), ref_gigpo(r, s, g, f, mode, 0.7))
        assert_close(
            hgpo_advantages(r, g, f, mode, alpha, base, s if base else None, offset),
            ref_hgpo(r, g, f, mode, alpha, base, s, offset),
        )


def test_reference_agreement_seeded():
    rng = np.random.default_rng(20260221)
    for i in range(3000):
        check_against_reference(
            random_batch(rng, levels=[0, 1, 2, 4][i % 4], string_ids=i % 3 == 0),
            gamma=float(rng.choice([0.0, 0.5, 0.95, 1.0])),
            penalty=float(rng.choice([0.0, 0.1, 0.7])),
            mode=["mean_norm", "mean_std_norm"][i % 2],
            alpha=float([0, 1, 2][i % 3]),
            base=bool(i // 2 % 2),
            offset=[1, 2][i // 4 % 2],
        )


@settings(max_examples=300, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    levels=st.sampled_from([0, 1, 2, 4]),
    string_ids=st.booleans(),
    mode=st.sampled_from(["mean_norm", "mean_std_norm"]),
    alpha=st.sampled_from([0.0, 1.0, 2.0, 0.5]),
    base=st.booleans(),
    offset=st.sampled_from([1, 2]),
    gamma=st.floats(0.0, 1.0),
)
def test_reference_agreement_hypothesis(seed, levels, string_ids, mode, alpha, base, offset, gamma):
    b = random_batch(np.random.default_rng(seed), levels, string_ids)
    check_against_reference(b, gamma, 0.1, mode, alpha, base, offset)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_hgpo_reference_on_arbitrary_values(data):
    """Free-form returns and fingerprints (any uint64, many collisions), not only random walks."""
    n = data.draw(st.integers(1, 25))
    levels = data.draw(st.integers(1, 4))
    returns = data.draw(st.lists(st.floats(-50, 50), min_size=n, max_size=n))
    groups = data.draw(st.lists(st.sampled_from(["a", "b"]), min_size=n, max_size=n))
    key = st.sampled_from([0, 1, 2, 2**63, 2**64 - 1])
    fps = data.draw(st.lists(st.tuples(*[key] * levels), min_size=n, max_size=n))
    mode = data.draw(st.sampled_from(["mean_norm", "mean_std_norm"]))
    assert_close(
        hgpo_advantages(returns, groups, fps, mode), ref_hgpo(returns, groups, fps, mode, 1.0, False, None, 2)
    )


# ---------------------------------------------------------------------------------------------
# Invariants
# ---------------------------------------------------------------------------------------------

walk_batches = st.builds(
    lambda seed, levels: random_batch(np.random.default_rng(seed), levels, False),
    st.integers(0, 2**32 - 1),
    st.sampled_from([0, 1, 2, 4]),
)


@settings(max_examples=100, deadline=None)
@given(b=walk_batches, value=st.floats(-20, 20), mode=st.sampled_from(["mean_norm", "mean_std_norm"]))
def test_equal_returns_give_zero(b, value, mode):
    n = len(b["groups"])
    returns = [value] * n
    assert not hgpo_advantages(returns, b["groups"], b["fps"], mode).any()
    step_only = gigpo_advantages(returns, returns, b["groups"], b["fps"], mode) - grpo_advantages(
        returns, b["groups"], mode
    )
    # the mean of equal floats can be off by an ulp, which "/ (std + 1e-6)" magnifies up to 1e6 times
    assert_close(step_only, np.zeros(n), 1e-6)
    sizes = np.unique(b["groups"], return_inverse=True, return_counts=True)
    in_larger_group = sizes[2][sizes[1]] > 1
    assert_close(
        grpo_advantages(returns, b["groups"], mode)[in_larger_group], np.zeros(in_larger_group.sum()), 1e-6
    )


@settings(max_examples=100, deadline=None)
@given(b=walk_batches, shift=st.integers(-30, 30))
def test_shift_invariance_mean_norm(b, shift):
    returns = step_returns(b["rewards"], b["trajs"], 0.95, b["invalid"])
    first_group = np.unique(b["groups"], return_inverse=True)[1] == 0
    assert_close(
        hgpo_advantages(returns + shift * first_group, b["groups"], b["fps"], "mean_norm"),
        hgpo_advantages(returns, b["groups"], b["fps"], "mean_norm"),
    )


@settings(max_examples=100, deadline=None)
@given(b=walk_batches, scale=st.floats(0.5, 20))
def test_scale_invariance_mean_std_norm(b, scale):
    # rounded, so unequal values differ by >= 1e-3 and std stays far above the 1e-6 epsilon
    returns = np.round(step_returns(b["rewards"], b["trajs"], 0.95, b["invalid"]), 3)
    assert_close(
        hgpo_advantages(returns * scale, b["groups"], b["fps"], "mean_std_norm"),
        hgpo_advantages(returns, b["groups"], b["fps"], "mean_std_norm"),
        1e-2,
    )


def test_interleaved_rollouts_match_contiguous():
    rng = np.random.default_rng(3)
    b = random_batch(rng, 2, string_ids=True)
    while len(set(b["trajs"])) < 3:
        b = random_batch(rng, 2, string_ids=True)
    trajs = np.asarray(b["trajs"])
    # a random interleaving that keeps each rollout's rows in chronological order
    slots = rng.permutation(len(trajs))
    perm = np.empty(len(trajs), int)
    for t in np.unique(trajs):
        mine = np.flatnonzero(trajs == t)
        perm[np.sort(slots[mine])] = mine
    mixed = {name: [column[i] for i in perm] for name, column in b.items()}
    assert_close(
        step_returns(mixed["rewards"], mixed["trajs"], 0.9, mixed["invalid"]),
        step_returns(b["rewards"], b["trajs"], 0.9, b["invalid"])[perm],
        0,
    )
    assert_close(
        episode_scores(mixed["rewards"], mixed["trajs"]),
        episode_scores(b["rewards"], b["trajs"])[perm],
        1e-12,
    )
    config = AdvantageConfig(estimator="hgpo", base_group=True)
    assert_close(
        compute_advantages(
            mixed["rewards"], mixed["trajs"], mixed["groups"], mixed["fps"], mixed["invalid"], config
        ),
        compute_advantages(b["rewards"], b["trajs"], b["groups"], b["fps"], b["invalid"], config)[perm],
        1e-12,
    )


# ---------------------------------------------------------------------------------------------
# Hand-checked values
# ---------------------------------------------------------------------------------------------


def test_step_returns_golden():
    rewards = [0.0, 0.0, 10.0, 1.0, 2.0]
    trajs = ["a", "a", "a", "b", "b"]
    assert_close(step_returns(rewards, trajs, gamma=0.5), [2.5, 5.0, 10.0, 2.0, 2.0], 0)
    assert_close(step_returns(rewards, trajs, gamma=0.95), [9.025, 9.5, 10.0, 2.9, 2.0], 1e-12)
    assert_close(step_returns(rewards, trajs, gamma=0.0), rewards, 0)
    assert_close(step_returns([5.0], [7]), [5.0], 0)  # one-step rollout: no bootstrap


def test_invalid_penalty_is_not_discounted():
    rewards = [0.0, 0.0, 10.0]
    got = step_returns(rewards, [1, 1, 1], gamma=0.5, invalid=[False, True, False], invalid_penalty=0.1)
    assert_close(got, [2.5, 5.0 - 0.1, 10.0], 1e-12)  # step 0 sees R_1 before the penalty
    assert_close(episode_scores(rewards, [1, 1, 1], invalid=[0, 1, 0]), [10.0, 9.9, 10.0], 1e-12)
    assert_close(episode_scores(rewards, [1, 1, 1], invalid=[0, 1, 0], invalid_penalty=0.0), [10.0] * 3, 0)


def test_grpo_single_row_group_uses_mean_zero_std_one():
    got = grpo_advantages([3.0, 1.0, 2.0], ["solo", "pair", "pair"], "mean_std_norm")
    std = math.sqrt(0.5)  # unbiased std of (1, 2)
    assert_close(got, [3.0 / (1 + 1e-6), -0.5 / (std + 1e-6), 0.5 / (std + 1e-6)], 1e-12)
    assert_close(grpo_advantages([3.0], [0], "mean_norm"), [3.0], 0)


def test_gigpo_singleton_and_missing_level0_give_no_step_term():
    returns, scores = [1.0, 5.0, 3.0], [0.0, 0.0, 0.0]
    got = gigpo_advantages(returns, scores, [0, 0, 0], [(9,), (9,), (0,)], "mean_norm", step_weight=2.0)
    assert_close(got, [-4.0, 4.0, 0.0], 0)
    assert_close(gigpo_advantages(returns, scores, [0, 1, 2], [7, 7, 7], "mean_norm"), [0, 0, 0], 0)


def test_revisited_context_counts_every_visit():
    # one rollout visits state 4 twice; the cluster has two rows of the same rollout
    got = hgpo_advantages([2.0, 0.0], ["g", "g"], [(4,), (4,)], "mean_norm", alpha=1.0)
    assert_close(got, [2 * 1 / (2 + 1e-6), 2 * -1 / (2 + 1e-6)], 1e-12)


def test_equal_keys_in_different_groups_are_different_clusters():
    fps = [(5,), (5,), (5,)]
    got = hgpo_advantages([1.0, 0.0, 9.0], [0, 0, 1], fps, "mean_norm")
    assert_close(got, [0.5 * 2 / (2 + 1e-6), -0.5 * 2 / (2 + 1e-6), 0.0], 1e-12)
    assert (level_clusters([0, 0, 1], fps)[:, 0] == [0, 0, 1]).all()


@pytest.mark.parametrize(
    "attribute, value",
    [
        # all keys of a group share the hashed part of the packed word: every batch with two keys
        # in a group must notice and fall back to the exact sort
        ("_SPREAD", np.uint64(0)),
        # no bits left for the key: the packed sort is never tried
        ("PairSorter.MIN_KEY_BITS", 65),
    ],
)
def test_exact_without_the_packed_sort(monkeypatch, attribute, value):
    monkeypatch.setattr(f"hgpo_train.advantage.grouping.{attribute}", value)
    exact_sorts = []
    lexsort = np.lexsort
    monkeypatch.setattr(np, "lexsort", lambda keys: exact_sorts.append(1) or lexsort(keys))
    rng = np.random.default_rng(11)
    for i in range(300):
        check_against_reference(
            random_batch(rng, levels=[0, 1, 2, 4][i % 4], string_ids=i % 3 == 0),
            gamma=0.95,
            penalty=0.1,
            mode=["mean_norm", "mean_std_norm"][i % 2],
            alpha=1.0,
            base=i % 5 == 0,
            offset=2,
        )
    assert len(exact_sorts) > 300


@settings(max_examples=200, deadline=None)
@given(b=walk_batches, seed=st.integers(0, 2**32 - 1))
def test_level_clusters_match_the_reference_grouping(b, seed):
    rows = np.random.default_rng(seed).permutation(len(b["groups"]))  # groups interleaved
    groups, fps = [b["groups"][i] for i in rows], [b["fps"][i] for i in rows]
    clusters = level_clusters(groups, fps)
    for level in range(len(fps[0])):
        expected = ref_clusters(groups, fps, level)
        codes = clusters[:, level]
        assert sorted(sorted(c) for c in expected) == sorted(
            np.flatnonzero(codes == c).tolist() for c in np.unique(codes[codes >= 0])
        )
        assert (codes[codes >= 0].max(initial=-1) + 1) == len(expected)  # dense codes


def test_pair_codes_with_group_codes_outside_the_packed_range():
    groups = np.array([-3, -3, 2**62, 2**62, -3])
    codes = pair_codes(groups, np.array([1, 2, 1, 1, 1], dtype=np.uint64))
    assert codes[0] == codes[4] and codes[2] == codes[3]
    assert len({codes[0], codes[1], codes[2]}) == 3


def test_compute_advantages_keys_rollouts_by_group_and_traj():
    # traj ids restart in every group: (0, 0) and (1, 0) are different rollouts
    rewards, trajs, groups = [0.0, 10.0, 0.0, 0.0], [0, 0, 0, 0], [0, 0, 1, 1]
    fps = [(1, 0), (2, 12), (1, 0), (2, 12)]
    grpo = compute_advantages(rewards, trajs, groups, None, config=AdvantageConfig("grpo", mode="mean_norm"))
    assert_close(grpo, [0, 0, 0, 0], 0)  # each group: one rollout, equal scores
    returns = step_returns(rewards, ["0/0", "0/0", "1/0", "1/0"], 0.95)
    assert_close(returns, [9.5, 10.0, 0.0, 0.0], 1e-12)
    config = AdvantageConfig("hgpo", mode="mean_norm", base_group=True)
    expected = hgpo_advantages(returns, groups, fps, "mean_norm", 1.0, True, [10.0, 10.0, 0.0, 0.0])
    assert_close(compute_advantages(rewards, trajs, groups, fps, config=config), expected, 0)
    config = AdvantageConfig("gigpo", mode="mean_std_norm", step_weight=0.5)
    expected = gigpo_advantages(returns, [10.0, 10.0, 0.0, 0.0], groups, fps, "mean_std_norm", 0.5)
    assert_close(compute_advantages(rewards, trajs, groups, fps, config=config), expected, 0)


@pytest.mark.parametrize(
    "trajs, expected",
    [
        ([7, 7, 3, 9, 9], [1, 1, 0, 2, 2]),  # ids unique across the batch
        ([0, 0, 0, 1, 0], [0, 0, 1, 2, 1]),  # ids restart in every group
    ],
)
def test_rollouts_are_dense_codes_of_group_and_traj(trajs, expected):
    rows = Rows.from_columns([0.0] * 5, trajs, [0, 0, 1, 1, 1])
    assert len(set(zip(rows.rollouts.tolist(), expected))) == len(set(expected))  # same partition
    assert sorted(set(rows.rollouts.tolist())) == list(range(len(set(expected))))  # dense


# ---------------------------------------------------------------------------------------------
# Input forms
# ---------------------------------------------------------------------------------------------


def test_fingerprint_forms_agree():
    rows = [(1, 0, 0), (1, 2**64 - 1, 0), (1, 2**64 - 1, 3)]
    array = np.array(rows, dtype=np.uint64)
    assert (as_fingerprints(rows) == array).all()
    assert (as_fingerprints(array.view(np.int64)) == array).all()  # signed storage, same bits
    assert as_fingerprints([5, 6]).shape == (2, 1)  # 1-D: level 0 only
    assert as_fingerprints([]).shape == (0, 1)
    assert (as_fingerprints(list(array)) == array).all()  # a list of array rows
    for floats in ([1.7, 2.0], [(1, 2), (3, 4.5)], [np.array([1.5])]):  # numpy would truncate them silently
        with pytest.raises(ValueError, match="must be ints"):
            as_fingerprints(floats)
    assert (level_clusters([0, 0, 0], rows) == level_clusters([0, 0, 0], array.view(np.int64))).all()


@pytest.mark.parametrize("dtype", [np.uint64, np.uint8, np.int32, np.int64])
def test_integer_id_dtypes(dtype):
    groups = np.array([3, 3, 0, 0, 200], dtype=dtype)  # 200 > 4 * rows: the sorting path
    expected = grpo_advantages([1.0, 2.0, 3.0, 5.0, 7.0], ["b", "b", "a", "a", "c"])
    assert_close(grpo_advantages([1.0, 2.0, 3.0, 5.0, 7.0], groups), expected, 0)
    assert_close(grpo_advantages([1.0, 2.0, 3.0, 5.0], groups[:4]), expected[:4], 0)


def test_empty_batch():
    empty = np.zeros((0, 3), np.uint64)
    assert step_returns([], []).shape == (0,)
    assert hgpo_advantages([], [], empty, base_group=True, scores=[]).shape == (0,)
    assert gigpo_advantages([], [], [], empty).shape == (0,)
    assert compute_advantages([], [], [], empty).shape == (0,)


def test_torch_tensors_are_accepted():
    torch = pytest.importorskip("torch")
    returns = torch.tensor(EXAMPLE["returns"], dtype=torch.float32)
    fps = torch.tensor(EXAMPLE["fps"], dtype=torch.int64)
    got = hgpo_advantages(returns, torch.zeros(6, dtype=torch.long), fps, mode="mean_norm")
    assert got.dtype == np.float64
    assert_close(
        got, hgpo_advantages(EXAMPLE["returns"], EXAMPLE["groups"], EXAMPLE["fps"], "mean_norm"), 1e-12
    )
    rewards = torch.tensor([0.0, 10.0], requires_grad=True)
    assert_close(step_returns(rewards, torch.tensor([3, 3]), 0.5), [5.0, 10.0], 0)


def test_package_import_does_not_import_torch():
    code = "import sys, hgpo_train.advantage, hgpo_train.run.diagnostics; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


# ---------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------

FP3 = [(1,), (1,), (2,)]


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: step_returns([1.0, 2.0], [0]), "traj_ids has 1 rows"),
        (lambda: step_returns([1.0, float("nan")], [0, 0]), "NaN or inf"),
        (lambda: step_returns([1.0], [0], gamma=-0.1), "gamma"),
        (lambda: step_returns([1.0], [0], gamma=1.5), "gamma"),
        (lambda: step_returns([1.0], [0], gamma=float("nan")), "gamma"),
        (lambda: step_returns([1.0], [0], gamma="high"), "gamma"),
        (lambda: step_returns([1.0], [0], invalid=[2]), "0/1"),
        (lambda: step_returns([1.0], [0], invalid=[1], invalid_penalty=-1), "invalid_penalty"),
        (lambda: step_returns([[1.0]], [0]), "1-D"),
        (lambda: episode_scores([1.0], [0.5]), "integers or strings"),
        (lambda: grpo_advantages([1.0, 2.0], [0, 0], mode="z_norm"), "unknown mode"),
        (lambda: grpo_advantages([1.0, float("inf")], [0, 0]), "NaN or inf"),
        (lambda: grpo_advantages(["x"], [0]), "numeric"),
        (lambda: gigpo_advantages([1.0, 2.0, 3.0], [0.0, 0.0], [0, 0, 0], FP3), "scores has 2 rows"),
        (lambda: gigpo_advantages([1.0, 2.0, 3.0], [0.0] * 3, [0, 0, 0], FP3[:2]), "fingerprints has 2 rows"),
        (lambda: hgpo_advantages([1.0, 2.0, 3.0], [0, 0, 0], FP3, mode="median"), "unknown mode"),
        (lambda: hgpo_advantages([1.0, 2.0, float("nan")], [0, 0, 0], FP3), "NaN or inf"),
        (
            lambda: hgpo_advantages([1.0, 2.0, 3.0], [0, 0, 0], FP3, base_group=True),
            "needs the episode scores",
        ),
        (lambda: hgpo_advantages([1.0, 2.0, 3.0], [0, 0, 0], FP3, weight_offset=0), "weight_offset"),
        (lambda: hgpo_advantages([1.0, 2.0, 3.0], [0, 0, 0], np.ones((3, 1, 1), np.uint64)), "shape"),
        (lambda: hgpo_advantages([1.0, 2.0, 3.0], [0, 0, 0], np.ones((3, 0), np.uint64)), "shape"),
        (lambda: hgpo_advantages([1.0, 2.0, 3.0], [0, 0, 0], np.ones((3, 2))), "integers"),
        (lambda: hgpo_advantages([1.0, 2.0], [0, 0], [(1, 2), (1,)]), "equally many"),
        (lambda: hgpo_advantages([1.0], [0], [(-1,)]), "equally many"),
        (lambda: hgpo_advantages([1.0], [[0]], [(1,)]), "1-D"),
        (lambda: AdvantageConfig(estimator="ppo"), "unknown estimator"),
        (lambda: AdvantageConfig(mode="max"), "unknown mode"),
        (lambda: AdvantageConfig(gamma=2.0), "gamma"),
        (lambda: AdvantageConfig(weight_offset=-1), "weight_offset"),
        (
            lambda: compute_advantages([0.0], [0], [0], None, config=AdvantageConfig("gigpo")),
            "needs fingerprints",
        ),
    ],
)
def test_bad_input_raises_value_error(call, message):
    with pytest.raises(ValueError, match=message):
        call()
