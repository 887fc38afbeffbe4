"""An OpenEnv server for any registered env: ``python -m hgpo_env serve ENV_ID``.

The app is OpenEnv's own (``create_app``): episodes run over its ``/ws`` WebSocket, one env per
connection; its stateless HTTP ``/reset`` and ``/step`` make a fresh env per request and are of
no use for an episode. Each session's env is ``gymnasium.make(ENV_ID, **kwargs)``: the server's
keyword arguments, updated by a reset's ``env_kwargs`` (a trainer's evaluation split, say). A
reset takes ``seed`` and ``task_id`` (or the Task API's ``split`` and ``index``), so the members
of a group play one task, as their ``initial_fingerprint`` shows.

Nothing is authenticated: the server binds 127.0.0.1 unless told otherwise; put it on another
address only inside a network you trust.
"""

from __future__ import annotations

import typing
import uuid
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
from openenv.core.env_server import Environment, create_app
from openenv.core.env_server.types import ConcurrencyConfig, EnvironmentMetadata, State

import hgpo_env  # noqa: F401  (registers the HGPO-* ids)
from hgpo_env.serve.wire import MAX_RESPONSE_CHARS, HGPOAction, HGPOObservation, info_to_wire


class HGPOEnvironment(Environment[HGPOAction, HGPOObservation, State]):
    """One session's env, made at its first reset (and again when a reset changes its kwargs)."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, env_id: str, env_kwargs: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        self.env_id = env_id
        self.default_kwargs = dict(env_kwargs or {})
        self.env: gym.Env | None = None
        self._kwargs: dict[str, Any] | None = None
        self._state = State(episode_id=None, step_count=0)

    def reset(
        self,
        seed: int | None = None,
        episode_id: str | None = None,
        task_id: int | None = None,
        split: str | None = None,
        index: int | None = None,
        env_kwargs: dict[str, Any] | None = None,
        env_id: str | None = None,
        **unknown: Any,
    ) -> HGPOObservation:
        """Start an episode; ``task_id`` (or ``index``) picks the task, ``split`` the env's split.

        Unknown arguments are refused (OpenEnv would drop them silently, and a group whose seed
        was dropped would play different tasks)."""
        if unknown:
            raise ValueError(
                f"unknown reset arguments {sorted(unknown)}: reset takes seed, episode_id, task_id, "
                "split, index, env_kwargs and env_id"
            )
        if env_id is not None and env_id != self.env_id:
            raise ValueError(f"this server serves {self.env_id}, not {env_id}")
        if index is not None and task_id is not None and index != task_id:
            raise ValueError(f"index {index} and task_id {task_id} disagree: give one")
        kwargs = {
            **self.default_kwargs,
            **(env_kwargs or {}),
            **({"split": split} if split is not None else {}),
        }
        if self.env is None or kwargs != self._kwargs:
            self.close()
            self.env, self._kwargs = gym.make(self.env_id, **kwargs), kwargs
        task = task_id if task_id is not None else index
        prompt, info = self.env.reset(seed=seed, options=None if task is None else {"task_id": task})
        self._state = State(
            episode_id=episode_id or str(uuid.uuid4()),
            step_count=0,
            env_id=self.env_id,
            num_tasks=self.env.unwrapped.num_tasks,
        )
        return HGPOObservation(
            prompt=prompt, reward=0.0, done=False, metadata=info_to_wire(info, False, False)
        )

    def step(self, action: HGPOAction, timeout_s: float | None = None, **_: Any) -> HGPOObservation:
        if self.env is None:
            raise RuntimeError("no episode: send a reset first")
        if len(action.response) > MAX_RESPONSE_CHARS:
            raise ValueError(f"response of {len(action.response)} characters; at most {MAX_RESPONSE_CHARS}")
        prompt, reward, terminated, truncated, info = self.env.step(action.response)
        self._state.step_count += 1
        return HGPOObservation(
            prompt=prompt,
            reward=float(reward),
            done=bool(terminated or truncated),
            metadata=info_to_wire(info, terminated, truncated),
        )

    @property
    def state(self) -> State:
        """``episode_id`` and ``step_count``, plus ``env_id`` and ``num_tasks`` once a reset made the env."""
        return self._state

    def close(self) -> None:
        if self.env is not None:
            self.env.close()
            self.env = None

    def get_metadata(self) -> EnvironmentMetadata:
        return EnvironmentMetadata(
            name=self.env_id,
            description=f"{self.env_id} with the K-step memory and context fingerprints (hgpo)",
            version="1",
        )

    # ----------------------------------------------------------------- OpenEnv Task API
    def list_splits(self) -> list[str]:
        """The env's ``split`` choices where its signature names them."""
        made = gym.make(self.env_id, **self.default_kwargs)
        try:
            hint = typing.get_type_hints(type(made.unwrapped).__init__).get("split")
        finally:
            made.close()
        return list(typing.get_args(hint)) if typing.get_origin(hint) is typing.Literal else []

    def num_tasks(self, split: str) -> int:
        made = gym.make(self.env_id, **{**self.default_kwargs, "split": split})
        try:
            count = made.unwrapped.num_tasks
        finally:
            made.close()
        if count is None:  # OpenEnv answers 501: there is no count to give
            raise NotImplementedError(
                f"{self.env_id} generates tasks without end: any non-negative id is one"
            )
        return int(count)

    def list_tasks(self, split: str) -> list[dict[str, Any]]:
        return [self.get_task(split, index) for index in range(self.num_tasks(split))]

    def get_task(self, split: str, index: int) -> dict[str, Any]:
        if not 0 <= index < self.num_tasks(split):
            raise IndexError(f"task {index} out of range for split {split!r}")
        return {"split": split, "index": index, "task_id": index}


