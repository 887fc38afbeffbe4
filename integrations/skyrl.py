"""HGPO-* environments as skyrl-gym text envs (skyrl-gym 0.4), made by id with ``skyrl_gym.make``.

SkyRL builds an env per sample as ``skyrl_gym.make(id, env_config=..., extras=row)``: the
``env_config`` here holds ``gymnasium.make`` arguments (``history_length``, ``max_steps``, ...),
the dataset row's extras name the task (``task_id`` and/or ``seed``) and may name the group
(``group_id``; else the task spec). Each observation is the env's K-step prompt as a user message,
and every step's metadata carries the fingerprints of the prompt it returns, the step index,
the group id and the env's validity, ``won`` and ``score``: what a step-level estimator groups by.
With ``history_length=0`` the prompts carry no history, for SkyRL's growing conversations.

Chat envs (``prompt_format="chat"`` in ``env_config``) speak SkyRL's messages natively: ``init``
returns the env's system message and first observation, each step the next observation alone (a
``tool`` message after a reply that called a tool, else a user message), since SkyRL keeps the
conversation. That conversation is the memory, so a chat env takes ``history_length=0`` and its
level-0 key covers what each step adds (the state). SkyRL renders its template without the env's
tool schemas unless given them: :func:`tool_schemas` gives the ``tools`` for the generator's
``chat_template_kwargs``.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import gymnasium as gym

import hgpo_env
from hgpo_env.prompting.chat import Messages
from integrations._framework import conversation_env_kwargs, missing_framework, turn_message

try:
    from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput
    from skyrl_gym.envs.registration import register, registry
except ImportError as error:
    raise missing_framework("skyrl", error) from error

SKYRL_IDS = {env_id.removesuffix("-v0").lower(): env_id for env_id in hgpo_env.ENV_CLASSES}
"""skyrl-gym id -> Gymnasium id: ``hgpo-rooms``, ``hgpo-alfworld``, ``hgpo-webshop``."""


class HGPOTextEnv(BaseTextEnv):
    """One HGPO-* env (``env_id``) behind skyrl-gym's ``init`` / ``step`` text API."""

    def __init__(
        self,
        env_id: str,
        env_config: Mapping[str, Any] | None = None,
        extras: Mapping[str, Any] | None = None,
    ):
        super().__init__()
        self.env = gym.make(env_id, **conversation_env_kwargs(env_config or {}, "the SkyRL adapter"))
        self.chat = isinstance(self.env.observation_space, Messages)
        extras = dict(extras or {})
        task_id, seed = extras.get("task_id"), extras.get("seed")
        if task_id is None and seed is None:
            raise ValueError(
                f"extras must name the task with 'task_id' and/or 'seed' (got {sorted(extras)}), so that "
                "the samples of one prompt play the same task"
            )
        self.task_id = None if task_id is None else int(task_id)
        self.seed = None if seed is None else int(seed)
        self.group_id = extras.get("group_id", f"task={self.task_id},seed={self.seed}")
        self.max_turns = self.env.unwrapped.max_steps
        self.info: dict[str, Any] = {}

    def _metadata(self) -> dict[str, Any]:
        return {
            "fingerprints": tuple(self.info["fingerprints"]),
            "step": self.turns,
            "group_id": self.group_id,
            "action_valid": self.info.get("action_valid", True),
            "won": bool(self.info["won"]),
            "score": float(self.info["score"]),
        }

    def init(self, prompt: Any = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """The first prompt (the dataset's ``prompt`` is not used: the env writes its own)."""
        options = None if self.task_id is None else {"task_id": self.task_id}
        observation, self.info = self.env.reset(seed=self.seed, options=options)
        self.turns = 0
        return (observation if self.chat else [{"role": "user", "content": observation}]), self._metadata()

    def step(self, action: str) -> BaseTextEnvStepOutput:
        observation, reward, terminated, truncated, self.info = self.env.step(action)
        self.turns += 1
        done = bool(terminated or truncated)
        return BaseTextEnvStepOutput(
            observations=[] if done else [turn_message(observation, self.info)],
            reward=float(reward),
            done=done,
            metadata=self._metadata(),
            postprocessed_action=self.info.get("parsed_action"),
        )

    def close(self) -> None:
        self.env.close()


def tool_schemas(env_id: str, env_config: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """The tool schemas of the chat env ``env_config`` makes: the ``tools`` SkyRL's generator
    must render with (``generator.chat_template_kwargs``), as SkyRL passes none of its own."""
    env = gym.make(env_id, **conversation_env_kwargs(env_config or {}, "the SkyRL adapter"))
    try:
        return list(env.reset(seed=0)[1].get("tools", []))
    finally:
        env.close()


def register_envs() -> None:
    """Register ``hgpo-rooms``, ``hgpo-alfworld`` and ``hgpo-webshop`` with skyrl-gym (idempotent)."""
    for skyrl_id, env_id in SKYRL_IDS.items():
        if skyrl_id not in registry:
            register(id=skyrl_id, entry_point=functools.partial(HGPOTextEnv, env_id))


register_envs()
