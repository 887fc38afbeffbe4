"""TextAdapter / TextEnvSpec: any text env on the info contract, and the wrappers on any such env."""

from __future__ import annotations

import inspect
import random
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from byo_envs import SPEC, Dial, Lottery

import hgpo_env
from hgpo_env import TextAdapter, TextEnvSpec, make_agent_env
from hgpo_env.contract.info import AGENT_KEYS, ENV_KEYS, RESET_KEYS
from hgpo_env.tools.check import check_env_health

HERE = Path(__file__).parent


def made(spec=SPEC, inner=None, **kwargs):
    return make_agent_env(
        lambda **kw: TextAdapter(inner or Dial(), spec, **kw), response_format="plain", **kwargs
    )


def test_contract_prompt_and_success_reward():
    env = made(history_length=2, max_steps=20)
    prompt, info = env.reset(options={"task_id": 7})
    assert set(RESET_KEYS) <= set(info) and info["task"].startswith("turn the dial to")
    assert prompt.startswith("You turn a dial.\nYour task is to: turn the dial to")
    assert "Admissible actions:\n- up\n- down\n" in prompt
    target = Dial()
    target.reset(seed=7)
    rewards = []
    for _ in range(target.target):
        prompt, reward, terminated, truncated, info = env.step("up")
        rewards.append(reward)
    assert set(AGENT_KEYS) <= set(info) and info["won"] and terminated and not truncated
    assert rewards == [0.0] * (target.target - 1) + [10.0]  # success reward, not the env's 0.5 / 5
    assert info["env_info"] == {"moves": ["up", "down"], "refused": False}


def test_native_reward_truncation_and_verdict():
    spec = TextEnvSpec(
        family="dial",
        intro="x",
        task="goal",
        check_admissible=False,
        admissible="moves",
        accepted=lambda raw: not raw.info["refused"],
    )
    env = made(spec, Dial(limit=2), reward="native", max_steps=50)
    env.reset(options={"task_id": 3})
    _, reward, terminated, truncated, info = env.step(
        "kick"
    )  # sent (no admissible check), refused by the env
    assert reward == -1.0 and not info["action_valid"] and info["state_text"] == "The dial shows 0."
    _, reward, terminated, truncated, info = env.step("up")
    assert reward == 0.5 and info["action_valid"] and truncated and not terminated  # the env's own limit


def test_refused_off_list_without_reaching_the_env():
    env = made()
    env.reset(options={"task_id": 3})
    _, reward, _, _, info = env.step("kick")
    assert not info["action_valid"] and reward == 0.0 and env.unwrapped.env.moves == 0


def test_old_gym_signature_and_action_mapping():
    class OldAPI:
        def reset(self, seed=None):
            self.position = 0
            return "At 0."

        def step(self, action: int):
            self.position += action
            done = self.position >= 2
            return f"At {self.position}.", 1.0, done, {"TimeLimit.truncated": False}

    spec = TextEnvSpec(
        family="old",
        intro="Walk.",
        step="gym",
        admissible=lambda raw: ["step", "hop"],
        to_env_action={"step": 1, "hop": 2}.__getitem__,
    )
    env = made(spec, OldAPI())
    _, info = env.reset(seed=0)
    assert info["task"] == "At 0."  # no task source: the first observation
    _, _, terminated, _, info = env.step("hop")
    assert terminated and info["won"]  # default win: a positive reward on a terminating step


def test_free_form_prompt_and_parser():
    spec = TextEnvSpec(family="dial", intro="You turn a dial.", task="goal")
    env = make_agent_env(lambda **kw: TextAdapter(Dial(), spec, **kw))
    prompt, info = env.reset(options={"task_id": 1})
    assert "Admissible actions" not in prompt and "admissible" not in prompt
    assert "write your next command inside <action> </action>" in prompt
    assert info["admissible_actions"] == []
    _, _, _, _, info = env.step("<think>go</think><action>up</action>")
    assert info["action_valid"] and info["parsed_action"] == "up"


def test_wrappers_find_the_contract_on_a_wrapper_anywhere_in_the_chain():
    """A user's own gym.Wrapper adapter, not a TextAdapter, works under both wrappers."""

    class MyAdapter(gym.Wrapper):
        env_family = "mine"
        prompt_intro = "Mine."

        def reset(self, **kwargs):
            obs, info = self.env.reset(**kwargs)
            return obs, {
                "admissible_actions": ["up"],
                "won": False,
                "score": 0.0,
                "task": info["goal"],
                "task_type": None,
                "action_valid": True,
                "state_text": obs,
            }

        def step(self, action):
            obs, reward, terminated, truncated, _ = self.env.step(action)
            return (
                obs,
                reward,
                terminated,
                truncated,
                {
                    "admissible_actions": ["up"],
                    "won": terminated,
                    "score": 0.0,
                    "task": "",
                    "task_type": None,
                    "action_valid": True,
                    "state_text": obs,
                },
            )

    env = hgpo_env.KStepMemory(
        gym.wrappers.OrderEnforcing(hgpo_env.ParseResponse(MyAdapter(Dial()), "plain"))
    )
    prompt, info = env.reset(seed=0)
    assert prompt.startswith("Mine.") and set(ENV_KEYS) <= set(info)
    with pytest.raises(AttributeError, match="TextAdapter"):
        hgpo_env.KStepMemory(Dial())


