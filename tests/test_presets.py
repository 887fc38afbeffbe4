"""The presets over third-party text envs, against the real packages (TextWorld, TextWorld-Express,
ScienceWorld, minigrid's BabyAI, TextArena): Gymnasium's checker, the contract health check, an
expert or a solver that wins, and what each preset promises of its package's quirks."""

from __future__ import annotations

import re
import subprocess
import sys

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import hgpo_env  # noqa: F401  (registers the ids)
from hgpo_env.tools.check import check_env_health


@pytest.fixture(scope="module")
def textworld_games(tmp_path_factory):
    """Three small games made offline with TextWorld's own generator."""
    import textworld
    from textworld.generator import compile_game, make_game

    folder = tmp_path_factory.mktemp("tw_games")
    for seed in (1, 2, 3):
        options = textworld.GameOptions()
        options.seeds, options.nb_rooms, options.nb_objects, options.quest_length = seed, 2, 4, 2
        options.path = str(folder / f"game{seed}.z8")
        compile_game(make_game(options), options)
    return folder


def preset_kwargs(env_id, textworld_games):
    return {
        "HGPO-TextWorld-v0": {"games": str(textworld_games)},
        "HGPO-TextWorldExpress-v0": {"game": "coin", "game_params": "numLocations=3,includeDoors=1"},
        "HGPO-ScienceWorld-v0": {"task": "find-living-thing"},
        "HGPO-BabyAI-v0": {"level": "BabyAI-GoToLocal-v0"},
        "HGPO-TextArena-v0": {"game": "TowerOfHanoi-v0"},
    }[env_id]


PRESETS = [
    "HGPO-TextWorld-v0",
    "HGPO-TextWorldExpress-v0",
    "HGPO-ScienceWorld-v0",
    "HGPO-BabyAI-v0",
    "HGPO-TextArena-v0",
]
JAVA = {"HGPO-TextWorldExpress-v0", "HGPO-ScienceWorld-v0"}


@pytest.mark.parametrize("env_id", PRESETS)
def test_gymnasium_checker_and_the_contract_health_check(env_id, textworld_games):
    kwargs = preset_kwargs(env_id, textworld_games)
    env = gym.make(env_id, **kwargs)
    try:
        check_env(env.unwrapped, skip_render_check=True)
    finally:
        env.close()
    size = 2 if env_id in JAVA else 3  # a JVM per env: keep the Java presets' check small
    report = check_env_health(env_id, {**kwargs, "max_steps": 12}, groups=size, group_size=size)
    assert report.ok, report.format()
    assert not report.warnings, report.format()
    assert report.levels[0].repeated > 0, report.format()  # states recur within groups


@pytest.mark.parametrize("env_id", PRESETS)
def test_task_keys_name_each_task_from_what_the_package_exposes(env_id, textworld_games):
    """One key per task, the same for a second instance, on every step; different tasks differ."""
    kwargs = preset_kwargs(env_id, textworld_games)
    first, second = gym.make(env_id, **kwargs), gym.make(env_id, **kwargs)
    try:
        keys = [first.reset(seed=0, options={"task_id": t})[1]["task_key"] for t in (0, 1, 2)]
        again = second.reset(seed=9, options={"task_id": 1})[1]
        *_, info = second.step(again["admissible_actions"][0] if again["admissible_actions"] else "look")
    finally:
        first.close(), second.close()
    assert again["task_key"] == keys[1] == info["task_key"] and len(set(keys)) == 3


def play(env, commands_for, task_id, response=lambda c: f"<think>ok</think><action>{c}</action>"):
    """Play one episode choosing commands with ``commands_for(env, info)``; the last step's result."""
    _, info = env.reset(options={"task_id": task_id})
    rewards, valid = [], []
    while True:
        _, reward, terminated, truncated, info = env.step(response(commands_for(env, info)))
        rewards.append(reward)
        valid.append(info["action_valid"])
        if terminated or truncated:
            return info, rewards, valid, terminated


def expert(env, info):
    return env.unwrapped.expert_action()


