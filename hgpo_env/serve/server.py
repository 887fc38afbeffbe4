"""An OpenEnv server for any registered env: ``python -m hgpo_env serve ENV_ID``.

The app is OpenEnv's own (``create_app``): episodes run over its ``/ws`` WebSocket, one env per
connection (its HTTP session routes are left out unless asked for: :func:`build_app`). Each
session's env is ``gymnasium.make(ENV_ID, **kwargs)``: the server's keyword arguments, which a
reset's ``env_kwargs`` may only repeat, or change where the operator allows it
(:mod:`hgpo_env.serve.choices`; the split is the client's). A reset takes ``seed`` and ``task_id``
(or the Task API's ``split`` and ``index``), so the members of a group play one task, as their
``task_key`` and ``initial_fingerprint`` show (the pool checks them).

With a token (:mod:`hgpo_env.serve.auth`) every route and WebSocket upgrade needs it; without
one the server binds loopback only, unless the operator says ``insecure``.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import reprlib
import signal
import threading
import typing
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import gymnasium as gym
import uvicorn
from fastapi import HTTPException
from openenv.core.env_server import Environment, create_app
from openenv.core.env_server.types import ConcurrencyConfig, EnvironmentMetadata, State

import hgpo_env  # noqa: F401  (registers the HGPO-* ids)
from hgpo_env.serve.auth import BearerAuth, check_bind
from hgpo_env.serve.choices import Allowed, ClientChoices, redact
from hgpo_env.serve.connections import (
    GoneClientsUnlogged,
    guarded_protocol,
    pending_cap,
    raise_open_files_limit,
    unread_replies_dropped,
)
from hgpo_env.serve.frames import FrameGuard, stop_checker
from hgpo_env.serve.guards import BodyLimit, OriginCheck
from hgpo_env.serve.idle import IdleClose
from hgpo_env.serve.options import ServerOptions
from hgpo_env.serve.wire import MAX_RESPONSE_CHARS, HGPOAction, HGPOObservation, info_to_wire
from hgpo_env.textenv.registration import import_env_module

logger = logging.getLogger(__name__)


class HGPOEnvironment(Environment[HGPOAction, HGPOObservation, State]):
    """One session's env, made at its first reset (and again when a reset changes its kwargs).

    Once the server closes the session (its client left, or it sat idle past the session
    timeout: :mod:`~hgpo_env.serve.idle` closes the socket then) it stays closed: a message that
    still reaches it gets an error saying so, and the server never makes an env beyond
    ``--max-sessions``."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(
        self,
        env_id: str,
        env_kwargs: Mapping[str, Any] | None = None,
        choices: ClientChoices | None = None,
        catalog: TaskCatalog | None = None,
    ) -> None:
        super().__init__()
        self.env_id = env_id
        self.default_kwargs = dict(env_kwargs or {})
        self.choices = choices or ClientChoices(env_id, self.default_kwargs)
        self.catalog = catalog or TaskCatalog(env_id, self.default_kwargs)
        self.env: gym.Env | None = None
        self._kwargs: dict[str, Any] | None = None
        self._state = State(episode_id=None, step_count=0)
        self._closed = False

    def reset(self, **request: Any) -> HGPOObservation:
        """Start an episode: ``seed``, ``task_id`` (or ``index``) picks the task, ``split`` the env's
        split, ``env_kwargs`` what the operator lets clients choose, ``env_id`` is checked,
        ``episode_id`` names the episode.

        Unknown arguments are refused (OpenEnv would drop them silently, and a group whose seed
        was dropped would play different tasks)."""
        kwargs, start = self._parse(**request)
        self._make(kwargs)
        return self._start(*start)

    def _parse(
        self,
        seed: int | None = None,
        episode_id: str | None = None,
        task_id: int | None = None,
        split: str | None = None,
        index: int | None = None,
        env_kwargs: dict[str, Any] | None = None,
        env_id: str | None = None,
        **unknown: Any,
    ) -> tuple[dict[str, Any], tuple[int | None, str | None, int | None]]:
        """The env arguments a reset asks for, checked, and ``(seed, episode_id, task)``."""
        self._check_open()
        if unknown:
            raise ValueError(
                f"unknown reset arguments {sorted(unknown)}: reset takes seed, episode_id, task_id, "
                "split, index, env_kwargs and env_id"
            )
        if env_id is not None and _bare_id(env_id) != _bare_id(self.env_id):
            raise ValueError(f"this server serves {self.env_id}, not {env_id}")
        if index is not None and task_id is not None and index != task_id:
            raise ValueError(f"index {index} and task_id {task_id} disagree: give one")
        kwargs = self.choices.resolve(
            {**(env_kwargs or {}), **({"split": split} if split is not None else {})}
        )
        return kwargs, (seed, episode_id, task_id if task_id is not None else index)

    def _needs_env(self, kwargs: Mapping[str, Any]) -> bool:
        return self.env is None or kwargs != self._kwargs

    def _make(self, kwargs: dict[str, Any]) -> None:
        """Make the session's env with ``kwargs`` unless it already has that one."""
        if self._needs_env(kwargs):
            self._drop_env()
            with _redacted(self.default_kwargs):
                self.env, self._kwargs = gym.make(self.env_id, **kwargs), kwargs

    def _start(self, seed: int | None, episode_id: str | None, task: int | None) -> HGPOObservation:
        assert self.env is not None
        try:
            with _redacted(self.default_kwargs):
                prompt, info = self.env.reset(seed=seed, options=None if task is None else {"task_id": task})
        except RuntimeError:
            # gymnasium's env checker wrapper breaks every later step of an env whose first reset
            # raised: the next reset makes a fresh env instead
            self._drop_env()
            raise
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
        self._check_open()
        if self.env is None:
            raise RuntimeError("no episode: send a reset first")
        if len(action.response) > MAX_RESPONSE_CHARS:
            raise ValueError(f"response of {len(action.response)} characters; at most {MAX_RESPONSE_CHARS}")
        with _redacted(self.default_kwargs):
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

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(
                "this session was closed by the server (idle past its session timeout, or the server "
                "is stopping): open a new connection"
            )

    def _drop_env(self) -> None:
        if self.env is not None:
            self.env.close()
            self.env = None

    def close(self) -> None:
        self._drop_env()
        self._closed = True

    def get_metadata(self) -> EnvironmentMetadata:
        return EnvironmentMetadata(
            name=self.env_id,
            description=f"{self.env_id} with the K-step memory and context fingerprints (hgpo)",
            version="1",
        )

    # ----------------------------------------------------------------- OpenEnv Task API
    # Coroutines, so OpenEnv awaits them: the envs they need are built in a thread, once per
    # split (TaskCatalog), and a listing never holds up the sessions stepping on the event loop.
    async def list_splits(self) -> list[str]:
        """The env's ``split`` choices where its signature names them."""
        return await asyncio.to_thread(self.catalog.splits)

    async def num_tasks(self, split: str) -> int:
        count = await asyncio.to_thread(self.catalog.count, split)  # a refusal is an HTTPException
        if count is None:  # OpenEnv answers 501: there is no count to give
            raise NotImplementedError(
                f"{self.env_id} generates tasks without end: any non-negative id is one"
            )
        return count

    async def list_tasks(self, split: str) -> list[dict[str, Any]]:
        return [_task(split, index) for index in range(await self.num_tasks(split))]

    async def get_task(self, split: str, index: int) -> dict[str, Any]:
        if not 0 <= index < await self.num_tasks(split):
            raise IndexError(f"task {index} out of range for split {split!r}")
        return _task(split, index)


