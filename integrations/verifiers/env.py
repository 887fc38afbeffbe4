"""Any HGPO-* env (or ``module:Id``) as a verifiers (v1) ``Taskset`` and ``Env``.

A task is one seed of the env: its prompt is the env's first prompt, its key our ``task_key``, so
verifiers groups rollouts of a task as our trainer does. ``HGPOEnv.run`` plays the env host-side
as the run's user: each assistant reply is one env step, and the next user turn is the prompt the
env's K-step memory wrote, exactly as our trainer's run sees it. Each turn's keys land in
``trace.info["hgpo"]`` (one entry per assistant turn, :data:`TURN_FIELDS`), the env's reward as the
trace's ``env_reward``.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator, Mapping
from typing import Any

import gymnasium as gym
from pydantic import Field, field_validator

import hgpo_env  # noqa: F401  (registers the HGPO-* ids)
from hgpo_env.textenv.registration import import_env_module
from integrations._framework import missing_framework, text_prompts_only

try:
    import verifiers.v1 as vf
except ImportError as error:
    raise missing_framework("verifiers", error) from error

TURN_FIELDS = ("fingerprints", "action_key", "next_state", "reward", "invalid", "turn")
"""What ``trace.info["hgpo"]["turns"][t]`` holds for assistant turn t: the K+1 fingerprints of the
prompt it answered, the key of the command the env received (a summary turn's: its summary's),
level 0 of the next prompt's fingerprints, the env reward of the step, whether the reply held no
admissible command (or no summary), and what the prompt asked for (``"action"``, or
``"summary"`` under ``memory="compaction"``)."""


class HGPOTasksetConfig(vf.TasksetConfig):
    """Which env, made how, and from which seed its tasks are numbered."""

    env: str = "HGPO-Rooms-v0"
    """A registered ``HGPO-*`` id or ``module:Id`` (``module`` registers ``Id``)."""
    env_kwargs: dict[str, Any] = Field(default_factory=dict)
    """``gymnasium.make`` arguments (``history_length``, ``max_steps``, env options)."""
    first_seed: int = 0
    """Task i is the env reset with seed ``first_seed + i``."""

    @field_validator("env_kwargs")
    @classmethod
    def _text_prompts(cls, env_kwargs: dict[str, Any]) -> dict[str, Any]:
        text_prompts_only(env_kwargs, "the verifiers taskset")
        return env_kwargs

    @field_validator("env")
    @classmethod
    def _registered(cls, env: str) -> str:
        try:
            gym.spec(import_env_module(env))
        except (gym.error.Error, ImportError) as error:
            raise ValueError(f"no env {env!r} to make tasks from: {error}") from None
        return env


class HGPOTaskData(vf.TaskData):
    info: dict[str, Any]
    """``env``, ``env_kwargs`` and ``seed``: what the episode is replayed from; ``task_key``."""


class HGPOTask(vf.Task[HGPOTaskData, vf.State, vf.TaskConfig]):
    @property
    def key(self) -> str:
        """Our ``task_key``: rollouts of one task share it, as our trainer's task groups do."""
        return str(self.data.info["task_key"])


class HGPOEnvConfig(vf.EnvConfig):
    agent: vf.AgentConfig = vf.AgentConfig()
    """The one seat: the policy that plays the env."""


def make_env(info: Mapping[str, Any]) -> gym.Env:
    """The env a task names, made as ``gymnasium.make`` makes it (``module:Id`` imports first)."""
    return gym.make(info["env"], **info["env_kwargs"])


class HGPOEnv(vf.Env[HGPOEnvConfig]):
    """Plays the task's env turn by turn: reply in, the memory's next prompt out."""

    async def run(self, task: HGPOTask, agents: vf.Agents) -> None:
        env = await asyncio.to_thread(make_env, task.data.info)
        try:
            prompt, info = await asyncio.to_thread(env.reset, seed=task.data.info["seed"])
            if prompt != task.data.prompt:
                raise RuntimeError(
                    f"{task.data.info['env']} seed {task.data.info['seed']} no longer opens with the "
                    "task's prompt: the env is not deterministic in its seed"
                )
            turns: list[dict[str, Any]] = []
            terminated = False
            async with agents.agent.interaction(task) as interaction:
                segment = await interaction.turn()
                while not segment.terminated:
                    asked = info
                    prompt, reward, terminated, truncated, info = await asyncio.to_thread(
                        env.step, segment.last_reply
                    )
                    turns.append(_turn(asked, float(reward), info))
                    if terminated or truncated:
                        break
                    segment = await interaction.turn(prompt)
            _record(interaction.trace, int(task.data.info["task_key"]), turns, info, terminated)
        finally:
            await asyncio.to_thread(env.close)


def _turn(asked: Mapping[str, Any], reward: float, info: Mapping[str, Any]) -> dict[str, Any]:
    """One assistant turn's entry of ``trace.info["hgpo"]["turns"]`` (:data:`TURN_FIELDS`):
    ``asked`` is the info of the prompt it answered, ``info`` the step's."""
    return {
        "fingerprints": [int(key) for key in asked["fingerprints"]],
        "action_key": int(info["action_key"]),
        "next_state": int(info["fingerprints"][0]),
        "reward": reward,
        "invalid": not info["action_valid"],
        "turn": asked["turn"],
    }


def _record(
    trace: vf.Trace, task_key: int, turns: list[dict[str, Any]], last: Mapping[str, Any], terminated: bool
) -> None:
    """The episode's keys and outcome on its trace, the env's reward as the trace's reward."""
    trace.info["hgpo"] = {
        "task_key": task_key,
        "won": bool(last["won"]),
        "score": float(last["score"]),
        "truncated": not terminated,  # by the env's step limit or verifiers' turn limit
        "turns": turns,
    }
    trace.record_reward("env_reward", sum(turn["reward"] for turn in turns))
    trace.record_metric("won", float(last["won"]))
    trace.record_metric("invalid_steps", float(sum(turn["invalid"] for turn in turns)))


class HGPOTaskset(vf.Taskset[HGPOTask, HGPOTasksetConfig]):
    """Tasks ``first_seed``, ``first_seed + 1``, ...: endless, as seeds are; ``take`` bounds it."""

    INFINITE = True

    def load(self) -> Iterator[HGPOTask]:
        env = make_env({"env": self.config.env, "env_kwargs": self.config.env_kwargs})
        try:
            for seed in itertools.count(self.config.first_seed):
                prompt, info = env.reset(seed=seed)
                data = {"env": self.config.env, "env_kwargs": self.config.env_kwargs, "seed": seed}
                yield HGPOTask(
                    HGPOTaskData(
                        name=f"{self.config.env}#{seed}",
                        prompt=prompt,
                        info={**data, "task_key": int(info["task_key"])},
                    ),
                    self.config.task,
                )
        finally:
            env.close()
