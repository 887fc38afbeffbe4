"""The embedded default: generated ALFWorld-format games of all six types, solvable and won by their plan."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("alfworld")

import alfworld.gen.constants as alfred
import gymnasium

import hgpo_env  # noqa: F401 (registers the ids)
from hgpo_env.envs.alfworld import TASK_TYPES, ALFWorldEnv
from hgpo_env.envs.alfworld.compiled import CompileCache, GameSource
from hgpo_env.envs.alfworld.engine import Engine
from hgpo_env.envs.alfworld.generator import generate_game, planner_solves


@pytest.fixture(scope="module")
def generated() -> dict[str, object]:
    engine = Engine(CompileCache(None))
    games = {task_type: generate_game(task_type, "train", 0, engine) for task_type in TASK_TYPES}
    engine.close()
    return games


@pytest.fixture()
def isolated_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No official data anywhere: a fresh data home, no $ALFWORLD_DATA, an empty ~/.cache."""
    monkeypatch.setenv("HGPO_DATA", str(tmp_path / "hgpo"))
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)  # a set variable must point at data
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path / "hgpo"


@pytest.mark.parametrize("task_type", TASK_TYPES)
def test_each_type_is_solvable_and_won_by_its_plan(generated: dict, task_type: str) -> None:
    made = generated[task_type]
    assert made.folder.startswith(f"{task_type}-") and made.game["solvable"] is True
    source = GameSource(made.game["pddl_domain"], made.game["grammar"], made.game["pddl_problem"])
    assert planner_solves(source)
    engine = Engine(CompileCache(None))
    opening = engine.start(source)
    assert "Your task is to: " in opening and not engine.won
    for command in made.game["walkthrough"]:
        assert command in engine.commands and not engine.won
        engine.step(command)
    assert engine.won
    engine.close()


def test_games_use_alfworlds_vocabulary_and_are_deterministic(generated: dict) -> None:
    for made in generated.values():
        kinds = {
            line.split("Type - ")[0] for line in made.game["pddl_problem"].splitlines() if "Type - " in line
        }
        assert kinds <= set(alfred.OBJECTS) | {"SinkBasin", "BathtubBasin"}
        assert made.traj["scene"]["scene_num"] in alfred.TRAIN_SCENE_NUMBERS
    engine = Engine(CompileCache(None))
    again = generate_game("pick_two_obj_and_place", "train", 0, engine)
    engine.close()
    assert again == generated["pick_two_obj_and_place"]


def test_env_falls_back_to_generated_games_and_says_so(isolated_home: Path) -> None:
    with pytest.warns(UserWarning, match="NOT the ALFWorld benchmark"):
        env = gymnasium.make("HGPO-ALFWorld-v0", split="valid_unseen", response_format="plain")
    plain = env.unwrapped
    assert plain.data.path.is_relative_to(isolated_home) and plain.num_tasks == 12
    assert {game.task_type for game in plain.games} == set(TASK_TYPES)
    scenes = {int(game.path.parent.parent.name.rsplit("-", 1)[1]) for game in plain.games}
    assert scenes <= set(alfred.TEST_SCENE_NUMBERS)  # unseen rooms: none of them is a training scene
    for task_id in range(plain.num_tasks):
        _, info = env.reset(options={"task_id": task_id})
        assert info["data_source"] == "generated"
        for command in plain.walkthrough:
            *_, info = env.step(command)
        assert info["won"]
    with pytest.warns(UserWarning, match="NOT the ALFWorld benchmark"):  # every env says so
        again = ALFWorldEnv(split="valid_unseen")
    assert again.games == plain.games  # the split was reused, not generated again
    manifest = json.loads((plain.data.path / "GENERATED.json").read_text())
    assert manifest["benchmark"] is False
