"""hgpo_train.run.diagnostics on hand-built batches with known answers."""

from __future__ import annotations

import numpy as np
import pytest

from hgpo_train.advantage import AdvantageConfig, step_returns
from hgpo_train.rollout.batch import Episodes, StepBatch
from hgpo_train.run.diagnostics import (
    SIZE_BINS,
    credit_metrics,
    grouping_diagnostics,
    plot_grouping,
    zero_credit_metrics,
)

# The worked example of HGPO_SPEC.md: one group, K = 1
S, X, Y, SX, SY = 11, 22, 33, 1122, 1133
GROUPS = [0] * 6
FPS = [(S, 0), (X, SX), (S, 0), (X, SX), (S, 0), (Y, SY)]
RETURNS = [1.0, 2.0, 0.0, 0.0, 3.0, 3.0]


def test_worked_example_levels():
    m = grouping_diagnostics(GROUPS, FPS, RETURNS, mode="mean_norm")
    assert m["grouping/rows"] == 6 and m["grouping/levels"] == 2
    # level 0: clusters S (3 rows), X (2), Y (1)
    assert m["grouping/level0/missing_share"] == 0
    assert m["grouping/level0/singleton_share"] == pytest.approx(1 / 6)
    assert m["grouping/level0/grouped_share"] == pytest.approx(5 / 6)
    assert m["grouping/level0/clusters"] == 3
    assert m["grouping/level0/cluster_size_mean"] == 2
    assert m["grouping/level0/cluster_size_p50"] == 2
    assert m["grouping/level0/cluster_size_max"] == 3
    assert m["grouping/level0/size_hist/1"] == pytest.approx(1 / 6)
    assert m["grouping/level0/size_hist/2"] == pytest.approx(2 / 6)
    assert m["grouping/level0/size_hist/3-4"] == pytest.approx(3 / 6)
    assert m["grouping/level0/size_hist/17+"] == 0
    # level 1: rows 0, 2, 4 have no predecessor; (S,X) holds rows 1, 3; (S,Y) only row 5
    assert m["grouping/level1/missing_share"] == pytest.approx(3 / 6)
    assert m["grouping/level1/singleton_share"] == pytest.approx(1 / 6)
    assert m["grouping/level1/grouped_share"] == pytest.approx(2 / 6)
    assert m["grouping/level1/clusters"] == 2
    # items: level 0 gives rows 0-4 a non-zero item, level 1 rows 1 and 3
    assert m["grouping/level0/nonzero_share"] == pytest.approx(5 / 6)
    assert m["grouping/level1/nonzero_share"] == pytest.approx(2 / 6)
    assert m["grouping/any_nonzero_share"] == pytest.approx(5 / 6)
    # every level-0 cluster holds one context: S always at step 0, X always after S
    assert m["grouping/context_inconsistency"] == 0
    assert all(isinstance(v, float) for v in m.values())


def test_shares_partition_rows_and_histogram_sums():
    m = grouping_diagnostics(GROUPS, FPS)
    for k in range(2):
        p = f"grouping/level{k}/"
        assert m[p + "missing_share"] + m[p + "singleton_share"] + m[p + "grouped_share"] == pytest.approx(1)
        assert m[p + "missing_share"] + sum(m[f"{p}size_hist/{b}"] for b in SIZE_BINS) == pytest.approx(1)
    assert "grouping/level0/nonzero_share" not in m  # needs returns


def test_context_inconsistency_revisit_and_short_history():
    # rollout a: S, X, S (revisits S after X); rollout b: S, Y. K = 1.
    # level-0 cluster S = rows 0, 2, 3: contexts (S, -), (S, XS), (S, -): two contexts, mixed.
    fps = [(S, 0), (X, 12), (S, 21), (S, 0), (Y, 13)]
    m = grouping_diagnostics([0] * 5, fps)
    assert m["grouping/context_inconsistency"] == pytest.approx(3 / 5)
    assert m["grouping/level1/context_mixed_share"] == 0  # the deepest level cannot mix
    # split by task group, rollout b's S is no longer in that cluster: only rows 0 and 2 mix
    m = grouping_diagnostics(["a", "a", "a", "b", "b"], fps)
    assert m["grouping/context_inconsistency"] == pytest.approx(2 / 5)
    assert m["grouping/level0/singleton_share"] == pytest.approx(3 / 5)


def test_context_uses_the_whole_window_and_missing_level0_is_consistent():
    # K = 2: rows 0, 1 share levels 0 and 1 but differ at level 2; row 2 has no level 0
    fps = [(5, 6, 7), (5, 6, 8), (0, 0, 0)]
    m = grouping_diagnostics([1, 1, 1], fps)
    assert m["grouping/context_inconsistency"] == pytest.approx(2 / 3)
    assert m["grouping/level1/context_mixed_share"] == pytest.approx(2 / 3)
    assert m["grouping/level2/context_mixed_share"] == 0
    assert m["grouping/level0/missing_share"] == pytest.approx(1 / 3)


def test_empty_batch():
    assert grouping_diagnostics([], []) == {"grouping/rows": 0.0, "grouping/levels": 1.0}


