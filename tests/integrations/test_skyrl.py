"""skyrl-gym integration against the real ``skyrl-gym`` package: envs made by id with skyrl_gym.make."""

from __future__ import annotations

import gymnasium as gym
import pytest
import skyrl_gym
from integration_setup import ENV_ID, ROOMS, import_error_without

from integrations.skyrl import HGPOTextEnv, tool_schemas

CONFIG = {"history_length": 2, "response_format": "plain", "max_steps": 30, **ROOMS}


def hermes(command: str) -> str:
    return f'<tool_call>\n{{"name": "act", "arguments": {{"command": "{command}"}}}}\n</tool_call>'


def test_an_episode_by_id_carries_the_gymnasium_fingerprints():
    env = skyrl_gym.make("hgpo-rooms", env_config=CONFIG, extras={"task_id": 6, "group_id": "g1"})
    assert isinstance(env, HGPOTextEnv)
    reference = gym.make(ENV_ID, **CONFIG)
    prompt, info = reference.reset(options={"task_id": 6})
    observations, metadata = env.init([])
    assert observations == [{"role": "user", "content": prompt}]
    assert metadata["fingerprints"] == tuple(info["fingerprints"]) and metadata["step"] == 0
    actions = ["fly away"]
    done, step = False, 0
    while not done:
        action = actions.pop() if actions else env.env.unwrapped.expert_action()
        out = env.step(action)
        prompt, reward, terminated, truncated, info = reference.step(action)
        step += 1
        done = terminated or truncated
        assert out["done"] == done and out["reward"] == reward
        assert out["metadata"]["fingerprints"] == tuple(info["fingerprints"])
        assert (out["metadata"]["step"], out["metadata"]["group_id"]) == (step, "g1")
        assert out["metadata"]["action_valid"] == info["action_valid"]
        assert out["observations"] == ([] if done else [{"role": "user", "content": prompt}])
    assert out["metadata"]["won"] and out["reward"] == 10.0
    env.close()


def test_chat_envs_speak_messages_each_step_adding_its_observation():
    """A chat env opens SkyRL's conversation with its system message and first observation; each
    step adds the next observation, a tool message after a call, with the env's level-0 key."""
    chat = {**CONFIG, "prompt_format": "chat", "response_format": "tool_call"}
    del chat["history_length"]  # the conversation is the memory: 0 by default
    env = skyrl_gym.make("hgpo-rooms", env_config=chat, extras={"task_id": 6})
    reference = gym.make(ENV_ID, **{**chat, "history_length": 0})
    messages, info = reference.reset(options={"task_id": 6})
    observations, metadata = env.init([])
    assert observations == messages and [m["role"] for m in messages] == ["system", "user"]
    assert metadata["fingerprints"] == tuple(info["fingerprints"]) and len(metadata["fingerprints"]) == 1
    assert tool_schemas(ENV_ID, chat) == info["tools"] != []
    for reply in [hermes("look"), "I will look around.", hermes("go nowhere")]:
        out = env.step(reply)
        messages, reward, _, _, info = reference.step(reply)
        (added,) = out["observations"]
        assert added["content"] == messages[-1]["content"]  # the current observation, listed actions
        assert added["role"] == ("user" if reply.startswith("I") else "tool")
        assert (out["reward"], out["metadata"]["fingerprints"]) == (reward, tuple(info["fingerprints"]))
        assert out["metadata"]["action_valid"] == info["action_valid"] == (reply == hermes("look"))


def test_every_hgpo_env_is_registered_and_rows_must_name_a_task():
    assert {"hgpo-rooms", "hgpo-alfworld", "hgpo-webshop"} <= set(skyrl_gym.envs.registration.registry)
    with pytest.raises(ValueError, match="'task_id' and/or 'seed'"):
        skyrl_gym.make("hgpo-rooms", env_config=CONFIG, extras={})
    with pytest.raises(
        ValueError, match="keeps the conversation, which is a chat env's memory: set history_length=0"
    ):
        skyrl_gym.make("hgpo-rooms", env_config={**CONFIG, "prompt_format": "chat"}, extras={"seed": 3})
    seeded = skyrl_gym.make("hgpo-rooms", env_config=CONFIG, extras={"seed": 3})
    again = skyrl_gym.make("hgpo-rooms", env_config=CONFIG, extras={"seed": 3})
    assert seeded.init([]) == again.init([])  # one seed, one task: the group starts together


def test_missing_skyrl_gym_names_the_extra(monkeypatch):
    message = import_error_without(monkeypatch, "integrations.skyrl", "skyrl_gym.envs.base_text_env")
    assert "pip install -e '.[skyrl]'" in message
