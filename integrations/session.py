"""An HGPO-* env played as one conversation: the environment-level adapters' shared driver.

At environment level a framework keeps the whole episode in one growing conversation, so the
conversation is the memory: the env is made with ``history_length=0`` and every turn's text is
the env's prompt for the current state (task, step count, observation, admissible actions); a
chat env's turns are its messages (:func:`~integrations._framework.turn_message`).
The session keeps what the framework's reward needs: the env reward summed over the episode,
the invalid steps, ``won`` and the env-native ``score``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym

import hgpo_env  # noqa: F401  (registers the HGPO-* ids)
from integrations._framework import conversation_env_kwargs


class EnvSession:
    """One env, one episode at a time: a reply in, the env's prompt out (text, or a chat env's
    messages).

    Args:
        env_id: a registered ``HGPO-*`` id.
        invalid_penalty: subtracted from :attr:`episode_return` per invalid step (0.1, as the
            step-level estimators' default).
        servers: env server URLs (``python -m hgpo_env serve``): the env is then a session on
            one of them (:class:`~hgpo_env.serve.client.RemoteEnv`) instead of made here.
        env_kwargs: passed to ``gymnasium.make`` (``response_format``, ``max_steps``, env options).
    """

    def __init__(
        self,
        env_id: str,
        *,
        invalid_penalty: float = 0.1,
        servers: Sequence[str] | None = None,
        **env_kwargs: Any,
    ) -> None:
        if invalid_penalty < 0:
            raise ValueError(f"invalid_penalty must be >= 0, got {invalid_penalty!r}")
        env_kwargs = conversation_env_kwargs(env_kwargs, "an env session")
        env_kwargs.setdefault("history_length", 0)
        if servers:
            from hgpo_env.serve.client import RemoteEnv

            self.env: gym.Env = RemoteEnv(servers, env_id=env_id, **env_kwargs)
        else:
            self.env = gym.make(env_id, **env_kwargs)
        self.invalid_penalty = float(invalid_penalty)
        self.info: dict[str, Any] = {}
        self.total_reward = 0.0
        self.invalid_steps = 0
        self.steps = 0
        self.done = True

    def reset(self, *, task_id: int | None = None, seed: int | None = None) -> Any:
        """Start an episode on task ``task_id`` (or the task ``seed`` draws); returns the first prompt."""
        options = None if task_id is None else {"task_id": int(task_id)}
        prompt, self.info = self.env.reset(seed=None if seed is None else int(seed), options=options)
        self.total_reward, self.invalid_steps, self.steps, self.done = 0.0, 0, 0, False
        return prompt

    def step(self, response: str) -> tuple[Any, float, bool]:
        """Send one response; returns the next prompt, the step's reward and whether the episode ended."""
        if self.done:
            raise RuntimeError("the episode is over: call reset() before stepping again")
        prompt, reward, terminated, truncated, self.info = self.env.step(response)
        self.total_reward += float(reward)
        self.invalid_steps += not self.info["action_valid"]
        self.steps += 1
        self.done = bool(terminated or truncated)
        return prompt, float(reward), self.done

    @property
    def episode_return(self) -> float:
        """The episode's env reward minus ``invalid_penalty`` per invalid step."""
        return self.total_reward - self.invalid_penalty * self.invalid_steps

    @property
    def won(self) -> bool:
        return bool(self.info.get("won", False))

    @property
    def score(self) -> float:
        return float(self.info.get("score", 0.0))

    def close(self) -> None:
        self.env.close()
