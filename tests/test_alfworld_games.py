"""Finding ALFWorld games: the official layout, splits, the stable list, and errors that name the file."""

from __future__ import annotations

import gc
import json
from pathlib import Path

import pytest

pytest.importorskip("alfworld")

from hgpo_env.envs.alfworld import ALFWorldEnv, GameDataError, evaluation_task_ids, list_games
from hgpo_env.envs.alfworld import games as games_module
from hgpo_env.envs.alfworld.env import split_opening


@pytest.fixture()
def real_game(shared_data: Path) -> dict:
    path = next((shared_data / "alfworld" / "valid_seen").rglob("game.tw-pddl"))
    return json.loads(path.read_text())


@pytest.fixture(autouse=True)
def private_data_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HGPO_DATA", str(tmp_path / "home"))


def _write(root: Path, relative: str, content: dict | str) -> Path:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


def _layout(root: Path, game: dict, split: str = "valid_seen") -> None:
    """Two games in the official layout (json_2.1.1 level, one with traj_data.json) and two skipped."""
    base = f"json_2.1.1/{split}"
    _write(root, f"{base}/pick_and_place_simple-Pen-None-Desk-1/trial_b/game.tw-pddl", game)
    _write(root, f"{base}/pick_and_place_simple-Pen-None-Desk-1/trial_a/game.tw-pddl", game)
    _write(root, f"{base}/odd-name/trial_c/game.tw-pddl", game)
    _write(root, f"{base}/odd-name/trial_c/traj_data.json", {"task_type": "pick_cool_then_place_in_recep"})
    _write(root, f"{base}/pick_and_place_with_movable_recep-Pen-Bowl-Desk-1/trial_d/game.tw-pddl", game)
    _write(root, f"{base}/pick_heat_then_place_in_recep-AppleSliced-None-Desk-1/trial_e/game.tw-pddl", game)
    _write(
        root, f"{base}/look_at_obj_in_light-Pen-None-DeskLamp-1/trial_f/traj_data.json", {"task_type": "x"}
    )


def test_official_layout_with_and_without_traj_data(tmp_path: Path, real_game: dict) -> None:
    _layout(tmp_path, real_game)
    games = list_games(tmp_path, "valid_seen")
    names = [g.path.relative_to(tmp_path / "json_2.1.1" / "valid_seen").as_posix() for g in games]
    assert names == [
        "odd-name/trial_c/game.tw-pddl",
        "pick_and_place_simple-Pen-None-Desk-1/trial_a/game.tw-pddl",
        "pick_and_place_simple-Pen-None-Desk-1/trial_b/game.tw-pddl",
    ]
    assert [g.task_type for g in games] == ["pick_cool_then_place_in_recep", *["pick_and_place_simple"] * 2]
    assert list_games(tmp_path / "json_2.1.1", "valid_seen") == games  # the json_2.1.1 level is optional


def test_the_env_plays_a_layout_folder(tmp_path: Path, real_game: dict) -> None:
    _layout(tmp_path, real_game)
    env = ALFWorldEnv(split="valid_seen", data_path=tmp_path, disk_cache=False)
    assert env.num_tasks == 3
    _, info = env.reset(options={"task_id": 0})
    assert info["task_type"] == "pick_cool_then_place_in_recep" and info["data_source"] == "official"
    with pytest.raises(ValueError, match="out of range"):
        env.reset(options={"task_id": 3})


def test_missing_split_names_the_folder_and_archive(tmp_path: Path) -> None:
    (tmp_path / "train.tgz").write_bytes(b"")
    with pytest.raises(GameDataError, match=r"missing split 'train'.*train\.tgz: unpack it"):
        list_games(tmp_path, "train")
    with pytest.raises(GameDataError, match="data_path is not a folder"):
        ALFWorldEnv(split="train", data_path=tmp_path / "nope")
    with pytest.raises(ValueError, match="split must be one of"):
        list_games(tmp_path, "test")