def test_textworld_expert_wins_and_no_status_bar_reaches_the_prompt(textworld_games):
    env = gym.make("HGPO-TextWorld-v0", games=textworld_games, history_length=2)
    assert env.unwrapped.num_tasks == 3
    for task_id in range(3):
        prompt, info = env.reset(options={"task_id": task_id})
        assert "$$$$" not in prompt and info["task"] in prompt  # no banner; the objective is the task
        while True:
            prompt, reward, terminated, truncated, info = env.step(f"<action>{expert(env, info)}</action>")
            for text in (prompt, info["state_text"]):
                assert not re.search(r"=-\s*\d+/\d+", text), text  # the room/score/moves bar
            if terminated or truncated:
                break
        assert terminated and info["won"] and reward == 10.0
    env.close()


def test_textworld_needs_games():
    with pytest.raises(ValueError, match="games="):
        gym.make("HGPO-TextWorld-v0")
    with pytest.raises(FileNotFoundError):
        gym.make("HGPO-TextWorld-v0", games=["/no/such/game.z8"])


@pytest.mark.parametrize(
    ("game", "params"),
    [("coin", "numLocations=4"), ("cookingworld", "numLocations=2,numIngredients=1"), ("sorting", "")],
)
def test_textworld_express_gold_path_wins(game, params):
    env = gym.make("HGPO-TextWorldExpress-v0", game=game, game_params=params, max_steps=80)
    info, rewards, valid, terminated = play(env, expert, task_id=5)
    assert terminated and info["won"] and all(valid) and rewards[-1] == 10.0
    assert set(info["env_info"]) >= {"taskDescription", "validActions", "tasksuccess"}
    env.close()


def test_textworld_express_splits_are_its_seed_folds():
    train = gym.make("HGPO-TextWorldExpress-v0").unwrapped
    test = gym.make("HGPO-TextWorldExpress-v0", split="test").unwrapped
    assert train.num_tasks == len(train.seeds) > 0 and not set(train.seeds) & set(test.seeds)
    with pytest.raises(ValueError, match="game must be one of"):
        gym.make("HGPO-TextWorldExpress-v0", game="zork")
    train.close(), test.close()


def test_scienceworld_sends_commands_off_its_valid_list_and_reads_its_verdict():
    env = gym.make("HGPO-ScienceWorld-v0", task="find-living-thing", history_length=2)
    _, info = env.reset(options={"task_id": 0})
    assert info["admissible_actions"] == [] and info["task_type"] == "find-living-thing"
    off_list = []  # gold commands missing from the valid list of the moment they are sent
    while True:
        command = expert(env, info)
        if command not in info["env_info"]["valid"]:
            off_list.append(command)
        _, reward, terminated, truncated, info = env.step(f"<action>{command}</action>")
        assert info["action_valid"], command
        if terminated or truncated:
            break
    assert off_list and terminated and info["won"] and info["score"] == 100.0 and reward == 10.0
    env.reset(options={"task_id": 0})
    before = env.unwrapped.state_text
    _, _, _, _, info = env.step("<action>fly to the moon</action>")
    assert not info["action_valid"] and info["state_text"] == before
    env.close()


@pytest.mark.parametrize("level", ["BabyAI-GoToLocal-v0", "BabyAI-PickupLoc-v0", "BabyAI-OpenDoor-v0"])
def test_babyai_bot_replayed_through_the_wrapper_wins(level):
    from minigrid.utils.baby_ai_bot import BabyAIBot

    from hgpo_env.envs.babyai import COMMANDS

    env = gym.make("HGPO-BabyAI-v0", level=level, max_steps=200)
    for task_id in range(4):
        env.reset(options={"task_id": task_id})
        bot = BabyAIBot(env.unwrapped.env.unwrapped)
        while True:
            _, reward, terminated, truncated, info = env.step(f"<action>{COMMANDS[bot.replan()]}</action>")
            assert info["action_valid"]
            if terminated or truncated:
                break
        assert terminated and info["won"] and reward == 10.0, (level, task_id)


