"""CRBC against shared/CRBC_SPEC.md: its three worked cases (numbers from the spec, computed by
hand there), a plain-loop reference written from the spec's equations (dicts, one dense solve
per group), the properties the spec lists, and bad input."""

from __future__ import annotations

import itertools
import math
import random
from collections import defaultdict

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hgpo_train.advantage import (
    AdvantageConfig,
    CRBCSettings,
    crbc_advantages,
    grpo_advantages,
    step_credit,
)

BETA = 0.98
STEP_ONLY = {"episode_weight": 0.0}  # the worked cases give A^S alone


def columns(rollouts, group=0, first_traj=0):
    """Rows of rollouts given as ``(steps, won)``, ``steps`` a list of (state, action) names."""
    out = defaultdict(list)
    for i, (steps, won) in enumerate(rollouts):
        for j, (state, action) in enumerate(steps):
            last = j == len(steps) - 1
            out["rewards"].append(10.0 if last and won else 0.0)
            out["traj_ids"].append(first_traj + i)
            out["group_ids"].append(group)
            out["states"].append(state)
            out["actions"].append(action)
            out["won"].append(bool(last and won))
            out["invalid"].append(action == "inv")
    return dict(out)


def keyed(cols, salt=0):
    """Names turned into integer keys (``salt`` renames every key)."""
    names: dict[str, int] = {}
    key = lambda name: names.setdefault(name, len(names) * 7919 + 1 + salt)
    return [key(s) for s in cols["states"]], [key(a) for a in cols["actions"]]


def credit(cols, depth="inf", salt=0, **config):
    states, actions = keyed(cols, salt)
    options = {"step_weight": 1.0, **config.pop("crbc", {})}
    cfg = AdvantageConfig(estimator="crbc", crbc=CRBCSettings(depth=depth, **options), **config)
    return step_credit(
        cols["rewards"], cols["traj_ids"], cols["group_ids"], states, cols["invalid"], cfg,
        action_keys=actions, won=cols["won"],
    )  # fmt: skip


# ---------------------------------------------------------------------------------------------
# The spec's worked cases


CASE_1 = [([("s0", "a"), ("s1", "c")], True), ([("s0", "b")], False)]
CASE_2 = [
    ([("s0", "a"), ("s1", "c")], True),
    ([("s0", "b"), ("s2", "d"), ("s1", "e")], False),
    ([("s0", "b"), ("s2", "d"), ("s1", "c")], True),
]
CASE_3 = [([("s0", "inv"), ("s0", "a")], True), ([("s0", "b")], False), ([("s0", "a")], False)]


def test_worked_case_1():
    got = credit(columns(CASE_1), **STEP_ONLY)
    np.testing.assert_allclose(got.advantages, [1, 0, -1], atol=1e-9)
    np.testing.assert_allclose(got.returns, [0.9604, 0.98, 0.0], atol=1e-9)  # Q(s0,a), Q(s1,c), Q(s0,b)
    np.testing.assert_allclose(got.state_values, [0.4802, 0.98, 0.4802], atol=1e-9)


@pytest.mark.parametrize(
    "depth, expected",
    [
        ("inf", [0.085369, 0.707107, -0.042684, 0, -1.414214, -0.042684, 0, 0.707107]),
        (0, [1.414214, 0.707107, -0.707107, 0, -1.414214, -0.707107, 0, 0.707107]),
        (1, [1.131138, 0.707107, -0.565569, 0, -1.414214, -0.565569, 0, 0.707107]),
        (2, [0.085369, 0.707107, -0.042684, 0, -1.414214, -0.042684, 0, 0.707107]),
        (7, [0.085369, 0.707107, -0.042684, 0, -1.414214, -0.042684, 0, 0.707107]),
    ],
)
def test_worked_case_2(depth, expected):
    got = credit(columns(CASE_2), depth, **STEP_ONLY)
    np.testing.assert_allclose(got.advantages, expected, atol=1e-6)  # the spec prints 6 decimals
    np.testing.assert_allclose(got.advantages, reference(columns(CASE_2), depth, **STEP_ONLY), atol=1e-12)
    if depth == "inf":
        v = dict(zip(columns(CASE_2)["states"], got.state_values))
        assert v == pytest.approx({"s0": 0.631730, "s1": 0.653333, "s2": 0.640267}, abs=1e-6)