class InlineHGPOEnvironment(HGPOEnvironment):
    """Steps on the server's event loop instead of a thread per session: a third more steps per
    second for envs that compute (Rooms, WebShop, ALFWorld), at the cost of one slow step holding
    up the other sessions. Envs that wait on another process (the Java engines of TextWorld-Express
    and ScienceWorld) are better served with threads (``--threads``)."""

    async def reset_async(self, **kwargs: Any) -> HGPOObservation:
        return self.reset(**kwargs)

    async def step_async(
        self, action: HGPOAction, timeout_s: float | None = None, **_: Any
    ) -> HGPOObservation:
        return self.step(action)


def build_app(
    env_id: str,
    env_kwargs: Mapping[str, Any] | None = None,
    *,
    max_sessions: int = 64,
    session_timeout: float | None = None,
    threads: bool = False,
) -> Any:
    """The FastAPI app of OpenEnv's ``create_app`` serving ``env_id``; the env is made once here,
    so a bad id or argument fails at start-up rather than in the first session. ``threads`` runs
    each session's steps in OpenEnv's executor threads (:class:`InlineHGPOEnvironment` says when)."""
    gym.make(env_id, **dict(env_kwargs or {})).close()
    config = ConcurrencyConfig(max_concurrent_envs=max_sessions, session_timeout=session_timeout)
    environment = HGPOEnvironment if threads else InlineHGPOEnvironment
    return create_app(
        lambda: environment(env_id, env_kwargs),
        HGPOAction,
        HGPOObservation,
        env_name=env_id,
        concurrency_config=config,
    )


def serve(
    env_id: str,
    env_kwargs: Mapping[str, Any] | None = None,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    max_sessions: int = 64,
    session_timeout: float | None = None,
    threads: bool = False,
) -> None:
    """Serve until SIGINT or SIGTERM, which stop taking sessions and close the open ones."""
    import uvicorn

    app = build_app(
        env_id, env_kwargs, max_sessions=max_sessions, session_timeout=session_timeout, threads=threads
    )
    uvicorn.run(app, host=host, port=port, log_level="warning", ws_max_size=16 * 2**20)