def _task(split: str, index: int) -> dict[str, Any]:
    return {"split": split, "index": index, "task_id": index}


class TaskCatalog:
    """The splits and task counts of the served env, each found once (an env built per split)
    and shared by every session: listings cost one env, not one per task."""

    def __init__(
        self, env_id: str, env_kwargs: Mapping[str, Any], splits: Sequence[str] | None = None
    ) -> None:
        self.env_id = env_id
        self.env_kwargs = dict(env_kwargs)
        self._lock = threading.Lock()
        self._splits = None if splits is None else list(splits)  # None: read from an env when asked
        self._counts: dict[str, int | HTTPException | None] = {}

    def splits(self) -> list[str]:
        with self._lock:
            if self._splits is None:
                self._splits = self._read(self.env_kwargs, declared_splits)
            return list(self._splits)

    def count(self, split: str) -> int | None:
        """Tasks in ``split`` (None: unbounded). A split the env does not declare is refused (400)
        before any env is built, so strangers cannot make the server build envs at will; one the
        server cannot build (its data is missing) is refused (500) with one log line, once: the
        answer is remembered, and no client's request is ever a traceback in the log."""
        named = self.splits()
        if split not in named:
            raise HTTPException(400, f"no split {reprlib.repr(split)}: this env has {named}")
        with self._lock:
            if split not in self._counts:
                try:
                    found = self._read({**self.env_kwargs, "split": split}, lambda env: env.num_tasks)
                    self._counts[split] = None if found is None else int(found)
                except RuntimeError as error:  # the env's error, redacted
                    logger.warning("the %r split cannot be served: %s", split, error)
                    self._counts[split] = HTTPException(500, f"the {split!r} split cannot be served: {error}")
            count = self._counts[split]
        if isinstance(count, HTTPException):
            raise count
        return count

    def _read(self, kwargs: Mapping[str, Any], read: Any) -> Any:
        """``read`` of a freshly built env (unwrapped), which is closed after."""
        with _redacted(self.env_kwargs):
            made = gym.make(self.env_id, **kwargs)
        try:
            return read(made.unwrapped)
        finally:
            made.close()


