"""PoolEnvironmentManager speaks verl-agent's environment-manager protocol (verl-agent is not on
PyPI; the protocol is read from its env_manager.py and rollout_loop.py): all envs stepped every
turn, finished ones included; K-step prompts as text; fingerprints as anchors."""

from __future__ import annotations

import random

import gymnasium as gym
import numpy as np
import pytest
from integration_setup import ENV_ID, ROOMS

from integrations.verl_agent import PoolEnvironmentManager

ENV_KWARGS = {"history_length": 2, "response_format": "plain", "max_steps": 5, **ROOMS}


def play(manager, rng, kwargs=None):
    """verl-agent's loop: actions for every env each turn until all are done; per env, its steps."""
    obs, infos = manager.reset(kwargs)
    steps = [[] for _ in obs["text"]]
    done = np.zeros(len(obs["text"]), dtype=bool)
    while not done.all():
        actions = [rng.choice([*info["admissible_actions"], "fly away"]) for info in infos]
        next_obs, rewards, dones, infos = manager.step(actions)
        for i in np.flatnonzero(~done):
            steps[i].append((obs["text"][i], obs["anchor"][i], actions[i], float(rewards[i]), infos[i]))
        assert not (done & (rewards != 0)).any()  # finished envs get no reward
        done, obs = dones, next_obs
    return steps


def test_manager_plays_groups_with_fingerprint_anchors():
    manager = PoolEnvironmentManager(ENV_ID, 2, 3, seed=0, pool_options={"num_workers": 1}, **ENV_KWARGS)
    try:
        kwargs = [{"task_id": 4}] * 3 + [{"task_id": 12}] * 3
        steps = play(manager, random.Random(0), kwargs)
        success = manager.success_evaluator(total_infos=None, total_batch_list=None)["success_rate"]
    finally:
        manager.close()
    for i, episode in enumerate(steps):
        # replaying the actions in a fresh env gives the same prompts, anchors, rewards and validity
        env = gym.make(ENV_ID, **ENV_KWARGS)
        prompt, info = env.reset(options={"task_id": 4 if i < 3 else 12})
        for text, anchor, action, reward, step_info in episode:
            assert (text, anchor) == (prompt, tuple(info["fingerprints"]))
            prompt, env_reward, _, _, info = env.step(action)
            assert reward == env_reward and step_info["is_action_valid"] == info["action_valid"]
        assert success[i] == float(info["won"])
    assert len({steps[i][0][1] for i in range(3)}) == 1  # one group, one start
    assert steps[0][0][1] != steps[3][0][1]


def test_manager_errors_are_clear():
    with pytest.raises(ValueError, match="the verl-agent adapter plays text prompts"):
        PoolEnvironmentManager(ENV_ID, 1, 2, prompt_format="chat", response_format="tool_call")
    manager = PoolEnvironmentManager(ENV_ID, 1, 2, seed=0, pool_options={"num_workers": 1}, **ENV_KWARGS)
    try:
        with pytest.raises(ValueError, match="share one task_id"):
            manager.reset([{"task_id": 1}, {"task_id": 2}])
        with pytest.raises(ValueError, match="the manager has 2"):
            manager.reset([{"task_id": 1}])
        manager.reset()
        with pytest.raises(ValueError, match="1 actions for 2 envs"):
            manager.step(["look"])
    finally:
        manager.close()
