"""Milestones in ``info`` (:mod:`hgpo_env.contract.milestones`): what each env reports, checked against what
its own commands did (the walkthrough's, the expert's), not against recorded output."""

from __future__ import annotations

import dataclasses

import gymnasium as gym
import pytest
from byo_envs import SPEC, Dial

from hgpo_env import TextAdapter
from hgpo_env.contract.milestones import MILESTONES_KEY, SIGNATURE_KEY
from hgpo_env.tools.audit import audit_env


def flags_of(info: dict) -> dict[str, int]:
    return dict(zip(("m1", "m2", "m3", "success", "invalid"), info[MILESTONES_KEY]))


def test_alfworld_walkthroughs_fire_the_milestones_their_commands_earn(shared_data):
    env = gym.make("HGPO-ALFWorld-v0", split="valid_seen", data_path=shared_data / "alfworld").unwrapped
    assert env.milestones == ("target", "operation", "place", "success", "invalid")
    try:
        for task_id in range(0, len(env.games), 7):  # every task type, 20 games
            _, info = env.reset(options={"task_id": task_id})
            assert info[SIGNATURE_KEY] == "start|none|d0" and info[MILESTONES_KEY] == (0, 0, 0, 0, 0)
            target = env.games[task_id].path.parent.parent.name.split("-")[1].lower()
            for t, command in enumerate(env.walkthrough, start=1):
                _, reward, terminated, _, info = env.step(command)
                target_flag, operation, place, success, invalid = info[MILESTONES_KEY]
                verb, _, rest = command.partition(" ")
                assert target_flag == (verb == "take" and rest.startswith(target + " ")), command
                assert operation == (verb in ("clean", "heat", "cool", "slice")), command
                assert place == (verb in ("move", "put")), command
                assert success == (reward > 0) == terminated and not invalid
                assert info[SIGNATURE_KEY].endswith(f"|d{3 * (t // 3)}")
                if verb == "go":  # "You arrive at <receptacle> N": the place names its type
                    assert info[SIGNATURE_KEY].startswith(rest.split()[1] + "|")
            env.reset(options={"task_id": task_id})
            _, _, _, _, info = env.step("fly to the moon")  # not admissible: the step is invalid
            assert info[MILESTONES_KEY] == (0, 0, 0, 0, 1)
    finally:
        env.close()


def test_webshop_pages_climb_from_the_search_box_to_the_purchase(shared_data):
    env = gym.make("HGPO-WebShop-v0", split="eval", data_path=shared_data / "webshop").unwrapped
    assert env.milestones == ("search", "item", "option", "success", "invalid")
    order = ("init", "search_result", "item_detail", "item_sub", "bought")
    for task_id in range(5):
        _, info = env.reset(options={"task_id": task_id})
        assert info[SIGNATURE_KEY] == "init|d0" and info[MILESTONES_KEY] == (0, 0, 0, 0, 0)
        seen = []
        while True:
            command = env.expert_action()
            _, reward, terminated, truncated, info = env.step(command)
            page = info[SIGNATURE_KEY].split("|")[0]
            searched, item, option, success, invalid = info[MILESTONES_KEY]
            reached = order.index(page)
            assert (searched, item, option) == (reached >= 1, reached >= 2, reached >= 3) and not invalid
            assert success == (page == "bought") and (reward <= 0 or success)
            seen.append(page)
            if terminated or truncated:
                break
        assert seen[0] == "search_result" and seen[-1] == "bought"
        env.reset(options={"task_id": task_id})
        _, _, _, _, info = env.step("click[no such button]")
        assert info[MILESTONES_KEY] == (0, 0, 0, 0, 1) and info[SIGNATURE_KEY] == "init|d0"


def test_rooms_reports_the_key_the_door_and_the_goal_room():
    env = gym.make("HGPO-Rooms-v0", lock_probability=1.0, min_rooms=4).unwrapped
    for seed in range(5):
        _, info = env.reset(seed=seed)
        task, reached = env.task_spec, set()
        while True:
            command = env.expert_action()
            _, _, terminated, truncated, info = env.step(command)
            flags = dict(zip(env.milestones, info[MILESTONES_KEY]))
            carried = env._carried()
            assert flags["key_held"] == (task.key in carried)
            assert flags["door_opened"] == env.unlocked
            assert flags["goal_room"] == (
                env.room == task.goal_room and bool(set(task.goal_items) & set(carried))
            )
            assert info[SIGNATURE_KEY].startswith(
                f"{task.rooms[env.room]}|{'+'.join(sorted(carried)) or 'none'}|"
            )
            reached |= {name for name, flag in flags.items() if flag}
            if terminated or truncated:
                break
        assert terminated and {"key_seen", "key_held", "door_opened", "goal_room"} <= reached


def test_a_bring_your_own_env_reports_milestones_through_its_spec():
    def progress(raw):
        value = int(raw.observation.split()[-1].rstrip("."))
        return f"dial {value}", (value >= 1, value >= 2, value >= 3, raw.reward == 5.0)

    spec = dataclasses.replace(SPEC, progress=progress, milestones=("one", "two", "three", "there"))
    env = TextAdapter(Dial(), spec)
    assert env.milestones == ("one", "two", "three", "there", "invalid")
    _, info = env.reset(options={"task_id": 4})
    assert info[SIGNATURE_KEY] == "dial 0|d0" and info[MILESTONES_KEY] == (0, 0, 0, 0, 0)
    _, _, _, _, info = env.step("up")
    assert info[SIGNATURE_KEY] == "dial 1|d0" and info[MILESTONES_KEY] == (1, 0, 0, 0, 0)
    _, _, _, _, info = env.step("jump")  # not admissible: refused before the env, flagged invalid
    assert info[MILESTONES_KEY][-1] == 1
    # an env without progress reports no milestones at all
    _, plain = TextAdapter(Dial(), SPEC).reset(options={"task_id": 4})
    assert MILESTONES_KEY not in plain and SIGNATURE_KEY not in plain

    wrong = TextAdapter(Dial(), dataclasses.replace(spec, progress=lambda raw: ("x", (True,))))
    with pytest.raises(ValueError, match=r"TextEnvSpec.progress must return 4 flags"):
        wrong.reset(options={"task_id": 4})
    with pytest.raises(ValueError, match="milestones must be 5 distinct names"):
        TextAdapter(Dial(), dataclasses.replace(spec, milestones=("one", "two")))


def test_the_audit_says_how_often_each_milestone_fires():
    kwargs = {"lock_probability": 1.0, "min_rooms": 3, "max_rooms": 4}
    expert = audit_env("HGPO-Rooms-v0", kwargs, episodes=8, group_size=4, policy="expert")
    random_play = audit_env("HGPO-Rooms-v0", kwargs, episodes=8, group_size=4, max_steps=5)
    assert list(expert.milestones) == ["key_seen", "key_held", "door_opened", "goal_room", "invalid"]
    assert all(
        expert.milestones[name]["episodes"] == 1.0 for name in ("key_held", "door_opened", "goal_room")
    )
    assert random_play.milestones["goal_room"]["episodes"] < 1.0  # five random steps rarely get there
    assert "goal_room" in expert.format() and expert.to_json()["milestones"] == expert.milestones