def declared_splits(env: Any) -> list[str]:
    """The splits an (unwrapped) env serves: its ``splits`` attribute where it declares them (they
    may depend on its arguments), else the ``Literal`` choices of its ``split`` parameter, else
    the one split it was made with (an env without a ``split`` has none)."""
    if getattr(env, "splits", None):
        return list(env.splits)
    hint = typing.get_type_hints(type(env).__init__).get("split")
    if typing.get_origin(hint) is typing.Literal:
        return list(typing.get_args(hint))
    return [env.split] if isinstance(getattr(env, "split", None), str) else []


@contextlib.contextmanager
def _redacted(server_kwargs: Mapping[str, Any]) -> Iterator[None]:
    """An env's error as the client sees it: its type and message, without the server's argument
    values or paths (:func:`~hgpo_env.serve.choices.redact`)."""
    try:
        yield
    except Exception as error:  # noqa: BLE001  (every env error goes to the client, redacted)
        text = redact(f"{type(error).__name__}: {error}", server_kwargs.values())
        raise RuntimeError(
            text if len(text) <= MAX_ERROR_CHARS else text[:MAX_ERROR_CHARS] + " ..."
        ) from None


def _bare_id(env_id: str) -> str:
    """``MyEnv-v0`` of ``my_pkg:MyEnv-v0``: a client may name the module the server imported."""
    return env_id.rpartition(":")[2]


class InlineHGPOEnvironment(HGPOEnvironment):
    """Steps on the server's event loop instead of a thread per session: a third more steps per
    second for envs that compute (Rooms, WebShop, ALFWorld), at the cost of one slow step holding
    up the other sessions. Envs are still built in a thread (a WebShop or ALFWorld env takes
    seconds). Envs that wait on another process (the Java engines of TextWorld-Express and
    ScienceWorld) are better served with threads (``--threads``)."""

    async def reset_async(self, **request: Any) -> HGPOObservation:
        kwargs, start = self._parse(**request)
        if self._needs_env(kwargs):
            await asyncio.to_thread(self._make, kwargs)
        return self._start(*start)

    async def step_async(
        self, action: HGPOAction, timeout_s: float | None = None, **_: Any
    ) -> HGPOObservation:
        return self.step(action)


GC_THRESHOLDS = (20_000, 20, 100)
"""The server's cyclic-GC thresholds (CPython's default: 700, 10, 10). Every collection walks the
objects of every open session, so with the default a server holding 1,024 sessions spent its time
collecting: its steps/s fell 13 % below 256 sessions' and its p99 more than doubled
(``benchmarks/serve_throughput.py``). Cycles are freed less often: memory, not correctness."""
MAX_FRAME_BYTES = 4 * 2**20
"""Largest WebSocket frame a server reads: a response at the cap (``MAX_RESPONSE_CHARS``) with room to spare."""
MAX_ERROR_CHARS = 2000
"""Longest env error a client is sent (an env may echo the client's own huge input)."""
HTTP_SESSION_ROUTES = frozenset({"/reset", "/step", "/state", "/mcp"})
"""OpenEnv's routes that make envs outside the session cap (off unless asked for)."""


