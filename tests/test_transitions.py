"""hgpo_env.tools.transitions on hand-made batches whose answers are counted by hand in each test."""

from __future__ import annotations

import numpy as np
import pytest

from hgpo_env.tools.transitions import aliased_visits, history_keys, merging


def columns(rollouts, group=0, first=0):
    """Rows of rollouts given as lists of (state, action, next state) triples (any hashable names)."""
    names: dict[object, int] = {}
    key = lambda name: names.setdefault(name, 1000 + len(names))
    out = {"group": [], "rollout": [], "state": [], "action": [], "next": []}
    for i, steps in enumerate(rollouts):
        for state, action, after in steps:
            out["group"].append(group)
            out["rollout"].append(first + i)
            out["state"].append(key(state))
            out["action"].append(key(action))
            out["next"].append(key(after))
    return {
        k: np.array(v, dtype=np.uint64 if k in ("state", "action", "next") else np.int64)
        for k, v in out.items()
    }


def test_history_keys_tell_paths_apart_and_ignore_interleaving():
    c = columns(
        [
            [("a", "x", "b"), ("b", "y", "c")],
            [("a", "x", "b"), ("b", "y", "c")],
            [("a", "z", "b"), ("b", "y", "c")],
        ]
    )
    keys = history_keys(c["rollout"], c["state"], c["action"])
    assert keys[0] == keys[2] == keys[4]  # every first step: the same state, no past
    assert keys[1] == keys[3] != keys[5]  # b after x twice, after z once
    order = np.array([0, 2, 4, 1, 3, 5])  # rollouts interleaved, each still in order
    shuffled = history_keys(c["rollout"][order], c["state"][order], c["action"][order])
    assert (shuffled == keys[order]).all()


def test_aliasing_counts_other_successors_after_other_histories_only():
    # b is reached two ways; "use" from b leads on to d after a, to e after c: the key hides state
    c = columns(
        [
            [("a", "go", "b"), ("b", "use", "d")],
            [("c", "go", "b"), ("b", "use", "e")],
            [("a", "go", "b"), ("b", "use", "d")],
        ]
    )
    histories = history_keys(c["rollout"], c["state"], c["action"])
    got = aliased_visits(c["group"], c["state"], c["action"], histories, c["next"])
    assert got.tolist() == [False, True, False, True, False, True]
    # the same history going two ways is the env's own randomness, not aliasing
    twice = columns([[("a", "roll", "b")], [("a", "roll", "c")]])
    same = history_keys(twice["rollout"], twice["state"], twice["action"])
    assert not aliased_visits(twice["group"], twice["state"], twice["action"], same, twice["next"]).any()
    # another group, or a key not shown (0), never aliases with these
    other = columns([[("c", "go", "b"), ("b", "use", "e")]], group=1, first=9)
    both = {k: np.concatenate([columns([[("a", "go", "b"), ("b", "use", "d")]])[k], other[k]]) for k in c}
    h = history_keys(both["rollout"], both["state"], both["action"])
    assert not aliased_visits(both["group"], both["state"], both["action"], h, both["next"]).any()
    hidden = np.zeros_like(c["state"])
    assert not aliased_visits(c["group"], hidden, c["action"], histories, c["next"]).any()


def test_merging_at_one_step_and_at_the_closure():
    # s1 is visited by rollouts 0 and 1; from s1 the transitions reach s2, which rollout 2 visits
    c = columns(
        [
            [("s0", "a", "s1"), ("s1", "c", "s2"), ("s2", "x", "end")],
            [("s0", "a", "s1"), ("s1", "d", "end")],
            [("s0", "b", "s2"), ("s2", "x", "end")],
        ]
    )
    met = merging(c["group"], c["rollout"], c["state"], c["action"])
    assert met.eligible.tolist() == [True, True, False, True, True, True, False]  # s0 and s1 saw two actions
    assert met.visited == pytest.approx([1, 2 / 3, 2 / 3, 1, 2 / 3, 1, 2 / 3])
    assert met.reached == pytest.approx([1, 1, 2 / 3, 1, 1, 1, 2 / 3])  # s2 reaches nothing further


def test_merging_never_mixes_groups_and_counts_more_than_64_rollouts():
    many = [[("s0", f"a{i % 2}", "end")] for i in range(70)]
    c = columns(many)
    other = columns([[("s0", "a", "end")]], group=1, first=100)
    both = {k: np.concatenate([c[k], other[k]]) for k in c}
    met = merging(both["group"], both["rollout"], both["state"], both["action"])
    assert met.eligible[:70].all() and not met.eligible[70]
    assert met.visited == pytest.approx([1.0] * 71)
