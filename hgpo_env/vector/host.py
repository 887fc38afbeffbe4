"""The worker side of a pool: many envs in one process, stepped back to back.

The same class serves the process backend (inside a spawned worker) and the Ray backend (as the
actor). A batch is answered env by env (a generator), so the pool can put a deadline on each env.
An exception in one env is caught and reported for that env only, so its neighbours in the same
worker keep their episodes.
"""

from __future__ import annotations

import contextlib
import os
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any, NamedTuple

import gymnasium as gym

EnvSpec = str | Callable[..., gym.Env]
"""A registered Gymnasium id (``"module:Id"`` imports ``module`` first), or a picklable callable
that takes the env kwargs and returns an env."""


class Reply(NamedTuple):
    """One env's answer to a command: ``value`` is the Gymnasium return tuple, or ``error`` says
    why there is none (``detail`` holds the traceback)."""

    env_index: int
    value: tuple[Any, ...] | None
    error: str | None = None
    detail: str | None = None


def sendable(reply: Reply, dumps: Callable[[Any], bytes]) -> Reply:
    """The reply, or, when ``dumps`` cannot serialise it, that env's error saying so (a worker
    that failed to send it would otherwise die and take its other envs' episodes along)."""
    try:
        dumps(reply)
    except Exception as error:  # noqa: BLE001  -- any serialisation failure is the env's
        what = f"{type(error).__name__}: {error}"
        return Reply(reply.env_index, None, f"its result cannot be sent to the pool: {what}", what)
    return reply


def make_env(env: EnvSpec, env_kwargs: Mapping[str, Any]) -> gym.Env:
    """Build one env from an id or a factory (importing this package registered the HGPO ids)."""
    if isinstance(env, str):
        return gym.make(env, **env_kwargs)
    return env(**env_kwargs)


class EnvHost:
    """Owns the envs with the given pool indices and runs batches of commands on them."""

    def __init__(self, env: EnvSpec, env_kwargs: Mapping[str, Any], env_indices: Sequence[int]) -> None:
        self.envs = {index: make_env(env, env_kwargs) for index in env_indices}

    def pid(self) -> int:
        """The hosting process, so the pool can report (and tests can kill) it."""
        return os.getpid()

    def reset(self, requests: Sequence[tuple[int, int | None, dict[str, Any] | None]]) -> Iterator[Reply]:
        """Reset each ``(env_index, seed, options)`` in turn."""
        for index, seed, options in requests:
            yield self._run(index, "reset", self.envs[index].reset, seed=seed, options=options)

    def step(self, requests: Sequence[tuple[int, str]]) -> Iterator[Reply]:
        """Step each ``(env_index, action)`` in turn; rewards become plain floats."""
        for index, action in requests:
            yield self._run(index, "step", self._step, index, action)

    def close(self) -> None:
        for env in self.envs.values():
            with contextlib.suppress(Exception):  # best effort: the process ends next
                env.close()

    def _step(self, index: int, action: str) -> tuple[Any, ...]:
        obs, reward, terminated, truncated, info = self.envs[index].step(action)
        return obs, float(reward), bool(terminated), bool(truncated), info

    @staticmethod
    def _run(index: int, what: str, call: Callable[..., tuple[Any, ...]], *args: Any, **kwargs: Any) -> Reply:
        try:
            return Reply(index, call(*args, **kwargs))
        except Exception as error:  # noqa: BLE001  -- containing env faults is the point
            return Reply(
                index, None, f"env {what} raised {type(error).__name__}: {error}", traceback.format_exc()
            )


class ConcurrentEnvHost(EnvHost):
    """For envs that wait rather than compute (sessions on env servers): a batch's envs run at
    once, one thread each, and each reply is sent as it comes, so a silent server costs a batch
    one timeout, not one per env it hosts."""

    def __init__(self, env: EnvSpec, env_kwargs: Mapping[str, Any], env_indices: Sequence[int]) -> None:
        super().__init__(env, env_kwargs, env_indices)
        self._threads = ThreadPoolExecutor(max_workers=max(1, len(self.envs)), thread_name_prefix="hgpo-env")

    def reset(self, requests: Sequence[tuple[int, int | None, dict[str, Any] | None]]) -> Iterator[Reply]:
        calls = [
            (index, "reset", self.envs[index].reset, (), {"seed": seed, "options": options})
            for index, seed, options in requests
        ]
        return self._at_once(calls)

    def step(self, requests: Sequence[tuple[int, str]]) -> Iterator[Reply]:
        return self._at_once([(index, "step", self._step, (index, action), {}) for index, action in requests])

    def _at_once(
        self, calls: Sequence[tuple[int, str, Callable[..., Any], tuple[Any, ...], dict[str, Any]]]
    ) -> Iterator[Reply]:
        futures = [
            self._threads.submit(self._run, index, what, call, *args, **kwargs)
            for index, what, call, args, kwargs in calls
        ]
        for future in as_completed(futures):
            yield future.result()

    def close(self) -> None:
        super().close()
        self._threads.shutdown(wait=False, cancel_futures=True)