def build_app(
    env_id: str,
    env_kwargs: Mapping[str, Any] | None = None,
    *,
    max_sessions: int = 64,
    session_timeout: float | None = None,
    threads: bool = False,
    token: str | None = None,
    allow: Sequence[str] = (),
    http_sessions: bool = False,
    allow_origins: Sequence[str] = (),
) -> Any:
    """The FastAPI app of OpenEnv's ``create_app`` serving ``env_id``; the env is made once here,
    so a bad id or argument fails at start-up rather than in the first session (and its splits
    are known before any client asks). ``threads`` runs each session's steps in OpenEnv's executor
    threads (:class:`InlineHGPOEnvironment` says when); ``token`` makes every request and upgrade
    carry it (:class:`~hgpo_env.serve.auth.BearerAuth`);
    ``allow`` names the env arguments clients may set (``KEY`` or ``KEY=LOW..HIGH``);
    ``allow_origins`` the browser origins whose WebSocket upgrades are accepted (none by default:
    :mod:`~hgpo_env.serve.guards`, which also caps every HTTP body).

    Episodes run over ``/ws``, one env per connection, under ``max_sessions``. OpenEnv's HTTP
    ``/reset``, ``/step``, ``/state`` and ``/mcp`` routes make envs outside that cap (a stateless
    reset per request, MCP sessions that nothing reclaims without a timeout): they are left out
    unless ``http_sessions``."""
    made = gym.make(env_id, **dict(env_kwargs or {}))
    try:
        splits = declared_splits(made.unwrapped)
    finally:
        made.close()
    choices = ClientChoices(env_id, dict(env_kwargs or {}), [Allowed.parse(text) for text in allow])
    catalog = TaskCatalog(env_id, dict(env_kwargs or {}), splits)
    config = ConcurrencyConfig(max_concurrent_envs=max_sessions, session_timeout=session_timeout)
    environment = HGPOEnvironment if threads else InlineHGPOEnvironment
    app = create_app(
        lambda: environment(env_id, env_kwargs, choices, catalog),
        HGPOAction,
        HGPOObservation,
        env_name=env_id,
        concurrency_config=config,
    )
    if not http_sessions:
        app.router.routes[:] = [
            r for r in app.router.routes if getattr(r, "path", None) not in HTTP_SESSION_ROUTES
        ]
    app.add_middleware(FrameGuard)
    if session_timeout is not None:
        app.add_middleware(IdleClose, timeout=session_timeout)
    app.add_middleware(BodyLimit)
    app.add_middleware(OriginCheck, allowed=allow_origins)
    if token is not None:
        app.add_middleware(BearerAuth, token=token)  # outermost: strangers reach nothing
    return app