def test_bad_specs_fail_clearly():
    with pytest.raises(ValueError, match="spec.step"):
        TextAdapter(Dial(), TextEnvSpec(family="d", intro="x", step="gym3"))
    with pytest.raises(ValueError, match="reward"):
        TextAdapter(Dial(), SPEC, reward="dense")
    env = make_agent_env(
        lambda **kw: TextAdapter(Dial(), TextEnvSpec(family="d", intro="x", task="nope"), **kw)
    )
    with pytest.raises(KeyError, match="'nope'"):
        env.reset(seed=0)

    class Dict(Dial):
        def reset(self, *, seed=None, options=None):
            return {"text": "x"}, {}

    with pytest.raises(TypeError, match="observation= callable"):
        made(TextEnvSpec(family="d", intro="x"), Dict()).reset(seed=0)


def lottery(isolate_rng: bool):
    spec = TextEnvSpec(family="lottery", intro="Draw.", admissible=lambda raw: ["draw"])
    return made(spec, Lottery(), isolate_rng=isolate_rng, history_length=1)


@pytest.mark.parametrize("isolate_rng", [True, False])
def test_private_random_streams_under_interleaving(isolate_rng):
    def trajectory(interleave: bool):
        env, other = lottery(isolate_rng), lottery(isolate_rng)
        env.reset(seed=1, options={"task_id": 5})
        other.reset(seed=2, options={"task_id": 6})
        out = []
        for _ in range(4):
            out.append(env.step("draw")[0])
            if interleave:
                other.step("draw")
                random.random(), np.random.random()  # the process itself draws too
        return out

    alone, interleaved = trajectory(False), trajectory(True)
    assert (alone == interleaved) is isolate_rng  # without isolation the test detects the disturbance


def test_private_streams_leave_the_global_ones_alone():
    random.seed(3)
    expected = random.random()
    random.seed(3)
    env = lottery(True)
    env.reset(seed=1, options={"task_id": 5})
    env.step("draw")
    assert random.random() == expected and random.random == random._inst.random


def test_register_text_env_and_a_pool_group():
    env = gym.make("TestDial-v0", history_length=1, max_steps=5)
    assert env.unwrapped.max_steps == 5 and env.unwrapped.env.limit == 100
    from hgpo_env.vector import GroupedEnvPool

    # 2 groups x 3 members of an env drawing from the global random, 2 workers: members share a
    # process with members of the other group, and each group still plays one game
    with GroupedEnvPool(
        "byo_envs:TestLottery-v0", 2, 3, num_workers=2, seed=0, response_format="plain"
    ) as pool:
        pool.reset(task_ids=[11, 12])
        draws = []
        for _ in range(3):
            results = pool.step({index: "draw" for index in range(6)})
            draws.append([r.info["state_text"] for r in results])
    for step in draws:
        assert len(set(step[:3])) == 1 and len(set(step[3:])) == 1 and step[0] != step[3]


def test_check_flags_a_step_counter_and_passes_a_clean_env():
    clean = check_env_health("TestDial-v0", {"max_steps": 12}, groups=2)
    assert clean.ok and not clean.warnings and clean.levels[0].repeated > 0.5
    counted = check_env_health("TestCounter-v0", {"max_steps": 12}, groups=2)
    assert counted.ok and "counter or clock" in counted.warnings[0]
    assert counted.levels[0].repeated < clean.levels[0].repeated


def test_check_cli_exit_codes():
    ok = subprocess.run(
        [sys.executable, "-m", "hgpo_env", "check", "byo_envs:TestCounter-v0", "max_steps=10"],
        capture_output=True,
        cwd=HERE,
        check=False,
        text=True,
        timeout=120,
    )
    assert ok.returncode == 0 and "WARNING: state_text seems to carry a counter" in ok.stdout, ok.stderr
    bad = subprocess.run(
        [sys.executable, "-m", "hgpo_env", "check", "byo_envs:TestNondeterministic-v0"],
        capture_output=True,
        cwd=HERE,
        check=False,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 1 and "not deterministic" in bad.stdout, bad.stdout + bad.stderr
    missing = subprocess.run(
        [sys.executable, "-m", "hgpo_env", "check", "HGPO-TextWorld-v0"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert missing.returncode == 2 and missing.stderr.strip() == (
        "error: HGPO-TextWorld-v0 needs games=: a folder of .z8/.ulx files or a list of them"
    )


def test_the_docs_example_runs_as_written():
    text = (HERE.parent / "docs" / "environments" / "bring-your-own.md").read_text()
    section = text
    code = section[section.index("```python\n") + len("```python\n") : section.index("\n```\n")]
    assert len(code.strip().splitlines()) <= 30
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stderr
    fingerprints, valid = out.stdout.rsplit(")", 1)
    assert len(fingerprints.strip("(").split(",")) == 3 and valid.strip() == "True"


def test_the_registration_tells_what_an_id_builds_with_by_default():
    """What ``python -m hgpo_env serve`` compares a client's arguments with: asked of the
    registration, not read out of gymnasium's entry points."""
    from hgpo_env.textenv.registration import env_defaults

    dial = env_defaults("byo_envs:TestDial-v0")
    assert dial["history_length"] == hgpo_env.prompting.memory.DEFAULT_HISTORY_LENGTH  # the wrappers'
    assert (
        dial["max_steps"] == inspect.signature(TextAdapter).parameters["max_steps"].default
    )  # the adapter's
    assert dial["counter"] is False and dial["limit"] == 100  # the factory's, and the id's own kwargs
    rooms = env_defaults("HGPO-Rooms-v0")
    assert rooms["show_carried"] is False and rooms["split"] == "train"  # the env class's
    gym.register(id="TestPlainRegistration-v0", entry_point=Dial, kwargs={"limit": 7})
    assert env_defaults("TestPlainRegistration-v0") == {"limit": 7}
