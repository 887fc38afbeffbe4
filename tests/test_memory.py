"""The K-step memory wrapper: window contents, prompt rendering, fingerprints, token budget."""

from __future__ import annotations

import gymnasium as gym
import pytest

import hgpo_env  # noqa: F401  (registers the ids)
from hgpo_env.contract.fingerprint import MISSING, Fingerprinter
from hgpo_env.contract.info import RESET_KEYS, STEP_KEYS

TASK = {"task_id": 10_007}


def make(**kwargs):
    return gym.make("HGPO-Rooms-v0", response_format="plain", **kwargs)


def expert_rollout(env, steps):
    obs, info = env.reset(options=TASK)
    out = [(obs, info)]
    for _ in range(steps):
        obs, _, terminated, truncated, info = env.step(env.unwrapped.expert_action())
        out.append((obs, info))
        if terminated or truncated:
            break
    return out


def test_info_contract_keys():
    env = make()
    _, info = env.reset(options=TASK)
    assert set(RESET_KEYS) <= set(info)
    assert "action_key" not in info
    _, _, _, _, info = env.step("look")
    assert set(STEP_KEYS) <= set(info)
    assert isinstance(info["fingerprints"], tuple) and len(info["fingerprints"]) == 3
    assert info["fingerprint_mode"] == "observations_actions"


def test_the_action_key_names_the_command_the_env_received():
    """Responses that parse to one command share a key, in any state; unparseable ones share
    another; the key is the wrapper's hash of ``parsed_action``."""
    env = gym.make("HGPO-Rooms-v0", response_format="think_action")
    env.reset(options=TASK)
    keys = {}
    for response in ("<action>look</action>", "<action> LOOK </action>", "no tags", "<action></action>"):
        *_, info = env.step(response)
        keys[response] = info["action_key"]
        assert info["action_key"] == env.get_wrapper_attr("fingerprinter").action(info["parsed_action"])
    assert keys["<action>look</action>"] == keys["<action> LOOK </action>"]
    assert keys["no tags"] == keys["<action></action>"] != keys["<action>look</action>"]


def test_window_holds_last_k_steps_and_the_prompt_shows_them():
    env = make(history_length=2)
    rollout = expert_rollout(env, 4)
    memory = env.get_wrapper_attr("history")
    plain = env.unwrapped
    assert [p.number for p in memory] == [3, 4]
    prompt = rollout[-1][0]
    # the prompt shows steps 3 and 4 with their observations and actions, and not step 2
    for past in memory:
        assert f"[Step {past.number}] Observation: {past.observation}" in prompt
        assert f"[Step {past.number}] Action: {past.action}" in prompt
    assert "[Step 2]" not in prompt
    assert f"Your task is to: {plain.task}" in prompt
    assert f"Current observation: {plain.observation}" in prompt
    for action in plain.admissible_actions:
        assert f"\n- {action}\n" in prompt
    assert "You have taken 4 step(s)" in prompt and "now at step 5" in prompt
    # the wrapper lays out steps it showed once; the template's render of the window is the same text
    template, info = env.get_wrapper_attr("template"), rollout[-1][1]
    assert template.render(plain.task, 4, memory, plain.observation, info["admissible_actions"]) == prompt


def test_first_prompt_and_history_zero():
    prompt, info = make(history_length=0).reset(options=TASK)
    assert "This is your first step." in prompt and info["fingerprints"] != (MISSING,)
    env = make(history_length=0)
    rollout = expert_rollout(env, 2)
    assert "[Step" not in rollout[-1][0] and rollout[-1][1]["history_used"] == 0
    assert len(rollout[-1][1]["fingerprints"]) == 1


def test_fingerprints_follow_the_shown_history():
    env = make(history_length=2)
    rollout = expert_rollout(env, 3)
    fp = Fingerprinter("rooms")
    states = [info["state_text"] for _, info in rollout]
    actions = [info["parsed_action"] for _, info in rollout[1:]]
    records = [fp.record(fp.state(s), a) for s, a in zip(states, actions)]
    for t, (_, info) in enumerate(rollout):
        assert info["history_used"] == min(t, 2)
        expected = fp.levels(fp.state(states[t]), records[:t][::-1][:2], 3)
        assert info["fingerprints"] == expected


def test_invalid_response_is_remembered_as_no_action():
    env = gym.make("HGPO-Rooms-v0")  # think_action format
    env.reset(options=TASK)
    prompt, *_, info = env.step("I am not sure")
    assert info["parsed_action"] is None and not info["action_valid"]
    assert info["parse_error"].startswith("no <action>")
    assert "[Step 1] Action: (no valid action)" in prompt


def test_same_seed_same_task_and_fingerprints():
    a, b = make(), make()
    first = a.reset(seed=3)[1]
    second = b.reset(seed=3)[1]
    assert first["task"] == second["task"]
    assert first["initial_fingerprint"] == second["initial_fingerprint"]
    for _ in range(5):
        command = a.unwrapped.expert_action()
        assert a.step(command)[4]["fingerprints"] == b.step(command)[4]["fingerprints"]


class WordTokenizer:
    def encode(self, text):
        return text.split()


def test_token_budget_shrinks_history_and_zeroes_levels():
    full = make(history_length=4)
    rollout = expert_rollout(full, 5)
    full_tokens = len(WordTokenizer().encode(rollout[-1][0]))
    per_step = len(WordTokenizer().encode(rollout[-1][1]["state_text"]))

    budget = full_tokens - 1  # one token too many: the oldest step must go
    env = make(history_length=4, tokenizer=WordTokenizer(), max_prompt_tokens=budget)
    shrunk = expert_rollout(env, 5)
    prompt, info = shrunk[-1]
    assert info["history_used"] < 4
    assert len(WordTokenizer().encode(prompt)) <= budget
    assert info["fingerprints"][info["history_used"] + 1 :] == (MISSING,) * (4 - info["history_used"])
    assert (
        info["fingerprints"][: info["history_used"] + 1]
        == rollout[-1][1]["fingerprints"][: info["history_used"] + 1]
    )
    assert per_step > 0

    tiny = make(history_length=2, tokenizer=WordTokenizer(), max_prompt_tokens=5)
    with pytest.warns(UserWarning, match="even without history"):
        _, info = tiny.reset(options=TASK)
    assert info["history_used"] == 0


def test_bad_wrapper_arguments():
    with pytest.raises(ValueError, match="history_length"):
        make(history_length=-1)
    with pytest.raises(ValueError, match="both tokenizer"):
        make(max_prompt_tokens=10)
    with pytest.raises(ValueError, match="response_format"):
        gym.make("HGPO-Rooms-v0", response_format="xml")