def test_babyai_text_places_objects_and_what_is_carried():
    import numpy as np
    from minigrid.core.constants import COLOR_TO_IDX, OBJECT_TO_IDX, STATE_TO_IDX
    from minigrid.core.world_object import Key

    from hgpo_env.envs.babyai import describe_view

    image = np.zeros((7, 7, 3), dtype=np.uint8)
    image[:, :, 0] = OBJECT_TO_IDX["empty"]
    image[3, 4] = (OBJECT_TO_IDX["ball"], COLOR_TO_IDX["red"], 0)  # 2 ahead
    image[5, 6] = (OBJECT_TO_IDX["door"], COLOR_TO_IDX["blue"], STATE_TO_IDX["locked"])  # 2 right
    image[3, 1] = (OBJECT_TO_IDX["wall"], 0, 0)  # 5 ahead
    text = describe_view(image, Key("green"))
    # nearest first, ties by steps forward
    assert text == (
        "You see a locked blue door 2 steps right. You see a red ball 2 steps forward. "
        "There is a wall 5 steps ahead. You carry a green key."
    )


def hanoi_moves(disks, source="A", target="C", spare="B"):
    if disks == 0:
        return []
    return [*hanoi_moves(disks - 1, source, spare, target), f"[{source} {target}]",
            *hanoi_moves(disks - 1, spare, target, source)]  # fmt: skip


def test_textarena_solved_hanoi_wins_and_invalid_moves_are_its_verdict():
    env = gym.make("HGPO-TextArena-v0", game="TowerOfHanoi-v0", history_length=2)
    prompt, info = env.reset(options={"task_id": 0})
    assert "Admissible actions" not in prompt and "Tower of Hanoi" in info["task"]
    _, _, terminated, _, info = env.step("<action>[C A]</action>")  # nothing on C: the game refuses
    assert not info["action_valid"] and not terminated
    moves = iter(hanoi_moves(3))
    info, rewards, valid, terminated = play(env, lambda env, info: next(moves), task_id=0)
    assert terminated and info["won"] and all(valid) and rewards[-1] == 10.0 and len(rewards) == 7
    assert info["state_text"].startswith("Current Board") and "C: [3, 2, 1]" in info["state_text"]


def test_textarena_guess_the_number_free_form_binary_search_wins():
    env = gym.make("HGPO-TextArena-v0", game="GuessTheNumber-v0", response_format="plain")
    for task_id in range(3):
        low, high = 1, 20
        _, info = env.reset(options={"task_id": task_id})
        while True:
            guess = (low + high) // 2
            prompt, _, terminated, truncated, info = env.step(f"[{guess}]")
            if "higher" in prompt.rsplit("Current observation:", 1)[1].split("\n")[0]:
                low = guess + 1
            else:
                high = guess - 1
            if terminated or truncated:
                break
        assert info["won"], task_id


@pytest.mark.parametrize("isolate_rng", [True, False])
def test_textarena_2048_replays_the_same_with_other_games_stepping_between(isolate_rng):
    """2048 spawns tiles from the global ``random``; with private streams an env replays the same
    whatever else runs in the process (without them, this test sees the disturbance)."""

    def boards(interleave):
        env = gym.make("HGPO-TextArena-v0", game="2048-v0", response_format="plain", isolate_rng=isolate_rng)
        other = gym.make(
            "HGPO-TextArena-v0", game="2048-v0", response_format="plain", isolate_rng=isolate_rng
        )
        env.reset(options={"task_id": 4})
        other.reset(options={"task_id": 9})
        out = []
        for move in ["[up]", "[left]", "[down]", "[right]", "[up]", "[left]"]:
            out.append(env.step(move)[4]["state_text"])
            if interleave:
                _, _, terminated, truncated, _ = other.step("[right]")
                if terminated or truncated:
                    other.reset(options={"task_id": 9})
        return out

    assert (boards(False) == boards(True)) is isolate_rng


@pytest.mark.parametrize(
    ("module", "extra", "env_id"),
    [("minigrid", "babyai", "HGPO-BabyAI-v0"), ("textarena", "textarena", "HGPO-TextArena-v0"),
     ("scienceworld", "scienceworld", "HGPO-ScienceWorld-v0")],
)  # fmt: skip
def test_a_missing_extra_is_one_line_naming_it(module, extra, env_id):
    code = (
        f"import sys; sys.modules[{module!r}] = None\n"
        "import gymnasium as gym, hgpo_env\n"
        f"try:\n    gym.make({env_id!r})\nexcept ModuleNotFoundError as e:\n    print(e)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert f'pip install -e ".[{extra}]"' in out.stdout and out.stdout.count("\n") == 1, (
        out.stdout + out.stderr
    )