@pytest.mark.parametrize("source", ["metrics", "arrays"])
def test_plot_grouping_writes_png(tmp_path, source):
    pytest.importorskip("matplotlib")
    arg = grouping_diagnostics(GROUPS, FPS, RETURNS) if source == "metrics" else (GROUPS, FPS, RETURNS)
    path = plot_grouping(arg, tmp_path / "grouping.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_logged_grouping_describes_the_returns_the_update_used():
    """Under graphgpo the update credits graph returns: rows B0 and C0 share state s1 and both
    earn 0 discounted (an all-zero cluster: no kept item), but lead to states 3 and 1 steps from
    success, so their graph returns differ and both get items. A: s0 -> s2 -> won; B: s1 -> s4;
    C: s1 -> s2 (both lost). Distances: s2 1, s0 and s1 2, s4 none (3)."""
    s0, s1, s2, s4 = 10, 11, 12, 14
    n = 4
    empty = np.zeros(0)
    batch = StepBatch(
        group_id=np.zeros(n, np.int64),
        traj_id=np.array([0, 0, 1, 2]),
        step=np.array([0, 1, 0, 0]),
        reward=np.array([0.0, 10.0, 0.0, 0.0]),
        invalid=np.zeros(n, bool),
        fingerprints=np.array([[s0], [s2], [s1], [s1]], np.uint64),
        next_state=np.array([s2, 99, s4, s2], np.uint64),
        action_key=np.ones(n, np.uint64),
        outcome=np.array(["won", "won", "lost", "lost"]),
        prompt_ids=[np.zeros(1, np.int32)] * n,
        response_ids=[np.zeros(1, np.int32)] * n,
        choices=[None] * n,
        episodes=Episodes(empty, empty, [], [], empty, empty, empty, empty, empty, empty, empty),
    )
    config = AdvantageConfig(estimator="graphgpo", gamma=0.1, mode="mean_norm")
    credit = batch.credit(config)
    np.testing.assert_allclose(credit.returns, [1.0, 10.0, 0.01, 1.0])  # 10 * 0.1 ** distance
    metrics = credit_metrics(batch, credit, config)
    assert metrics["grouping/level0/nonzero_share"] == pytest.approx(0.5)
    discounted = step_returns(batch.reward, batch.traj_id, 0.1, batch.invalid)
    assert grouping_diagnostics(batch.group_id, batch.fingerprints, discounted, config.mode)[
        "grouping/level0/nonzero_share"
    ] == pytest.approx(0.0)  # what the logs described before
    assert metrics["advantage/std"] == pytest.approx(float(credit.advantages.std()))


def aliased_batch() -> StepBatch:
    """Two rollouts reach state B by different routes (A then B, C then B); the same action at B
    leads to D in one and E in the other, so B's key hides state. Level 1 tells them apart."""
    a, b, c, d, e, use, go = 1, 2, 3, 4, 5, 7, 8
    n = 4
    empty = np.zeros(0)
    return StepBatch(
        group_id=np.zeros(n, np.int64),
        traj_id=np.array([0, 0, 1, 1]),
        step=np.array([0, 1, 0, 1]),
        reward=np.array([0.0, 10.0, 0.0, 0.0]),
        invalid=np.zeros(n, bool),
        fingerprints=np.array([[a, 0], [b, 100], [c, 0], [b, 200]], np.uint64),
        next_state=np.array([b, d, b, e], np.uint64),
        action_key=np.array([go, use, go, use], np.uint64),
        outcome=np.array(["won", "won", "lost", "lost"]),
        prompt_ids=[np.zeros(1, np.int32)] * n,
        response_ids=[np.zeros(1, np.int32)] * n,
        choices=[None] * n,
        episodes=Episodes(empty, empty, [], [], empty, empty, empty, empty, empty, empty, empty),
    )


def test_the_logs_say_whether_the_keys_see_the_state_and_warn_once(capsys, monkeypatch):
    monkeypatch.setattr("hgpo_train.run.diagnostics._warned", set())
    batch = aliased_batch()
    for estimator in ("hgpo", "gigpo", "gigpo", "crbc"):
        config = AdvantageConfig(estimator=estimator)
        metrics = credit_metrics(batch, batch.credit(config), config)
        assert metrics["keys/level0/aliased_share"] == pytest.approx(2 / 4)  # B's two visits
        assert metrics["keys/level1/aliased_share"] == 0.0  # of the 2 rows showing level 1
        assert metrics["keys/merging/eligible_share"] == 0.0  # one action per key
    err = capsys.readouterr().err.splitlines()
    assert [line.split(":")[1].split()[0] for line in err] == ["gigpo", "crbc"]  # once each, not for hgpo
    assert "50% of visits went elsewhere" in err[0] and "python -m hgpo_env audit" in err[0]


def test_the_zero_credit_share_and_the_groups_that_ended_alike():
    """Three task groups: one all failed, one all won, one mixed; GRPO gives the first two no
    credit at all."""
    groups = np.array([0, 0, 0, 5, 5, 9, 9, 9])
    won = np.array([0, 0, 0, 1, 1, 1, 0, 0], bool)
    scores = np.where(won, 10.0, 0.0)
    from hgpo_train.advantage import grpo_advantages

    advantages = grpo_advantages(scores, groups)
    metrics = zero_credit_metrics(groups, won, advantages)
    assert metrics == {
        "advantage/exact_zero_share": 5 / 8,
        "rollout/identical_outcome_groups": 2 / 3,
        "rollout/all_fail_groups": 1 / 3,
    }