def serve(
    env_id: str, env_kwargs: Mapping[str, Any] | None = None, options: ServerOptions = ServerOptions()
) -> None:
    """Serve until SIGINT or SIGTERM, which stop taking sessions, give the open ones
    ``options.shutdown_grace`` seconds to close whatever the clients do (sessions still busy then
    are cancelled) and exit within :data:`FORCED_EXIT_AFTER_S` more; print one line with the URL
    once sessions are accepted, and one on the signal.
    A ``host`` other machines can reach needs a ``token``, or ``insecure``; ``ssl_certfile`` (and
    ``ssl_keyfile``) serve ``https``/``wss``, so the token does not cross the network in clear text.
    :class:`~hgpo_env.serve.options.ServerOptions` lists every option with its default.

    WebSocket frames are capped at :data:`MAX_FRAME_BYTES` and never compressed: with
    permessage-deflate, 15 KB on the wire inflated to 15 MB and held every session for seconds.
    A connection must complete its request's headers within ``request_timeout`` seconds; an
    address may hold ``max_pending_per_address`` connections that have not for over a second, and
    all addresses together half the open files the process may have (its soft limit, raised to the
    hard one and printed at start-up): at either cap the oldest such connection is closed to
    admit a new one. A WebSocket whose replies wait unread for ``send_timeout`` seconds is dropped
    (:mod:`~hgpo_env.serve.connections`)."""
    o = options
    problem = o.problem()
    if problem:
        raise ValueError(problem)
    check_bind(o.host, o.token, o.insecure)
    app = build_app(
        env_id,
        env_kwargs,
        max_sessions=o.max_sessions,
        session_timeout=o.session_timeout,
        threads=o.threads,
        token=o.token,
        allow=o.allow,
        http_sessions=o.http_sessions,
        allow_origins=o.allow_origins,
    )
    open_files = raise_open_files_limit()
    most_pending = pending_cap(open_files)
    if open_files is not None:
        print(
            f"open files: {open_files}; at most {most_pending} connections may wait for their request headers",
            flush=True,
        )
    http = guarded_protocol(o.request_timeout, o.max_pending_per_address, most_pending)
    gc.set_threshold(*GC_THRESHOLDS)
    config = uvicorn.Config(
        app,
        host=o.host,
        port=o.port,
        log_level="warning",
        http=http,
        ws=unread_replies_dropped(o.send_timeout),
        ws_max_size=MAX_FRAME_BYTES,
        ws_per_message_deflate=False,
        timeout_keep_alive=o.keep_alive,
        timeout_graceful_shutdown=o.shutdown_grace,
        limit_concurrency=o.limit_concurrency,
        ssl_certfile=o.ssl_certfile,
        ssl_keyfile=o.ssl_keyfile,
    )
    logging.getLogger("uvicorn.error").addFilter(GoneClientsUnlogged())
    scheme = "https" if o.ssl_certfile else "http"
    ready = f"serving {import_env_module(env_id)} at {scheme}://{o.host}:{o.port} ({o.max_sessions} sessions"
    ready += ", token required)" if o.token else ", no token)"
    try:
        _AnnouncingServer(config, ready, o.shutdown_grace, http).run()
    finally:
        stop_checker()


FORCED_EXIT_AFTER_S = 5.0
"""How long past its grace a stopping server may take (an env step stuck in a thread) before it
exits without cleaning up."""


class _AnnouncingServer(uvicorn.Server):
    """uvicorn's server, printing ``line`` once its socket accepts connections and a line on the
    signal that stops it; bounded: past ``grace_s`` (and :data:`FORCED_EXIT_AFTER_S`) it exits
    whatever is left."""

    def __init__(self, config: uvicorn.Config, line: str, grace_s: float, http: Any) -> None:
        super().__init__(config)
        self.line = line
        self.grace_s = grace_s
        self.http = http  # the guarded protocol class: it holds the incomplete connections

    async def startup(self, sockets: Any = None) -> None:
        await super().startup(sockets)
        if self.started:
            print(self.line, flush=True)

    def handle_exit(self, sig: int, frame: Any) -> None:
        if not self.should_exit:
            held = len(self.server_state.connections) + self.http.pending_count()
            name = signal.Signals(sig).name
            bound = self.grace_s + FORCED_EXIT_AFTER_S  # the grace for sessions, then the forced exit
            print(f"{name}: closing {held} connections, exiting within {bound:g} s", flush=True)
            last_resort = threading.Timer(bound, _exit_now, (name, 128 + sig))
            last_resort.daemon = True
            last_resort.start()
        super().handle_exit(sig, frame)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """uvicorn's handlers for SIGINT and SIGTERM, without its raising the signal again once
        stopped (a KeyboardInterrupt traceback after SIGINT): a stop on request exits 0."""
        if threading.current_thread() is not threading.main_thread():  # only it may set handlers
            yield
            return
        originals = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in originals.items():
                signal.signal(sig, handler)

    async def shutdown(self, sockets: Any = None) -> None:
        self.http.close_pending()  # not in uvicorn's connections: not closed there
        await super().shutdown(sockets)


def _exit_now(name: str, status: int) -> None:
    print(f"{name}: still stopping after the grace period: exiting now", flush=True)
    os._exit(status)