def test_worked_case_3_a_loop():
    got = credit(columns(CASE_3), **STEP_ONLY)
    v = (BETA / 4) / (1 - BETA / 4)
    np.testing.assert_allclose(got.state_values, [v] * 4, atol=1e-12)
    np.testing.assert_allclose(got.returns, [BETA * v, 0.49, 0.0, 0.49], atol=1e-12)
    np.testing.assert_allclose(got.advantages, [-0.032438, 0.827166, -1.621894, 0.827166], atol=1e-6)


# ---------------------------------------------------------------------------------------------
# Reference: the spec's equations with dicts, loops and a dense solve per group.


def reference(
    cols, depth="inf", beta=BETA, sigma_min=0.1, step_weight=1.0, episode_weight=1.0, mode="mean_std_norm"
):
    n = len(cols["rewards"])
    rollout_rows = defaultdict(list)
    for i in range(n):
        rollout_rows[(cols["group_ids"][i], cols["traj_ids"][i])].append(i)
    step = np.zeros(n)
    for group in set(cols["group_ids"]):
        rollouts = [rows for (g, _), rows in rollout_rows.items() if g == group]
        transitions = []  # (row, s, a, x, G)
        for rows in rollouts:
            won = cols["won"][rows[-1]]
            for t, i in enumerate(rows):
                x = cols["states"][rows[t + 1]] if t + 1 < len(rows) else ("z+" if won else "z-")
                g = beta ** (len(rows) - t) if won else 0.0
                transitions.append((i, cols["states"][i], cols["actions"][i], x, g))
        anchors = sorted({s for _, s, *_ in transitions})
        n_s = defaultdict(int)
        n_sa = defaultdict(int)
        n_sax = defaultdict(int)
        for _, s, a, x, _ in transitions:
            n_s[s] += 1
            n_sa[s, a] += 1
            n_sax[s, a, x] += 1
        actions = {s: sorted({a for (s2, a) in n_sa if s2 == s}) for s in anchors}

        def backup(v, s, a, n_sa=n_sa, n_sax=n_sax):
            return beta * sum(c / n_sa[s, a] * v[x] for (s2, a2, x), c in n_sax.items() if (s2, a2) == (s, a))

        boundary = {"z+": 1.0, "z-": 0.0}
        if depth == "inf":
            index = {s: k for k, s in enumerate(anchors)}
            m = np.eye(len(anchors))
            b = np.zeros(len(anchors))
            for (s, a, x), c in n_sax.items():
                weight = n_sa[s, a] / n_s[s] * c / n_sa[s, a]
                if x in index:
                    m[index[s], index[x]] -= beta * weight
                elif x == "z+":
                    b[index[s]] += beta * weight
            solved = np.linalg.solve(m, b)
            v = {**boundary, **{s: solved[index[s]] for s in anchors}}
            q = {(s, a): backup(v, s, a) for s in anchors for a in actions[s]}
        else:
            q = {}
            for s in anchors:
                for a in actions[s]:
                    returns = [g for _, s2, a2, _, g in transitions if (s2, a2) == (s, a)]
                    q[s, a] = sum(returns) / len(returns)
            v = {**boundary, **{s: sum(n_sa[s, a] / n_s[s] * q[s, a] for a in actions[s]) for s in anchors}}
            for _ in range(depth):
                q = {(s, a): backup(v, s, a) for s in anchors for a in actions[s]}
                v = {
                    **boundary,
                    **{s: sum(n_sa[s, a] / n_s[s] * q[s, a] for a in actions[s]) for s in anchors},
                }
        for i, s, a, _, _ in transitions:
            sigma = math.sqrt(sum(n_sa[s, b] / n_s[s] * (q[s, b] - v[s]) ** 2 for b in actions[s]))
            if len(actions[s]) >= 2:
                step[i] = (q[s, a] - v[s]) / max(sigma, sigma_min)
    scores = [
        sum(cols["rewards"][j] for j in rollout_rows[(cols["group_ids"][i], cols["traj_ids"][i])])
        - 0.1 * cols["invalid"][i]
        for i in range(n)
    ]
    return episode_weight * grpo_advantages(scores, cols["group_ids"], mode) + step_weight * step


