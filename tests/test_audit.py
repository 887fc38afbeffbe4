"""python -m hgpo_env audit on envs whose answer is known: a dial the observation shows whole, Rooms
that hides what the agent carries (and, shown or not, where items were left), and envs that
cannot be audited."""

from __future__ import annotations

import json

import byo_envs  # registers the Test* envs
import gymnasium as gym
import pytest

import hgpo_env
from hgpo_env import TextEnvSpec
from hgpo_env.__main__ import main
from hgpo_env.tools.audit import AuditError, audit_env
from hgpo_env.tools.check import check_env_health

ROOMS = {"lock_probability": 0.0}


def run_json(argv, capsys) -> dict:
    assert main(["audit", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_dial_the_observation_shows_whole_is_sound_at_every_level(capsys):
    report = run_json(["TestDial-v0", "--episodes", "32", "--max-steps", "20"], capsys)
    assert [level["level"] for level in report["levels"]] == [0, 1, 2, 3, 4]
    for level in report["levels"]:
        assert level["aliased_share"] == 0.0 and level["aliased_interval"] == [0.0, 0.0]
        assert level["example"] is None
    assert report["verdict"].startswith("the state key is sound here")
    assert report["merging"]["eligible_share"] > 0.5 and report["task_group_problems"] == []
    assert report["episodes"] == 32 and report["groups"] == 4


def test_rooms_is_flagged_at_level_0_and_sound_where_the_history_tells(capsys):
    report = run_json(["HGPO-Rooms-v0", "lock_probability=0.0", "--seed", "1"], capsys)
    state, *higher = report["levels"]
    low, high = state["aliased_interval"]
    assert 0.05 < low <= state["aliased_share"] <= high  # what the agent carries is hidden
    sound = [level["level"] for level in higher if level["aliased_interval"][0] == 0.0]
    assert sound and f"HGPO with K >= {sound[0]}" in report["verdict"]
    assert "GiGPO, GraphGPO, G2PO and CRBC would take different states for one" in report["verdict"]
    example = state["example"]
    assert len(example["sides"]) == 2 and example["sides"][0]["successor"] != example["sides"][1]["successor"]


def test_showing_what_is_carried_removes_most_but_not_all_aliasing():
    """show_carried puts what the agent holds in the observation, not what lies in other rooms:
    an item dropped elsewhere is still hidden until the agent walks back in, so a little aliasing
    remains, and the example shows a room entered with different contents."""
    hidden = audit_env("HGPO-Rooms-v0", ROOMS, seed=1).levels[0]
    shown = audit_env("HGPO-Rooms-v0", {**ROOMS, "show_carried": True}, seed=1).levels[0]
    assert shown.aliased_share < hidden.aliased_share / 2
    assert shown.aliased_interval[0] > 0
    sides = shown.example["sides"]
    assert all(side["successor"].startswith("You walk") for side in sides)


def test_what_an_env_prints_does_not_reach_the_json(capsys):
    report = run_json(["TestChatty-v0", "--episodes", "4", "--max-steps", "3"], capsys)
    assert report["env_id"] == "TestChatty-v0" and report["steps"] > 0


def test_members_that_start_different_tasks_are_named():
    report = audit_env("TestGlobalLockbox-v0", episodes=8, group_size=4, max_steps=5)
    assert report.task_group_problems and "members started different tasks" in report.task_group_problems[0]


def test_the_text_report_and_progress(capsys):
    calls = []
    report = audit_env(
        "TestDial-v0", episodes=5, group_size=2, progress=lambda done, total: calls.append((done, total))
    )
    assert calls == [(i, 5) for i in range(1, 6)] and report.groups == 3
    text = report.format()
    assert (
        text.splitlines()[1] == "level  visits  aliased  95% interval"
        and "verdict: the state key is sound" in text
    )


class Silent(gym.Env):
    """Offers nothing to do."""

    def reset(self, *, seed=None, options=None):
        return "Nothing here.", {}

    def step(self, action):
        return "Nothing.", 0.0, False, False, {}


class Broken(Silent):
    def reset(self, *, seed=None, options=None):
        raise RuntimeError("the game files are missing")


class Chatty(byo_envs.Dial):
    """Prints to stdout as it plays, as some third-party envs do (minigrid's BabyAI levels)."""

    def step(self, action):
        print("Sampling rejected: unreachable object")
        return super().step(action)


hgpo_env.register_text_env("TestChatty-v0", Chatty, byo_envs.SPEC)
hgpo_env.register_text_env(
    "TestSilent-v0", Silent, TextEnvSpec(family="silent", intro="You wait.", admissible=lambda raw: [])
)
hgpo_env.register_text_env(
    "TestBroken-v0", Broken, TextEnvSpec(family="broken", intro="You play.", admissible=lambda raw: ["go"])
)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["TestSilent-v0"], "the env offers no admissible actions (task "),
        (["TestBroken-v0"], "the env could not reset: RuntimeError: the game files are missing"),
        (["HGPO-Nope-v0"], "doesn't exist"),
        (["HGPO-Rooms-v0", "--episodes", "0"], "episodes must be at least 1"),
    ],
)
def test_an_env_that_cannot_be_audited_is_one_line(argv, message, capsys):
    assert main(["audit", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and len(err.strip().splitlines()) == 1


def test_bad_settings_of_the_function():
    with pytest.raises(ValueError, match="unknown policy 'greedy'"):
        audit_env("TestDial-v0", policy="greedy")
    with pytest.raises(AuditError, match="could not reset"):
        audit_env("TestBroken-v0")


@pytest.mark.parametrize("memory", [{}, {"memory": "compaction", "compact_every": 2}])
def test_the_audit_and_the_health_check_reply_in_the_envs_answer_format(memory):
    """Under think_action a command is sent as <action>...</action>, a summary as <summary>...</summary>:
    a bare command there would make every step invalid."""
    kwargs = {"response_format": "think_action", **memory}
    audit = audit_env("HGPO-Rooms-v0", kwargs, episodes=4, group_size=2, max_steps=6, history_length=1)
    assert "invalid          0.000" in audit.format()
    report = check_env_health("HGPO-Rooms-v0", kwargs, groups=1, group_size=2, max_steps=6)
    assert report.ok, report.format()