def test_bad_json_and_missing_keys_name_the_file(tmp_path: Path, real_game: dict) -> None:
    bad = _write(tmp_path, "valid_seen/pick_and_place_simple-A-None-B-1/trial_1/game.tw-pddl", "{not json")
    with pytest.raises(GameDataError, match=f"{bad}: not valid JSON"):
        list_games(tmp_path, "valid_seen")
    _write(bad.parent, "game.tw-pddl", {"pddl_domain": "", "solvable": True})
    with pytest.raises(GameDataError, match=f"{bad}: missing key.*grammar, pddl_problem"):
        list_games(tmp_path, "valid_seen")
    _write(bad.parent, "traj_data.json", "[1, 2")
    _write(bad.parent, "game.tw-pddl", real_game)
    with pytest.raises(GameDataError, match="traj_data.json: not a valid trajectory JSON"):
        list_games(tmp_path, "valid_seen")


def test_unsolvable_games_are_skipped_or_reported(tmp_path: Path, real_game: dict) -> None:
    _write(tmp_path, "valid_seen/pick_and_place_simple-A-None-B-1/trial_1/game.tw-pddl", real_game)
    path = _write(
        tmp_path,
        "valid_seen/pick_and_place_simple-A-None-B-1/trial_2/game.tw-pddl",
        {**real_game, "solvable": False},
    )
    assert len(list_games(tmp_path, "valid_seen")) == 1
    with pytest.raises(GameDataError, match=f"{path}: marked unsolvable"):
        list_games(tmp_path, "valid_seen", skip_unsolvable=False)
    path.unlink()
    (tmp_path / "valid_seen" / "pick_and_place_simple-A-None-B-1" / "trial_1" / "game.tw-pddl").unlink()
    with pytest.raises(GameDataError, match="no playable game.tw-pddl games"):
        list_games(tmp_path, "valid_seen")


def test_a_broken_game_fails_at_reset_naming_the_file(tmp_path: Path, real_game: dict) -> None:
    path = _write(
        tmp_path,
        "valid_seen/pick_and_place_simple-A-None-B-1/trial_1/game.tw-pddl",
        {**real_game, "pddl_problem": "(define (problem broken"},
    )
    env = ALFWorldEnv(split="valid_seen", data_path=tmp_path, disk_cache=False)
    with pytest.raises(GameDataError, match=f"{path}: cannot load the game"):
        env.reset(options={"task_id": 0})
    assert gc.isenabled()  # the translator's pause of the cycle collector ends on failure too
    gc.disable()  # and a collector the user turned off stays off
    try:
        with pytest.raises(GameDataError):
            env.reset(options={"task_id": 0})
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_listing_is_cached_until_a_file_changes(
    tmp_path: Path, real_game: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    _layout(tmp_path, real_game)
    first = list_games(tmp_path, "valid_seen")
    monkeypatch.setattr(games_module, "_SCANNED", {})  # a new process: only the index file is left
    monkeypatch.setattr(games_module, "read_game", lambda path: pytest.fail(f"re-read {path}"))
    assert list_games(tmp_path, "valid_seen") == first
    monkeypatch.undo()
    monkeypatch.setenv("HGPO_DATA", str(tmp_path / "home"))
    _write(
        tmp_path,
        "json_2.1.1/valid_seen/pick_two_obj_and_place-Pen-None-Desk-1/trial_z/game.tw-pddl",
        real_game,
    )
    assert len(list_games(tmp_path, "valid_seen")) == 4


def test_task_type_filter_and_evaluation_ids(tmp_path: Path, real_game: dict) -> None:
    _layout(tmp_path, real_game)
    assert len(list_games(tmp_path, "valid_seen", ["pick_cool_then_place_in_recep"])) == 1
    with pytest.raises(ValueError, match="unknown task type"):
        list_games(tmp_path, "valid_seen", ["cook_dinner"])
    assert list(evaluation_task_ids(5)) == [0, 1, 2, 3, 4]
    assert list(evaluation_task_ids(5, 1, 2)) == [1, 3]


def test_opening_text_splits_into_task_and_room() -> None:
    task, room = split_opening("-= Welcome =-\n\nYou see a desk 1.\n\nYour task is to: put a pen in desk.")
    assert (task, room) == ("put a pen in desk.", "You see a desk 1.")
    with pytest.raises(ValueError, match="no 'Your task is to:' line"):
        split_opening("-= Welcome =-\n\nYou see a desk 1.")
