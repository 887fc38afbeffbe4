"""GraphGPO equals its authors' code, and composes with the other estimators' groupings.

``tests/data/graphgpo_golden.json`` holds batches run through the authors' own functions
(verl-agent's GraphGPO recipe as published in zzj1111/alfworldauto @ 37aec78: the state graph of
``ComplexGraph.from_data``, ``compute_graph_path_returns``, ``compute_graphgpo_outcome_advantage``
with GiGPO's normalisation), in float64, with the trainer's invalid penalty. The cases cover
loops and self-loops, groups without success, success from a reward before the last step,
negative rewards, invalid actions, interleaved rollouts, both modes, both distance forms, gammas
0.1-0.95 and episode weight 0. Only the data is committed, not their code.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hgpo_train.advantage import (
    AdvantageConfig,
    compute_advantages,
    graph_distances,
    graph_returns,
    hgpo_advantages,
    step_returns,
)

GOLDEN = json.loads((Path(__file__).parent / "data" / "graphgpo_golden.json").read_text())["cases"]


def columns(case: dict) -> dict:
    rows = case["rows"]
    return {
        "group": np.array(rows["group"]),
        "traj": np.array(rows["traj"]),
        "state": np.array(rows["state"], dtype=np.uint64),
        "next": np.array(rows["next"], dtype=np.uint64),
        "reward": np.array(rows["reward"], dtype=np.float64),
        "invalid": np.array(rows["invalid"], dtype=bool),
    }


@pytest.mark.parametrize("case", GOLDEN, ids=lambda c: f"{len(c['advantages'])}rows-{c['settings']}")
def test_graphgpo_equals_the_authors_code(case: dict) -> None:
    c, s = columns(case), case["settings"]
    config = AdvantageConfig(
        estimator="graphgpo",
        gamma=s["gamma"],
        normalize_distance=s["normalize_distance"],
        mode=s["mode"],
        step_weight=s["step_weight"],
        episode_weight=s["episode_weight"],
        invalid_penalty=s["invalid_penalty"],
    )
    rollouts = c["group"] * 100 + c["traj"]
    returns = graph_returns(
        c["reward"], rollouts, c["group"], c["state"], c["next"], s["gamma"], c["invalid"],
        s["invalid_penalty"], s["normalize_distance"],
    )  # fmt: skip
    np.testing.assert_allclose(returns, case["step_returns"], rtol=0, atol=1e-9)
    advantages = compute_advantages(
        c["reward"], c["traj"], c["group"], c["state"], c["invalid"], config, next_states=c["next"]
    )
    np.testing.assert_allclose(advantages, case["advantages"], rtol=0, atol=1e-9)


def test_the_cases_cover_what_matters() -> None:
    settings = [c["settings"] for c in GOLDEN]
    assert {s["normalize_distance"] for s in settings} == {False, True}
    assert {s["mode"] for s in settings} == {"mean_norm", "mean_std_norm"}
    assert {s["episode_weight"] for s in settings} >= {0.0, 1.0} and len({s["gamma"] for s in settings}) >= 3
    self_loops = sum(int((columns(c)["state"] == columns(c)["next"]).sum()) for c in GOLDEN)
    assert self_loops > 50


def test_distances_by_hand() -> None:
    """Rollout A: 1 -> 2 -> 3, won; B: 1 -> 4 -> 4 -> 5, lost. Success is one step past 3."""
    group, state, after = [0] * 6, [1, 2, 3, 1, 4, 4], [2, 3, 9, 4, 4, 5]
    d_state, d_next = graph_distances(group, state, after, [0, 0, 1, 0, 0, 0])
    # 3 reaches success in 1 step, 1 in 3; 4 and 5 never: largest finite (3) + 1. Node 9 is
    # dropped: a won episode's terminal state is replaced by success.
    assert d_state.tolist() == [3, 2, 1, 3, 4, 4] and d_next.tolist() == [2, 1, 0, 4, 4, 4]
    assert graph_distances([0, 1], [1, 1], [2, 2], [0, 0])[0].tolist() == [1, 1]  # no success: all 1
    # Groups are separate graphs even where keys coincide.
    d, _ = graph_distances([0, 0, 1], [1, 2, 1], [2, 7, 2], [0, 1, 0])
    assert d.tolist() == [2, 1, 1]


def test_graph_returns_under_hgpo_context_levels() -> None:
    """The composition no released code offers: graph returns, HGPO's K+1 context groups."""
    rng = np.random.default_rng(0)
    n = 60
    group, traj = np.repeat([0, 1], 30), np.tile(np.repeat(np.arange(6), 5), 2)
    state = rng.integers(1, 5, n).astype(np.uint64)
    fp = np.stack([state, rng.integers(0, 3, n).astype(np.uint64)], axis=1)
    after = rng.integers(1, 5, n).astype(np.uint64)
    reward = np.where((np.arange(n) % 5 == 4) & (rng.random(n) < 0.5), 10.0, 0.0)
    config = AdvantageConfig(estimator="hgpo", step_return="graph", gamma=0.1)
    rollouts = group * 6 + traj
    expected = hgpo_advantages(graph_returns(reward, rollouts, group, state, after, 0.1), group, fp)
    np.testing.assert_array_equal(compute_advantages(reward, traj, group, fp, None, config, after), expected)
    discounted = hgpo_advantages(step_returns(reward, rollouts, 0.95), group, fp)
    assert not np.allclose(expected, discounted)
    # graphgpo with discounted returns is GiGPO with an episode weight
    gigpo = compute_advantages(reward, traj, group, fp, None, AdvantageConfig(estimator="gigpo"))
    swapped = AdvantageConfig(estimator="graphgpo", step_return="discounted")
    np.testing.assert_array_equal(compute_advantages(reward, traj, group, fp, None, swapped), gigpo)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"estimator": "grpo", "step_return": "graph"}, "grpo credits the episode score"),
        ({"step_return": "distance"}, "unknown step_return"),
        ({"estimator": "graph"}, "unknown estimator"),
    ],
)
def test_config_errors(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        AdvantageConfig(**kwargs)


def test_graph_returns_need_next_states() -> None:
    with pytest.raises(ValueError, match="next-state key"):
        compute_advantages([0.0], [0], [0], [[1]], None, AdvantageConfig(estimator="graphgpo"))
    with pytest.raises(ValueError, match="normalize_distance needs gamma > 0"):
        graph_returns([0.0], [0], [0], [1], [1], gamma=0.0, normalize_distance=True)
