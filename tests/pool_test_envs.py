"""A test-only env for the GroupedEnvPool tests.

It lives in a module of its own, not in a test file, so that spawned workers and Ray actors can
import it by name (``tests/`` is on their ``sys.path``; see the tests' ``sys.path`` guard).
"""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from typing import Any

import gymnasium as gym

from hgpo_env import make_agent_env
from hgpo_env.textenv.core import TextEnv

COMMANDS = ["tick", "finish", "raise", "hang", "crash", "exit", "unpicklable"]


class ProbeEnv(TextEnv):
    """Counts ticks; "finish" wins, "raise" raises, "hang" sleeps for an hour, "crash" segfaults
    its process, "exit" ends it with code 3. With ``unique_start`` every instance starts in a
    state of its own; while the file ``refuse_if_exists`` exists, no instance can be made."""

    env_family = "probe"
    prompt_intro = "A test world that counts."

    def __init__(
        self,
        *,
        unique_start: bool = False,
        refuse_if_exists: str | None = None,
        max_steps: int = 5,
        **kwargs: Any,
    ) -> None:
        if refuse_if_exists and os.path.exists(refuse_if_exists):
            raise RuntimeError(f"the probe env refuses to start while {refuse_if_exists} exists")
        super().__init__(max_steps=max_steps, **kwargs)
        self.unique_start = unique_start

    @property
    def num_tasks(self) -> None:
        return None

    def _sample_task_id(self) -> int:
        return int(self.np_random.integers(1000))

    def _start_task(self, task_id: int) -> str:
        self.count, self.finished = 0, False
        self.tag = uuid.uuid4().hex if self.unique_start else ""
        return self._describe()

    def _apply(self, command: str) -> str:
        if command == "raise":
            raise RuntimeError("the probe env was asked to raise")
        if command == "hang":
            time.sleep(3600)
        if command == "crash":
            os.kill(os.getpid(), signal.SIGSEGV)
        if command == "exit":
            os._exit(3)
        self.finished = command == "finish"
        self.count += command == "tick"
        return self._describe()

    def _describe(self) -> str:
        return f"Count {self.count}. {self.tag}".strip()

    @property
    def admissible_actions(self) -> list[str]:
        return list(COMMANDS)

    @property
    def task(self) -> str:
        return f"count for task {self.task_id}"

    @property
    def won(self) -> bool:
        return self.finished


class UnpicklableInfo(gym.Wrapper):
    """Answers "unpicklable" like "tick", with a lock (which no pickle takes) in its info."""

    def step(self, action: str) -> tuple[Any, ...]:
        if action != "unpicklable":
            return self.env.step(action)
        obs, reward, terminated, truncated, info = self.env.step("tick")
        return obs, reward, terminated, truncated, {**info, "lock": threading.Lock()}


def make_probe(**kwargs: Any) -> gym.Env[str, str]:
    """The probe env as an agent env taking plain commands."""
    return UnpicklableInfo(make_agent_env(ProbeEnv, response_format="plain", **kwargs))


if "Probe-v0" not in gym.registry:
    gym.register("Probe-v0", entry_point=make_probe)
