"""Clients of an HGPO OpenEnv server: OpenEnv's typed client, and a Gymnasium env over a session.

:class:`HGPOEnvClient` is an OpenEnv ``EnvClient`` (async; ``.sync()`` for plain code), for any
trainer that speaks OpenEnv. :class:`RemoteEnv` makes a served env look like
``gymnasium.make(ENV_ID)`` in process (the same prompts, rewards, ``terminated``/``truncated``
and ``info``, fingerprints as ints), which is what the pool's ``backend="openenv"`` hosts.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Sequence
from typing import Any, ClassVar, SupportsFloat

import gymnasium as gym
from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient
from openenv.core.env_server.types import State

from hgpo_env.serve.auth import auth_headers, read_token
from hgpo_env.serve.wire import HGPOAction, HGPOObservation, info_from_wire
from hgpo_env.textenv.core import TextSpace


class HGPOEnvClient(EnvClient[HGPOAction, HGPOObservation, State]):
    """OpenEnv client of ``python -m hgpo_env serve``; ``reset(seed=, task_id=)`` picks the task."""

    def _step_payload(self, action: HGPOAction) -> dict[str, Any]:
        return {"response": action.response}

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[HGPOObservation]:
        observation = HGPOObservation(
            **payload.get("observation", {}), reward=payload.get("reward"), done=payload.get("done", False)
        )
        return StepResult(
            observation=observation, reward=payload.get("reward"), done=payload.get("done", False)
        )

    def _parse_state(self, payload: dict[str, Any]) -> State:
        return State(**payload)


RETRY_AFTER = 30.0
"""Seconds a server that failed a reset goes to the back of the line before it is tried first again."""


def _describe(error: Exception, operation: str, timeout: float) -> str:
    """What went wrong, for ``env_error``: a timeout says how long it waited."""
    if isinstance(error, TimeoutError):
        return f"no answer to {operation} within {timeout:g} s"
    return f"{operation} failed: {type(error).__name__}: {error}"


class RemoteEnv(gym.Env[str, str]):
    """A served env as a local Gymnasium env: one OpenEnv session on the first server of
    ``servers`` that answers, starting from ``servers[primary]``.

    A reset starts at ``servers[primary]`` and goes down the list past every server that cannot
    take it (down, silent, full, refusing the token or the env id), so after a server is lost the
    next episodes run on the others. A server that failed is skipped for :data:`RETRY_AFTER`
    seconds, then tried first again, so a restarted server gets its share back. A step whose
    server is lost raises, naming the server, the operation and the timeout (the pool then
    truncates that episode). ``env_kwargs`` go to the server's env at reset (they must be JSON).

    Args:
        servers: base URLs (``http://host:port`` or ``ws://host:port``).
        primary: index of the server tried first.
        timeout: seconds to wait for one answer (and to connect).
        env_id: the env the servers must serve (checked at reset); None accepts any.
        token: the servers' bearer token; None reads ``$HGPO_SERVE_TOKEN`` (:mod:`~hgpo_env.serve.auth`).
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}

    def __init__(
        self,
        servers: Sequence[str],
        primary: int = 0,
        *,
        timeout: float = 60.0,
        env_id: str | None = None,
        token: str | None = None,
        **env_kwargs: Any,
    ) -> None:
        if not servers:
            raise ValueError("RemoteEnv needs at least one server URL")
        try:
            json.dumps(env_kwargs)
        except TypeError as error:
            raise TypeError(f"env arguments must be JSON to reach a server ({error})") from None
        self.env_id = env_id
        self.servers = list(servers)
        self.primary = primary % len(self.servers)
        self.timeout = timeout
        self.headers = auth_headers(token or read_token())
        self.env_kwargs = env_kwargs
        self.observation_space = TextSpace(2**24)
        self.action_space = TextSpace(2**24)
        self.server: str | None = None
        self._client: Any = None
        self._skip_until: dict[str, float] = {}

    def _connect(self, url: str) -> Any:
        client = HGPOEnvClient(
            base_url=url, connect_timeout_s=self.timeout, message_timeout_s=self.timeout, headers=self.headers
        )
        return client.sync()

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        task = (options or {}).get("task_id")
        request = {"seed": seed, "task_id": task, "env_kwargs": self.env_kwargs, "env_id": self.env_id}
        failures = []
        for url in self._order():
            try:
                if self._client is None or url != self.server:
                    self._drop()
                    self._client, self.server = self._connect(url), url
                result = self._client.reset(**request)
            except Exception as error:  # noqa: BLE001  (any refusal: try the next server)
                failures.append(f"{url}: {_describe(error, 'reset', self.timeout)}")
                self._skip_until[url] = time.monotonic() + RETRY_AFTER
                self._drop()
                continue
            self._skip_until.pop(url, None)
            info, _, _ = info_from_wire(result.observation.metadata)
            return result.observation.prompt, info
        raise ConnectionError("no server took the reset:\n" + "\n".join(failures))

    def _order(self) -> list[str]:
        """Servers from the primary on; those that failed lately last."""
        order = self.servers[self.primary :] + self.servers[: self.primary]
        now = time.monotonic()
        return sorted(order, key=lambda url: self._skip_until.get(url, 0.0) > now)

    @property
    def num_tasks(self) -> int | None:
        """How many tasks the served env's ``task_id`` selects (None: unbounded); needs a reset first."""
        if self._client is None:
            raise RuntimeError("call reset() before asking for num_tasks")
        return getattr(self._client.state(), "num_tasks", None)

    def step(self, action: str) -> tuple[str, SupportsFloat, bool, bool, dict[str, Any]]:
        if self._client is None:
            raise RuntimeError("call reset() before step()")
        try:
            result = self._client.step(HGPOAction(response=action))
        except TimeoutError as error:
            raise TimeoutError(f"{self.server}: {_describe(error, 'step', self.timeout)}") from error
        except Exception as error:
            raise RuntimeError(f"{self.server}: {_describe(error, 'step', self.timeout)}") from error
        info, terminated, truncated = info_from_wire(result.observation.metadata)
        return result.observation.prompt, float(result.reward or 0.0), terminated, truncated, info

    def _drop(self) -> None:
        if self._client is not None:
            with contextlib.suppress(Exception):  # a lost server cannot close politely
                self._client.close()
        self._client, self.server = None, None

    def close(self) -> None:
        self._drop()
        super().close()
