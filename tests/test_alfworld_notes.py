"""GraphGPO's ALFWorld household notes (``observation_mode="graphgpo"``) equal its recipe's.

The golden notes in ``data/graphgpo_alfworld_notes.json`` were produced by the recipe's own code
(verl-agent ``recipe/GraphGPO``: ``AlfworldWorker``'s update methods and the env manager's
``get_location_holding``, run in a scratch environment) on commands played in real valid_seen
games and on scripted answers that hit its quirks (substring matches, re-picks, "Nothing happens").
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hgpo_env.envs.alfworld.tracker import HouseholdNotes

GOLDEN = json.loads((Path(__file__).parent / "data" / "graphgpo_alfworld_notes.json").read_text())


@pytest.mark.parametrize("script", range(len(GOLDEN["synthetic"])))
def test_notes_follow_the_recipe_on_scripted_answers(script):
    notes = HouseholdNotes()
    for step in GOLDEN["synthetic"][script]:
        notes.update(step["command"], step["answer"])
        assert notes.describe() == step["notes"], step["command"]


def test_notes_follow_the_recipe_in_real_games(shared_data: Path):
    pytest.importorskip("alfworld")
    from hgpo_env.envs.alfworld import ALFWorldEnv

    env = ALFWorldEnv(
        split="valid_seen",
        data_path=shared_data / "alfworld",
        protocol="verl-agent",
        observation_mode="graphgpo",
        max_steps=60,
        disk_cache=False,
    )
    checked = 0
    for case in GOLDEN["real"]:
        env.reset(options={"task_id": case["task_id"]})
        assert env.state_text.endswith("Location: middle of a room. Items in hand (status): nothing. ")
        for command, answer, notes in zip(case["commands"], case["answers"], case["notes"], strict=True):
            observation, *_ = env.step(command)
            assert observation == f"{answer} {notes}" == env.state_text, (case["task_id"], command)
            checked += 1
    assert checked > 500
    env.close()


def test_graphgpo_nodes_tell_apart_what_the_plain_text_does_not(shared_data: Path):
    """Same answer text, different hand: one state in text mode, two with the notes and actions."""
    pytest.importorskip("alfworld")
    import gymnasium

    import hgpo_env  # noqa: F401

    def level0_after(commands: list[str], **kwargs: str) -> int:
        env = gymnasium.make(
            "HGPO-ALFWorld-v0",
            split="valid_seen",
            data_path=shared_data / "alfworld",
            response_format="plain",
            disk_cache=False,
            **kwargs,
        )
        _, info = env.reset(options={"task_id": 0})
        for command in commands:
            _, _, _, _, info = env.step(command)
        env.close()
        return info["fingerprints"][0]

    # task 0: the bed looks the same whether the agent arrives empty-handed or with the alarm clock
    empty = ["go to bed 1"]
    holding = ["go to desk 1", "take alarmclock 2 from desk 1", "go to bed 1"]
    plain = [level0_after(c) for c in (empty, holding)]
    rich = [
        level0_after(c, observation_mode="graphgpo", fingerprint_state="text_and_actions")
        for c in (empty, holding)
    ]
    assert plain[0] == plain[1]
    assert rich[0] != rich[1]
    assert plain[0] != rich[0]  # keys of different state sources never meet


def test_unknown_observation_mode_is_refused():
    pytest.importorskip("alfworld")
    from hgpo_env.envs.alfworld import ALFWorldEnv

    with pytest.raises(ValueError, match="observation_mode must be one of"):
        ALFWorldEnv(observation_mode="rich")
