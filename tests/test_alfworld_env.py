"""HGPO-ALFWorld-v0 on the real valid_seen games: walkthroughs win, text matches alfworld's own env."""

from __future__ import annotations

import multiprocessing
import os
import random
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("alfworld")

import fast_downward
import gymnasium

import hgpo_env  # noqa: F401 (registers the ids)
from hgpo_env.contract.info import RESET_KEYS
from hgpo_env.envs.alfworld import TASK_TYPES, ALFWorldEnv, evaluation_task_ids
from hgpo_env.envs.alfworld import env as env_module
from hgpo_env.envs.alfworld.compiled import CompileCache, GameSource
from hgpo_env.envs.alfworld.engine import Engine
from hgpo_env.envs.alfworld.games import read_game
from hgpo_env.envs.alfworld.reference import ReferenceEnv

VALID_SEEN_GAMES = 140


@pytest.fixture(scope="module")
def alfworld_data(shared_data: Path) -> Path:
    return shared_data / "alfworld"


def _make(data: Path, **kwargs: object) -> gymnasium.Env:
    kwargs = {
        "split": "valid_seen",
        "data_path": data,
        "response_format": "plain",
        "disk_cache": False,
        **kwargs,
    }
    return gymnasium.make("HGPO-ALFWorld-v0", **kwargs)


def _replay(data: Path, task_ids: list[int]) -> list[str]:
    """Play each game's walkthrough; return what went wrong (empty when every game was won). The
    games compiled go to the disk cache, where the shipped panel's test finds them."""
    env = _make(data, disk_cache=True)
    failures = []
    for task_id in task_ids:
        _, info = env.reset(options={"task_id": task_id})
        walkthrough = env.unwrapped.walkthrough
        for number, command in enumerate(walkthrough, 1):
            _, reward, terminated, truncated, info = env.step(command)
            last = number == len(walkthrough)
            if not info["action_valid"] or terminated != last or (reward == 10.0) != last or truncated:
                failures.append(
                    f"{info['game_file']}: step {number} {command!r} -> {env.unwrapped.observation!r}"
                )
                break
        else:
            if not info["won"]:
                failures.append(f"{info['game_file']}: walkthrough ended without a win")
    env.close()
    return failures


