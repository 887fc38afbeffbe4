"""Task panels (hgpo_env.tools.panel) and the metrics evaluation reports on them (pass@k)."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys

import numpy as np
import pytest

from hgpo_env.tools.panel import SHIPPED, Panel, PanelError, build_panel, panel_from_episodes
from hgpo_train.evaluation.evaluate import EpisodeResult, EvalResult, pass_at_k


def rooms_panel(**kwargs) -> Panel:
    return build_panel("HGPO-Rooms-v0", "eval", range(6), kwargs or None)


def test_a_panel_names_its_tasks_by_key_and_its_hash_is_the_same_everywhere():
    panel = rooms_panel()
    assert panel.task_ids == tuple(range(6)) and len(set(panel.task_keys)) == 6
    command = [sys.executable, "-m", "hgpo_env", "panel", "HGPO-Rooms-v0", "eval", "--tasks", "6"]
    printed = json.loads(subprocess.run(command, capture_output=True, text=True, check=True).stdout)
    assert printed["sha256"] == panel.hash and printed["size"] == 6  # another process, the same panel
    assert Panel.from_json(printed) == panel
    assert rooms_panel(max_rooms=3).hash != panel.hash  # other tasks under the same ids


def test_drifted_and_edited_panels_are_refused_in_one_line():
    panel = rooms_panel()
    drifted = rooms_panel(max_rooms=3)
    with pytest.raises(
        PanelError, match=r"^task 0 is another task here than in the panel .*\d tasks differ\)$"
    ):
        panel.check(drifted)
    with pytest.raises(
        PanelError, match="the panel is HGPO-Rooms-v0 eval, this evaluation HGPO-Rooms-v0 train"
    ):
        panel.check(Panel("HGPO-Rooms-v0", "train", panel.task_ids, panel.task_keys))
    edited = panel.to_json()
    edited["tasks"][0][1] = "123"
    with pytest.raises(PanelError, match="sha256 does not match"):
        Panel.from_json(edited)


def test_an_unreadable_manifest_is_one_line(tmp_path):
    with pytest.raises(PanelError, match="not a panel manifest .FileNotFoundError"):
        Panel.load(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text('{"env_id": "x"}')
    with pytest.raises(PanelError, match="not a panel manifest .KeyError"):
        Panel.load(tmp_path / "bad.json")


def test_a_task_played_twice_in_one_pass_or_changing_between_episodes_is_refused():
    with pytest.raises(PanelError, match="tasks 0 and 2 are the same task"):
        Panel("env", "eval", (0, 1, 2), (7, 8, 7))
    with pytest.raises(PanelError, match="task 1 was two different tasks"):
        panel_from_episodes("env", "eval", [0, 1], [(0, 5), (1, 6), (1, 9)])
    with pytest.raises(PanelError, match=r"tasks \[1\] were not played"):
        panel_from_episodes("env", "eval", [0, 1], [(0, 5)])


SIZES = {"HGPO-ALFWorld-v0.valid_seen": 140, "HGPO-WebShop-v0.test": 500}
"""The published splits' sizes (ALFWorld's seen validation games, WebShop's test goals)."""


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_every_shipped_panel_is_what_its_env_plays_today(name, request, monkeypatch):
    """A package upgrade or a data version that changes the tasks fails here, not in a results table."""
    spec = SHIPPED[name]
    if spec.env_id == "HGPO-ALFWorld-v0":  # the games the walkthroughs' test compiled, if it ran
        monkeypatch.setenv("HGPO_DATA", str(request.getfixturevalue("alfworld_games_home")))
    kwargs = {"data_path": request.getfixturevalue("shared_data") / spec.data} if spec.data else {}
    built = build_panel(spec.env_id, spec.split, range(spec.tasks) if spec.tasks else None, kwargs)
    shipped = Panel.load(name)  # by name, as eval.panel takes it
    shipped.check(built)
    assert shipped == Panel.load(spec.path) and len(shipped.task_ids) == SIZES.get(name, len(built.task_ids))


def test_every_env_id_has_a_shipped_panel():
    import gymnasium as gym

    shipped = {spec.env_id for spec in SHIPPED.values()}
    own_games = {"HGPO-TextWorld-v0"}  # plays the user's games: its panel is the user's to make
    whole = {"HGPO-Corridor-v0"}  # two tasks and no split (a memory test bed): every run plays both
    assert {env_id for env_id in gym.registry if env_id.startswith("HGPO-")} == shipped | own_games | whole


def brute_force_pass_at_k(wins: list[bool], k: int) -> float:
    """The share of k-subsets of the samples that hold a success."""
    subsets = list(itertools.combinations(wins, k))
    return sum(any(s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", [1, 2, 4, 5, 8])
def test_pass_at_k_is_the_chance_that_k_of_the_samples_hold_a_success(n):
    rng = np.random.default_rng(n)
    for _ in range(10):
        wins = list(rng.random(n) < rng.random())
        for k in range(1, n + 1):
            assert pass_at_k(n, sum(wins), k) == pytest.approx(brute_force_pass_at_k(wins, k), abs=1e-12)


def test_one_success_in_four_samples():
    """Unbiased: pass@1 0.25, pass@2 0.5, pass@4 1 (verl's best@k bootstrap reads 0.684 for @4)."""
    assert [pass_at_k(4, 1, k) for k in (1, 2, 3, 4)] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    with pytest.raises(ValueError, match="1 <= k <= n"):
        pass_at_k(4, 1, 5)


def test_the_metrics_agree_with_each_other():
    """pass@1 is the success rate; the per-type table, weighted by episodes, sums to it."""
    rng = np.random.default_rng(0)
    episodes = [
        EpisodeResult(task, seed, "t", ("a", "b", "c")[task % 3], bool(rng.random() < 0.4), 0.0, 3, str(task))
        for seed in range(4)
        for task in range(9)
    ]
    metrics = EvalResult(episodes).metrics()
    counts = {t: sum(e.task_type == t for e in episodes) for t in "abc"}
    weighted = sum(metrics[f"success_rate/{t}"] * counts[t] for t in "abc") / len(episodes)
    assert weighted == pytest.approx(metrics["success_rate"])
    by_task = {t: [e.won for e in episodes if e.task_id == t] for t in range(9)}
    assert metrics["pass@4"] == pytest.approx(np.mean([any(w) for w in by_task.values()]))
    assert metrics["pass@2"] == pytest.approx(
        np.mean([brute_force_pass_at_k(w, 2) for w in by_task.values()])
    )
    assert "pass@8" not in metrics  # 4 samples per task
