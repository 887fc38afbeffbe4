"""The built-in Rooms env: API conformance, determinism, invalid commands, expert, hidden state."""

from __future__ import annotations

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import hgpo_env  # noqa: F401
from hgpo_env.envs.rooms import HELD_OUT_TASKS, Difficulty, RoomsEnv, generate_task


def test_gymnasium_check_env_passes_on_the_plain_env():
    check_env(RoomsEnv(), skip_render_check=True)


def test_make_returns_wrapped_env_with_plain_unwrapped():
    env = gym.make("HGPO-Rooms-v0", history_length=3, max_steps=7)
    assert isinstance(env.unwrapped, RoomsEnv) and env.unwrapped.max_steps == 7
    obs, info = env.reset(seed=0)
    assert obs.startswith(RoomsEnv.prompt_intro) and len(info["fingerprints"]) == 4


def test_same_task_id_same_world():
    assert generate_task(123) == generate_task(123)
    assert generate_task(123) != generate_task(124)


def test_split_keeps_held_out_tasks_out_of_training():
    train, evaluation = RoomsEnv(), RoomsEnv(split="eval")
    for seed in range(50):
        train.reset(seed=seed)
        evaluation.reset(seed=seed)
        assert train.task_id >= HELD_OUT_TASKS > evaluation.task_id


@pytest.mark.parametrize(
    "difficulty", [{}, {"min_rooms": 8, "max_rooms": 12, "max_task_items": 3, "lock_probability": 1.0}]
)
def test_expert_wins_every_task(difficulty):
    env = RoomsEnv(max_steps=200, **difficulty)
    types = set()
    for task_id in range(400):
        env.reset(options={"task_id": task_id})
        types.add(env.task_type)
        total = 0.0
        while True:
            _, reward, terminated, truncated, info = env.step(env.expert_action())
            assert info["action_valid"]
            total += reward
            if terminated or truncated:
                break
        assert terminated and info["won"] and total == env.success_reward, f"task {task_id}"
    assert len(types) >= 2


def test_invalid_commands_spend_a_step_and_change_nothing():
    env = RoomsEnv(max_steps=3)
    obs, info = env.reset(options={"task_id": 5})
    state = (env.room, dict(env.positions), env.unlocked)
    for bad in ("", "   ", "fly away", "take the moon", "go up"):
        env.reset(options={"task_id": 5})
        new_obs, reward, terminated, truncated, info = env.step(bad)
        assert new_obs == obs and reward == 0 and not info["action_valid"]
        assert (env.room, env.positions, env.unlocked) == state and env.elapsed_steps == 1
    env.reset(options={"task_id": 5})
    for _ in range(3):
        *_, terminated, truncated, _ = env.step("fly away")
    assert truncated and not terminated
    with pytest.raises(RuntimeError, match="episode is over"):
        env.step("look")


def test_commands_match_case_insensitively():
    env = RoomsEnv()
    env.reset(options={"task_id": 5})
    assert env.step("LOOK")[4]["action_valid"]


def _walk_out(env: RoomsEnv, carrying: bool) -> str:
    """The room text after leaving the start room, with or without first taking the item there."""
    for task_id in range(200):
        env.reset(options={"task_id": task_id})
        takes = [a for a in env.admissible_actions if a.startswith("take ")]
        goes = [a for a in env.admissible_actions if a.startswith("go ")]
        if takes and goes:
            break
    if carrying:
        env.step(takes[0])
    env.step(goes[0])
    assert env._carried() == ([takes[0][len("take ") :]] if carrying else [])
    return env.state_text


def test_hidden_state_makes_equal_observations_with_different_histories():
    """What the agent carries does not show in the room text: walking out of the start room with
    or without the item there reads the same, though the hidden state differs."""
    env = RoomsEnv()
    assert _walk_out(env, carrying=False) == _walk_out(env, carrying=True)


def test_show_carried_reveals_the_inventory_in_every_room_description():
    env = RoomsEnv(show_carried=True)
    empty_handed, carrying = _walk_out(env, carrying=False), _walk_out(env, carrying=True)
    assert empty_handed.endswith("You carry nothing.") and carrying.endswith(
        f"You carry: {env._carried()[0]}."
    )
    assert "end with what you carry" in env.prompt_intro and "not shown" in RoomsEnv().prompt_intro


def test_bad_options_raise_clearly():
    env = RoomsEnv()
    with pytest.raises(ValueError, match="task_id"):
        env.reset(options={"task_id": -1})
    with pytest.raises(ValueError, match="split"):
        RoomsEnv(split="test")
    with pytest.raises(ValueError, match="min_rooms"):
        Difficulty(min_rooms=1)
    with pytest.raises(RuntimeError, match="reset"):
        RoomsEnv().step("look")


def test_demo_command_plays_a_winning_episode(capsys):
    from hgpo_env.__main__ import main

    assert main(["demo", "--seed", "4", "--show-prompts", "1"]) == 0
    out = capsys.readouterr().out
    assert "----- prompt at step 1 -----" in out and "result: won" in out and "L2=0x" in out