def test_walkthroughs_win_every_valid_seen_game(
    alfworld_data: Path, alfworld_games_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HGPO_DATA", str(alfworld_games_home))  # the forked workers' data home too
    workers = max(1, min(8, os.cpu_count() or 1))
    chunks = [list(range(VALID_SEEN_GAMES))[i::workers] for i in range(workers)]
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
        failures = [f for part in pool.map(_replay, [alfworld_data] * workers, chunks) for f in part]
    assert failures == []


def test_text_matches_alfworlds_own_env(alfworld_data: Path) -> None:
    env = _make(alfworld_data, check_admissible=False)
    plain = env.unwrapped
    assert plain.num_tasks == VALID_SEEN_GAMES
    picks = {plain.games[i].path.resolve(): i for i in range(3, VALID_SEEN_GAMES, 23)}
    reference = ReferenceEnv(list(picks))
    rng = random.Random(0)
    for _ in picks:
        ref_obs, ref_commands, game_file = reference.reset()
        _, info = env.reset(options={"task_id": picks[Path(game_file).resolve()]})
        assert plain.observation == ref_obs
        assert info["admissible_actions"] == [c for c in ref_commands if c != "help"]
        commands = []
        for command in plain.walkthrough:  # detours: random admissible commands, nonsense, help
            commands += [None] * rng.randint(0, 2) + [command]
        commands[0:0] = ["inventory", "dance with the fridge", "help", "look", "inventory"]
        for command in commands:
            command = command or rng.choice(ref_commands)
            ref_obs, ref_commands, ref_won = reference.step(command)
            *_, info = env.step(command)
            assert plain.observation == ref_obs, command
            assert info["admissible_actions"] == [c for c in ref_commands if c != "help"], command
            assert info["won"] == ref_won
            if ref_won:
                break
    reference.close()


def test_group_members_share_a_game_by_seed_or_task_id(alfworld_data: Path) -> None:
    envs = [_make(alfworld_data) for _ in range(3)]
    infos = [env.reset(seed=123)[1] for env in envs]
    assert len({info["game_file"] for info in infos}) == 1
    assert len({info["initial_fingerprint"] for info in infos}) == 1
    by_id = [env.reset(options={"task_id": 7})[1] for env in envs]
    assert {info["game_file"] for info in by_id} == {str(envs[0].unwrapped.games[7].path)}
    other = envs[0].reset(seed=124)[1]
    assert (
        other["initial_fingerprint"] != infos[0]["initial_fingerprint"]
        or other["game_file"] == infos[0]["game_file"]
    )


def test_fixed_evaluation_list_covers_the_split_once(alfworld_data: Path) -> None:
    env = ALFWorldEnv(split="valid_seen", data_path=alfworld_data, disk_cache=False)
    again = ALFWorldEnv(split="valid_seen", data_path=alfworld_data, disk_cache=False)
    assert env.games == again.games  # a stable order, whatever the file system lists first
    assert [g.path for g in env.games] == sorted((g.path for g in env.games), key=lambda p: p.as_posix())
    ids = [i for rank in range(3) for i in evaluation_task_ids(env.num_tasks, rank, 3)]
    assert sorted(ids) == list(range(VALID_SEEN_GAMES))
    assert len({env.games[i].path for i in ids}) == VALID_SEEN_GAMES
    assert {g.task_type for g in env.games} == set(TASK_TYPES)
    heat_only = ALFWorldEnv(
        split="valid_seen", data_path=alfworld_data, task_types=["pick_heat_then_place_in_recep"]
    )
    assert {g.task_type for g in heat_only.games} == {"pick_heat_then_place_in_recep"}
    with pytest.raises(ValueError, match="rank"):
        list(evaluation_task_ids(10, 3, 3))


def test_info_state_text_and_invalid_commands(alfworld_data: Path) -> None:
    env = _make(alfworld_data, max_steps=3)
    _, info = env.reset(options={"task_id": 0})
    assert set(RESET_KEYS) <= set(info)
    assert info["data_source"] == "official" and info["task_id"] == 0
    assert info["task_type"] in TASK_TYPES
    plain = env.unwrapped
    assert plain.observation.startswith("-= Welcome to TextWorld, ALFRED! =-")
    assert f"Your task is to: {info['task']}" in plain.observation
    assert info["state_text"].startswith("You are in the middle of a room.")
    assert "Your task is to" not in info["state_text"] and "Welcome" not in info["state_text"]
    assert "help" not in info["admissible_actions"]
    for response in ("help", "dance with the fridge", ""):
        _, reward, terminated, truncated, step_info = env.step(response)
        assert not step_info["action_valid"] and reward == 0.0
        assert step_info["state_text"] == info["state_text"] and plain.observation.startswith("-= Welcome")
    assert truncated and not terminated  # three invalid steps used up max_steps=3


def test_commands_reach_the_engine_without_admissibility_check(alfworld_data: Path) -> None:
    env = ALFWorldEnv(split="valid_seen", data_path=alfworld_data, check_admissible=False, disk_cache=False)
    env.reset(options={"task_id": 0})
    assert env.step("help")[4]["action_valid"]
    assert "Available commands:" in env.observation
    env.step("dance with the fridge")
    assert env.observation == "Nothing happens."
    assert env.state_text == "Nothing happens."


def test_engine_output_and_argv_stay_contained(
    alfworld_data: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    argv, snapshot = sys.argv, list(sys.argv)
    data = read_game(next((alfworld_data / "valid_seen").rglob("game.tw-pddl")))
    engine = Engine(CompileCache(None))  # nothing cached: the translator runs
    engine.start(GameSource(data["pddl_domain"], data["grammar"], data["pddl_problem"]))
    engine.step(data["walkthrough"][0])
    engine.close()
    assert sys.argv is argv and sys.argv == snapshot
    out, _ = capfd.readouterr()
    assert out == ""


def test_translation_runs_once_per_game(
    alfworld_data: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls = []
    translate = fast_downward.pddl2sas
    monkeypatch.setattr(fast_downward, "pddl2sas", lambda *a, **k: calls.append(1) or translate(*a, **k))
    monkeypatch.setenv("HGPO_DATA", str(tmp_path))

    def new_process_env() -> ALFWorldEnv:  # nothing compiled in memory, only what is on disk
        monkeypatch.setattr(env_module, "_CACHES", {})
        return ALFWorldEnv(split="valid_seen", data_path=alfworld_data, disk_cache=True)

    def play(env: ALFWorldEnv) -> list[str]:  # "inventory" first: it deletes and re-adds facts
        texts = [env.reset(options={"task_id": 5})[0]]
        return texts + [env.step(command)[0] for command in ["inventory", *env.walkthrough]]

    env = new_process_env()
    first = play(env)
    assert play(env) == first and len(calls) == 1
    stored = list((tmp_path / "alfworld" / "compiled").rglob("*.pkl.z"))
    assert len(stored) == 1
    assert play(new_process_env()) == first and len(calls) == 1  # a game loaded from disk plays the same
    first = first[0]
    stored[0].write_bytes(b"not a pickle")
    assert new_process_env().reset(options={"task_id": 5})[0] == first and len(calls) == 2  # recompiled


def test_expert_follows_the_walkthrough_until_the_agent_leaves_it(alfworld_data: Path) -> None:
    env = _make(alfworld_data)
    env.reset(options={"task_id": 3})
    plain = env.unwrapped
    assert plain.expert_action() == plain.walkthrough[0]
    env.step(plain.expert_action())
    assert plain.expert_action() == plain.walkthrough[1]
    env.step("look")  # a detour the walkthrough does not know
    with pytest.raises(RuntimeError, match="left the game's walkthrough"):
        plain.expert_action()
    env.close()


def test_random_walks_of_envs_sharing_a_process_and_games(alfworld_data: Path) -> None:
    """Several envs on the same games, stepped in turn with random admissible commands (as a pool
    worker does), never fail and stay identical to their twin on the same game."""
    envs = [_make(alfworld_data) for _ in range(6)]
    rng = random.Random(1)
    for round_ in range(2):
        for index, env in enumerate(envs):
            env.reset(options={"task_id": 10 * round_ + index // 2})
        for _ in range(15):
            for twin, other in zip(envs[::2], envs[1::2]):
                command = rng.choice(twin.unwrapped.admissible_actions)
                first, second = twin.step(command), other.step(command)
                assert first[0] == second[0] and first[4]["fingerprints"] == second[4]["fingerprints"]
    for env in envs:
        env.close()


_PLAY_IN_A_NEW_PROCESS = """
import json, sys
from hgpo_env.envs.alfworld import ALFWorldEnv
env = ALFWorldEnv(split="valid_seen", data_path=sys.argv[1], disk_cache=True)
texts = [env.reset(options={"task_id": 0})[0]]
texts += [env.step(command)[0] for command in ["inventory", *env.walkthrough]]
print(json.dumps([texts, env.won]))
"""


def test_games_cached_on_disk_play_the_same_in_another_process(alfworld_data: Path, tmp_path: Path) -> None:
    """The first process compiles and stores the game, the second loads it under another hash
    seed: cached objects must not carry the first process's string hashes."""
    import json
    import subprocess

    runs = []
    for hash_seed in ("1", "2"):
        env = {**os.environ, "HGPO_DATA": str(tmp_path), "PYTHONHASHSEED": hash_seed}
        out = subprocess.run(
            [sys.executable, "-c", _PLAY_IN_A_NEW_PROCESS, str(alfworld_data)],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    assert list((tmp_path / "alfworld" / "compiled").rglob("*.pkl.z"))
    assert runs[0] == runs[1] and runs[0][1] is True
