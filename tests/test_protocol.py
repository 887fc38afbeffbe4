"""The papers' environment protocol (``protocol="verl-agent"``), one test per rule.

Expected commands and verdicts are written from the rules (verl-agent's ``projection.py`` and env
managers, as the protocol table in docs/environments/index.md states them), not from this code's output. ALFWorld runs
its real engine on the shared valid_seen games, WebShop the shared 1000-product catalog.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

import hgpo_env  # noqa: F401
from hgpo_env.envs.webshop import shuffled_goals
from hgpo_env.envs.webshop.site import Page
from hgpo_env.prompting.actions import project_verl_agent
from hgpo_train.advantage import step_returns
from hgpo_train.config import load_config
from hgpo_train.evaluation.evaluate import Evaluator
from hgpo_train.run.loop import draw_group_tasks

THINK = "<think>I should look around.</think>"


def make_alfworld(shared_data: Path, protocol: str = "verl-agent") -> gym.Env:
    pytest.importorskip("alfworld")
    return gym.make(
        "HGPO-ALFWorld-v0",
        split="valid_seen",
        data_path=shared_data / "alfworld",
        disk_cache=False,
        protocol=protocol,
    )


@pytest.fixture(scope="module")
def alfworld(shared_data: Path) -> gym.Env:
    env = make_alfworld(shared_data)
    yield env
    env.close()


@pytest.fixture(scope="module")
def webshop(shared_data: Path) -> gym.Env:
    return gym.make("HGPO-WebShop-v0", data_path=shared_data / "webshop", split="test", protocol="verl-agent")


# ----------------------------------------------------------------- the projection
@pytest.mark.parametrize(
    ("response", "command", "valid"),
    [
        (f"{THINK}<action> Go To Cabinet 1 </action>", "go to cabinet 1", True),  # lower-cased, stripped
        (f"{THINK}<ACTION>look</ACTION>", "look", True),  # action tags found in the lower-cased text
        (f"{THINK}<action>look</action><action>inventory</action>", "look", True),  # the first block
        ("<action>look</action>", "look", False),  # no think tags: sent, invalid
        ("<THINK>hmm</THINK><action>look</action>", "look", False),  # think tags are case-sensitive
        ("<think>hmm<action>look</action>", "look", False),  # both think tags are needed
        ("<think>我想看看</think><action>look</action>", "look", False),  # U+4E00-U+9FFF
        ("<think>あ</think><action>look</action>", "look", True),  # hiragana is outside that range
        (f"{THINK}</action>x<action>", "", True),  # closing tag first: the empty slice is sent
    ],
)
def test_projection_rules(response, command, valid):
    parsed = project_verl_agent(response, "alfworld")
    assert parsed.action == command and parsed.valid == valid


def test_without_action_tags_the_last_characters_are_sent():
    tail = "Then I Will Go To Countertop 1"  # 30 characters
    parsed = project_verl_agent("x" * 50 + tail, "alfworld")
    assert parsed.action == "then i will go to countertop 1" and not parsed.valid
    parsed = project_verl_agent("x" * 50 + tail, "webshop")
    assert parsed.action == "l go to countertop 1" and not parsed.valid
    assert project_verl_agent("short", "webshop").action == "short"


# ----------------------------------------------------------------- ALFWorld, real engine
def test_alfworld_inadmissible_commands_reach_the_engine_as_valid_steps(alfworld, shared_data):
    _, info = alfworld.reset(options={"task_id": 0})
    assert "help" not in info["admissible_actions"]
    before = alfworld.unwrapped.observation
    _, reward, terminated, _, info = alfworld.step(f"{THINK}<action>take the moon</action>")
    assert alfworld.unwrapped.observation == "Nothing happens." != before
    assert info["action_valid"] and reward == 0.0 and not terminated and alfworld.unwrapped.elapsed_steps == 1

    strict = make_alfworld(shared_data, "strict")
    strict.reset(options={"task_id": 0})
    _, _, _, _, info = strict.step(f"{THINK}<action>take the moon</action>")
    assert not info["action_valid"] and strict.unwrapped.observation != "Nothing happens."
    strict.close()


def test_alfworld_tagless_response_is_sent_and_remembered_as_sent(alfworld, shared_data):
    prompt, info = alfworld.reset(options={"task_id": 0})
    tail = "Then I Will Go To Countertop 1"
    prompt, _, _, _, info = alfworld.step("Let me think about it. " + tail)
    assert not info["action_valid"] and info["parsed_action"] == "then i will go to countertop 1"
    assert "[Step 1] Action: then i will go to countertop 1" in prompt and "Let me think" not in prompt

    # A valid response that sends the same command leads to the same prompt and the same keys:
    # the fingerprints hash exactly what the memory shows.
    twin = make_alfworld(shared_data)
    twin.reset(options={"task_id": 0})
    twin_prompt, _, _, _, twin_info = twin.step(f"{THINK}<action>then i will go to countertop 1</action>")
    assert twin_info["action_valid"]
    assert twin_prompt == prompt and twin_info["fingerprints"] == info["fingerprints"]
    twin.close()


def test_an_invalid_step_costs_a_tenth_in_its_return(alfworld):
    alfworld.reset(options={"task_id": 0})
    responses = ("<action>look</action>", f"{THINK}<action>look</action>")  # no think tags, then fine
    invalid = np.array([not alfworld.step(r)[4]["action_valid"] for r in responses])
    assert invalid.tolist() == [True, False]
    config = load_config(env="alfworld")
    returns = step_returns(
        np.zeros(2), np.zeros(2, dtype=int), invalid=invalid, invalid_penalty=config.advantage.invalid_penalty
    )
    assert returns.tolist() == [-0.1, 0.0]


def test_alfworld_walkthrough_wins_ten_within_fifty_steps(alfworld):
    _, info = alfworld.reset(options={"task_id": 3})
    assert alfworld.unwrapped.max_steps == 50
    for command in alfworld.unwrapped.walkthrough:
        _, reward, terminated, _, info = alfworld.step(f"{THINK}<ACTION>{command.upper()}</ACTION>")
        assert info["action_valid"]
    assert terminated and info["won"] and reward == 10.0


# ----------------------------------------------------------------- WebShop
def test_webshop_uses_the_papers_split(webshop, shared_data):
    assert webshop.unwrapped.num_tasks == 500  # test: goals 0-499
    train = gym.make("HGPO-WebShop-v0", data_path=shared_data / "webshop", protocol="verl-agent")
    assert train.unwrapped.num_tasks == 6910 - 500  # train: goals 500 onwards
    goals = shuffled_goals(train.unwrapped.catalog)
    assert train.unwrapped.goals == goals[500:] and webshop.unwrapped.goals == goals[:500]
    with pytest.raises(ValueError, match="split must be one of"):
        gym.make("HGPO-WebShop-v0", data_path=shared_data / "webshop", split="eval", protocol="verl-agent")


def test_webshop_unknown_command_does_nothing_and_is_a_valid_step(webshop):
    webshop.reset(options={"task_id": 0})
    before = webshop.unwrapped.observation
    _, reward, _, _, info = webshop.step(f"{THINK}<action>click[nonexistent button]</action>")
    assert info["action_valid"] and reward == 0.0
    assert webshop.unwrapped.observation == before and webshop.unwrapped.elapsed_steps == 1


def test_webshop_search_works_from_any_page(webshop):
    env = webshop.unwrapped
    webshop.reset(options={"task_id": 0})
    while env.session.page is not Page.ITEM:
        webshop.step(f"{THINK}<action>{env.expert_action()}</action>")
    _, _, _, _, info = webshop.step(f"{THINK}<action>search[red lamp]</action>")
    assert info["action_valid"] and env.session.page is Page.RESULTS and env.session.keywords == "red lamp"


def test_webshop_tagless_tail_is_sent_as_the_command(webshop):
    env = webshop.unwrapped
    webshop.reset(options={"task_id": 0})
    _, _, _, _, info = webshop.step("I am sure the best is: SEARCH[A Red Lamp 1]")  # last 20 characters
    assert info["parsed_action"] == "search[a red lamp 1]" and not info["action_valid"]
    assert env.session.page is Page.RESULTS and env.session.keywords == "a red lamp 1"


# ----------------------------------------------------------------- the rest of the stack
def test_protocol_needs_a_papers_env_and_the_tag_format():
    with pytest.raises(ValueError, match="defined for"):
        gym.make("HGPO-Rooms-v0", protocol="verl-agent")
    with pytest.raises(ValueError, match="protocol must be one of"):
        gym.make("HGPO-Rooms-v0", protocol="papers")


def test_training_groups_get_distinct_tasks_within_an_iteration():
    seeds, tasks = draw_group_tasks(np.random.default_rng(0), 16, 500)
    assert len(set(tasks)) == 16 and all(0 <= t < 500 for t in tasks) and len(seeds) == 16
    assert draw_group_tasks(np.random.default_rng(0), 16, 500) == (seeds, tasks)
    assert draw_group_tasks(np.random.default_rng(0), 16, None)[1] is None  # Rooms: the seed decides
    assert sorted(draw_group_tasks(np.random.default_rng(1), 4, 4)[1]) == [0, 1, 2, 3]


def test_evaluation_plays_whole_passes_up_to_min_episodes():
    config = load_config(env="rooms", overrides=["eval.tasks=[0,1,2,3,4]", "eval.min_episodes=12"])
    assert Evaluator(config, generator=None).task_ids() == [0, 1, 2, 3, 4] * 3  # 15 >= 12, whole passes


# ----------------------------------------------------------------- front door
@pytest.mark.parametrize(
    ("blocked", "env_id", "extra"),
    [
        ("fast_downward,textworld", "HGPO-ALFWorld-v0", "alfworld"),
        ("rapidfuzz,thefuzz,bm25s", "HGPO-WebShop-v0", "webshop"),
    ],
)
def test_a_missing_extra_is_named_in_one_line(blocked, env_id, extra):
    script = textwrap.dedent(
        f"""
        import importlib.abc, sys
        class Blocked(importlib.abc.MetaPathFinder):  # the extra's packages are not installed
            def find_spec(self, name, path, target=None):
                if name.split(".")[0] in {blocked.split(",")!r}:
                    raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        sys.meta_path.insert(0, Blocked())
        import gymnasium, hgpo_env
        gymnasium.make({env_id!r})
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    last = result.stderr.strip().splitlines()[-1]
    assert result.returncode != 0 and last.startswith(
        "hgpo_env.textenv.registration.MissingExtraError"
    )  # a ModuleNotFoundError
    assert f'pip install -e ".[{extra}]"' in last


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"history_length": "two"}, "history_length must be int, got 'two'"),
        ({"max_steps": 2.5}, "max_steps must be int"),
        ({"split": 3}, "split must be 'train' or 'eval'"),
        ({"require_think": "yes"}, "require_think must be bool"),
    ],
)
def test_a_wrongly_typed_argument_names_itself_and_the_type(kwargs, message):
    with pytest.raises(TypeError, match=message):
        gym.make("HGPO-Rooms-v0", **kwargs)