@st.composite
def batches(draw):
    """Task groups of rollouts on a small random state graph: shared starts, revisits, loops."""
    rng = random.Random(draw(st.integers(0, 2**32)))
    rollouts_by_group = []
    for _ in range(draw(st.integers(1, 3))):
        states = rng.randint(1, 6)
        moves = {(s, a): rng.randrange(states) for s in range(states) for a in range(3)}
        group = []
        for _ in range(draw(st.integers(1, 5))):
            state, steps = 0, []
            for _ in range(rng.randint(1, 7)):
                action = rng.randrange(3)
                steps.append((f"s{state}", f"a{action}"))
                state = moves[state, action]
            group.append((steps, rng.random() < 0.5))
        rollouts_by_group.append(group)
    out = defaultdict(list)
    for g, group in enumerate(rollouts_by_group):
        for name, values in columns(group, group=g).items():
            out[name] += values
    order = draw(st.permutations(range(len(out["rewards"]))))  # rollouts interleave, each in order
    by_rollout = defaultdict(list)
    for i in range(len(out["rewards"])):
        by_rollout[out["group_ids"][i], out["traj_ids"][i]].append(i)
    queues = {k: list(v) for k, v in by_rollout.items()}
    keys = [(out["group_ids"][i], out["traj_ids"][i]) for i in order]
    rows = [queues[k].pop(0) for k in keys]
    return {name: [values[i] for i in rows] for name, values in out.items()}


@settings(max_examples=150, deadline=None)
@given(batches(), st.sampled_from(["inf", 0, 1, 3]), st.sampled_from(["mean_norm", "mean_std_norm"]))
def test_matches_the_reference(cols, depth, mode):
    got = credit(cols, depth, mode=mode, crbc={"step_weight": 5.0})
    np.testing.assert_allclose(got.advantages, reference(cols, depth, step_weight=5.0, mode=mode), atol=1e-9)


# ---------------------------------------------------------------------------------------------
# The spec's properties


def test_step_weight_zero_is_grpo_exactly():
    cols = columns(CASE_2)
    scores = [10.0, 10.0, 0.0, 0.0, 0.0, 10.0, 10.0, 10.0]
    got = credit(cols, crbc={"step_weight": 0.0}).advantages
    assert (got == grpo_advantages(scores, cols["group_ids"])).all()


def test_no_success_and_no_choice_give_no_step_credit():
    failed = [([(s, a) for s, a in steps], False) for steps, _ in CASE_2]
    assert (credit(columns(failed), **STEP_ONLY).advantages == 0).all()
    same = [([("s0", "a"), ("s1", "c")], True), ([("s0", "a"), ("s1", "c")], False)]
    assert (credit(columns(same), **STEP_ONLY).advantages == 0).all()


def test_permuting_rollouts_and_renaming_keys_change_nothing():
    base = credit(columns(CASE_2))
    for order in itertools.permutations(range(3)):
        cols = columns([CASE_2[i] for i in order])
        got = credit(cols, salt=12345)
        rows_of = [2, 3, 3]
        start = np.cumsum([0] + [rows_of[i] for i in order])
        base_start = np.cumsum([0, 2, 3, 3])
        for k, i in enumerate(order):
            np.testing.assert_allclose(
                got.advantages[start[k] : start[k + 1]],
                base.advantages[base_start[i] : base_start[i + 1]],
                atol=1e-12,
            )


def test_groups_never_share_anchors_even_when_keys_collide():
    one = columns(CASE_2, group=0)
    two = columns(CASE_1, group=1, first_traj=3)
    both = {name: one[name] + two[name] for name in one}
    got = credit(both, **STEP_ONLY).advantages
    np.testing.assert_allclose(got[:8], credit(one, **STEP_ONLY).advantages, atol=1e-12)
    np.testing.assert_allclose(got[8:], credit(two, **STEP_ONLY).advantages, atol=1e-12)


