"""G2PO equals its authors' code; its rules, checked by hand.

``tests/data/g2po_golden.json`` holds batches run through the authors' own functions
(Nala-YN/G2PO @ 55d811a, ``g2po/core_g2po.py``: ``compute_group_aggregation_values`` then
``compute_g2po_outcome_advantage``, with torch's default dtype float64 so that their float32
accumulator does not round), with the trainer's invalid penalty (0.1) subtracted from the
token-level rewards as verl-agent does. The cases cover self-loops and revisited states,
interleaved rollouts, invalid actions, groups without success, episode rewards other than the
success constant, a reward before the last step, both modes and two step weights. Only the data
is committed, not their code.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hgpo_train.advantage import AdvantageConfig, compute_advantages, g2po_advantages

GOLDEN = json.loads((Path(__file__).parent / "data" / "g2po_golden.json").read_text())["cases"]


def run(case: dict) -> np.ndarray:
    rows = case["rows"]
    config = AdvantageConfig(estimator="g2po", **case["settings"])  # the settings are its field names
    states = np.array([int(x) for x in rows["state"]], dtype=np.uint64)
    return compute_advantages(rows["reward"], rows["traj"], rows["group"], states, rows["invalid"], config)


@pytest.mark.parametrize("case", GOLDEN, ids=lambda c: f"{len(c['advantages'])}rows-{c['settings']['mode']}")
def test_g2po_equals_the_authors_code(case: dict) -> None:
    np.testing.assert_allclose(run(case), case["advantages"], rtol=0, atol=1e-9)


def test_the_cases_cover_what_matters() -> None:
    assert {c["settings"]["mode"] for c in GOLDEN} == {"mean_norm", "mean_std_norm"}
    assert len({c["settings"]["step_weight"] for c in GOLDEN}) == 2
    interleaved = no_success = self_loops = invalid = off_constant = 0
    for case in GOLDEN:
        rows = case["rows"]
        group, traj, reward = np.array(rows["group"]), np.array(rows["traj"]), np.array(rows["reward"])
        rollout = group * 1000 + traj
        interleaved += bool((np.diff(rollout) != 0).sum() > len(set(rollout)) - 1)
        episode = {key: reward[rollout == key].sum() for key in set(rollout.tolist())}
        no_success += sum(
            all(episode[k] != 10 for k in episode if k // 1000 == g) for g in set(group.tolist())
        )
        off_constant += sum(value not in (0.0, 10.0) for value in episode.values())
        state = np.array(rows["state"])
        self_loops += int(((rollout[1:] == rollout[:-1]) & (state[1:] == state[:-1])).sum())
        invalid += int(np.sum(rows["invalid"]))
    assert interleaved >= 5 and no_success >= 3 and off_constant >= 5 and self_loops >= 10 and invalid >= 50


def test_a_worked_example() -> None:
    """A: s1 -> s2, won (E = 10); B: s1 -> s3, lost. mean_norm, step weight 1.

    Values: V(s1) = (0.95**2 * 10 + 0.95**2 * 0) / 2 = 4.5125, V(s2) = 0.95 * 10 = 9.5, V(s3) = 0.
    Episode term: [5, 5, -5, -5]. Within s1: next values 9.5 and 0, so +-4.75 (s2, s3 alone: 0).
    Gains: 9.5 - 4.5125, 10 - 9.5 (A's success terminal), 0 - 4.5125, 0 - 0; mean 0.24375."""
    advantages = g2po_advantages(
        rewards=[0, 10, 0, 0], traj_ids=[0, 0, 1, 1], group_ids=[0] * 4, states=[1, 2, 1, 3], mode="mean_norm"
    )
    gains = np.array([4.9875, 0.5, -4.5125, 0.0]) - 0.24375
    expected = np.array([5, 5, -5, -5]) + np.array([4.75, 0, -4.75, 0]) + gains
    np.testing.assert_allclose(advantages, expected, rtol=0, atol=1e-12)


def test_success_is_an_episode_reward_equal_to_the_constant() -> None:
    """Two one-step rollouts from one state: E = 10 reaches the success terminal (10), E = 10.5
    does not (0), as in the released code. V(s) = 0.95 * 10.25 = 9.7375."""
    advantages = g2po_advantages([10.0, 10.5], [0, 1], [0, 0], [7, 7], mode="mean_norm")
    episode = np.array([-0.25, 0.25])
    within = np.array([5.0, -5.0])  # next values 10 and 0
    gain = np.array([10 - 9.7375, -9.7375]) + 4.7375
    np.testing.assert_allclose(advantages, episode + within + gain, rtol=0, atol=1e-12)
    shifted = g2po_advantages([10.0, 10.5], [0, 1], [0, 0], [7, 7], mode="mean_norm", success_reward=10.5)
    # now the other one succeeds, and its terminal is worth 10.5: next values 0 and 10.5
    np.testing.assert_allclose(shifted, episode + 2 * np.array([-5.25, 5.25]), rtol=0, atol=1e-12)


def test_a_task_group_of_one_step_is_finite() -> None:
    """The released code gives NaN here under mean_std_norm (the unbiased std of one value); we
    give the gain term 0, as every other singleton, so one such row cannot poison a batch."""
    advantages = g2po_advantages([10.0, 0.0, 0.0], [0, 0, 1], [0, 0, 1], [1, 2, 1])
    assert np.isfinite(advantages).all()
    assert advantages[2] == pytest.approx(-0.0 / (1 + 1e-6))  # GRPO's singleton episode term, plus 0s


def test_rows_may_come_in_any_interleaving() -> None:
    case = GOLDEN[0]
    rows = case["rows"]
    order = np.lexsort((np.arange(len(rows["group"])), np.array(rows["traj"]), np.array(rows["group"])))
    shuffled = {key: [values[i] for i in order] for key, values in rows.items()}
    np.testing.assert_allclose(
        run({**case, "rows": shuffled}), np.array(case["advantages"])[order], atol=1e-12
    )


def test_step_return_does_not_apply() -> None:
    with pytest.raises(ValueError, match="g2po credits the value of the state a step leads to"):
        AdvantageConfig(estimator="g2po", step_return="graph")


def test_with_zero_one_rewards_a_win_is_a_win():
    """A verifiers-style batch (reward 1 for a win): the code's success test (E == 10) calls the
    win a loss, so the winning turn gets negative credit; given the env's won flag, as
    every trainer and integration passes it, G2PO reads success from it, as CRBC and MVPO do.
    A: s1 -> s2 -> won (E = 1); B: s1 -> s3 -> lost."""
    columns = ([0.0, 1.0, 0.0, 0.0], [0, 0, 1, 1], [0, 0, 0, 0], [1, 2, 1, 3])
    blind = g2po_advantages(*columns, mode="mean_norm")
    assert blind[1] < 0  # the code's test against 10: the win led to a terminal worth 0
    seen = g2po_advantages(*columns, mode="mean_norm", won=[0, 1, 0, 0])
    assert seen[1] > 0 > seen[3]
    ten = g2po_advantages([0.0, 10.0, 0.0, 0.0], *columns[1:], mode="mean_norm")
    scaled = g2po_advantages([0.0, 10.0, 0.0, 0.0], *columns[1:], mode="mean_norm", won=[0, 1, 0, 0])
    np.testing.assert_array_equal(scaled, ten)  # where the win is the only reward: the code's numbers