def test_acyclic_group_of_depth_d_reaches_the_closure_at_k_d():
    paths = [  # the longest path, s0 s2 s3 s1 to the boundary, has D = 4 transitions
        ([("s0", "a"), ("s1", "c")], True),
        ([("s0", "b"), ("s2", "d"), ("s3", "d"), ("s1", "e")], False),
        ([("s0", "b"), ("s2", "d"), ("s3", "d"), ("s1", "c")], True),
    ]
    closure = credit(columns(paths), **STEP_ONLY).advantages
    np.testing.assert_allclose(credit(columns(paths), 4, **STEP_ONLY).advantages, closure, atol=1e-12)
    assert not np.allclose(credit(columns(paths), 1, **STEP_ONLY).advantages, closure, atol=1e-3)


def test_depth_converges_to_the_closure_within_corollary_3():
    cols = columns(CASE_3 + [([("s0", "inv"), ("s0", "inv"), ("s0", "b")], False)])
    closure = credit(cols, **STEP_ONLY)
    gaps = []
    v0 = credit(cols, 0, **STEP_ONLY).state_values
    v1 = credit(cols, 1, **STEP_ONLY).state_values
    drift = np.abs(v1 - v0).max()  # ||T V0 - V0|| over the (single) anchor
    for depth in (1, 5, 20, 80):
        got = credit(cols, depth, **STEP_ONLY)
        gap = np.abs((got.returns - got.state_values) - (closure.returns - closure.state_values)).max()
        assert gap <= 2 * BETA**depth / (1 - BETA) * drift + 1e-12
        gaps.append(gap)
    assert gaps[-1] < 1e-3 and gaps == sorted(gaps, reverse=True)


# ---------------------------------------------------------------------------------------------
# Inputs and settings


def test_function_form_uses_the_paper_defaults():
    cols = columns(CASE_2)
    states, actions = keyed(cols)
    got = crbc_advantages(
        cols["rewards"], cols["traj_ids"], cols["group_ids"], states, actions, cols["won"], cols["invalid"]
    )
    np.testing.assert_allclose(got, reference(cols, step_weight=5.0), atol=1e-12)


@pytest.mark.parametrize(
    "settings_, message",
    [
        ({"beta": 1.0}, "crbc.beta must be strictly between 0 and 1"),
        ({"beta": 0.0}, "crbc.beta must be strictly between 0 and 1"),
        ({"beta": 1.5}, "crbc.beta must be finite and in [0.0, 1.0]"),
        ({"depth": -1}, "crbc.depth must be an integer >= 0 or 'inf'"),
        ({"depth": 2.5}, "crbc.depth must be an integer >= 0 or 'inf'"),
        ({"depth": True}, "crbc.depth must be an integer >= 0 or 'inf'"),
        ({"sigma_min": 0.0}, "crbc.sigma_min must be > 0"),
    ],
)
def test_bad_settings_are_one_line(settings_, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        CRBCSettings(**settings_)


def test_step_weight_of_other_estimators_is_refused_for_crbc():
    with pytest.raises(ValueError, match="crbc's step weight .* is crbc.step_weight"):
        AdvantageConfig(estimator="crbc", step_weight=2.0)


def test_missing_columns_are_named():
    cols = columns(CASE_1)
    states, actions = keyed(cols)
    config = AdvantageConfig(estimator="crbc")
    args = (cols["rewards"], cols["traj_ids"], cols["group_ids"])
    with pytest.raises(ValueError, match="crbc estimator needs each step's action key"):
        step_credit(*args, states, None, config, won=cols["won"])
    with pytest.raises(ValueError, match="crbc estimator needs the env's won flag"):
        step_credit(*args, states, None, config, action_keys=actions)
    with pytest.raises(ValueError, match="crbc estimator needs fingerprints"):
        step_credit(*args, None, None, config, action_keys=actions, won=cols["won"])
    with pytest.raises(ValueError, match="action_keys: keys has 1 rows, expected 3"):
        step_credit(*args, states, None, config, action_keys=actions[:1], won=cols["won"])
    with pytest.raises(ValueError, match="won must hold only 0/1"):
        step_credit(*args, states, None, config, action_keys=actions, won=[0, 2, 0])
