"""The process backend: each worker is a spawned Python process talking over a pipe.

"spawn" rather than "fork": a forked child inherits the parent's threads' locks mid-flight
(tokenizers, torch, Ray all start threads), which deadlocks at random. Workers ignore Ctrl-C so
that the parent alone handles it and closes the pool. They die with the parent however it ends:
they exit when their pipe closes, and a watchdog thread ends them within a second of the
parent's death even while an env is stuck in a step.
"""

from __future__ import annotations

import contextlib
import faulthandler
import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import threading
import time
import traceback
from collections.abc import Collection, Iterator, Mapping, Sequence
from multiprocessing.connection import Connection
from typing import Any, ClassVar

from hgpo_env.textenv.orphans import exit_with_parent
from hgpo_env.vector.host import EnvHost, EnvSpec, Reply, sendable
from hgpo_env.vector.workers import Hosting, WorkerFailure, Workers

CLOSE_TIMEOUT = 5.0
"""Seconds a worker gets to close its envs and exit before it is killed."""
FLUSH_INTERVAL = 0.05
"""Seconds a worker may hold finished replies to send them together (one message per env costs
more than a fast env's step)."""


def _send_replies(conn: Connection, replies: list[Reply]) -> None:
    try:
        conn.send((True, replies))
    except (EOFError, OSError):
        raise
    except Exception:  # noqa: BLE001  -- pickling fails before anything is written: find the culprit
        conn.send((True, [sendable(reply, pickle.dumps) for reply in replies]))


class _Outbox:
    """Replies on their way to the pool, sent together: a thread sends what is ready every
    :data:`FLUSH_INTERVAL` seconds, so replies never wait behind an env that hangs."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.ready: list[Reply] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._send_periodically, name="hgpo-reply-sender", daemon=True).start()

    def answer(self, replies: Iterator[Reply]) -> None:
        for reply in replies:  # each env runs while the next reply is being made
            with self.lock:
                self.ready.append(reply)
        self.flush()

    def flush(self) -> None:
        with self.lock:
            if self.ready:
                _send_replies(self.conn, self.ready)
                self.ready = []

    def _send_periodically(self) -> None:
        with contextlib.suppress(EOFError, OSError):  # the pool is gone: the main loop sees it too
            while True:
                time.sleep(FLUSH_INTERVAL)
                self.flush()


def _serve(
    conn: Connection,
    env: EnvSpec,
    env_kwargs: Mapping[str, Any],
    env_indices: Sequence[int],
    host_class: type[EnvHost] = EnvHost,
) -> None:
    """A worker's main loop: ``(ok, replies)`` messages answer ``(method, batch)`` requests env
    by env (a few envs per message), until "close"."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    faulthandler.enable()  # a crash inside an env leaves its traceback on stderr
    exit_with_parent()
    try:
        host = host_class(env, env_kwargs, env_indices)
    except Exception:  # noqa: BLE001  -- reported to the pool, which raises it
        conn.send((False, f"making its envs raised:\n{traceback.format_exc()}"))
        return
    try:
        conn.send((True, [os.getpid()]))
        outbox = _Outbox(conn)
        while True:
            method, batch = conn.recv()
            if method == "close":
                break
            outbox.answer(getattr(host, method)(batch))
    except (EOFError, OSError):  # the pool is gone
        pass
    finally:
        host.close()


class ProcessWorkers(Workers):
    host_class: ClassVar[type[EnvHost]] = EnvHost
    """What hosts the envs in each worker process."""

    def __init__(self, hosting: Hosting, start_timeout: float) -> None:
        super().__init__(hosting, start_timeout)
        self._context = multiprocessing.get_context("spawn")
        self._processes: list[multiprocessing.process.BaseProcess | None] = [None] * len(self.hosted)
        self._conns: list[Connection | None] = [None] * len(self.hosted)

    def _launch(self, worker: int) -> None:
        parent_end, child_end = self._context.Pipe()
        process = self._context.Process(
            target=_serve,
            args=(
                child_end,
                self._env(worker),
                self.hosting.env_kwargs,
                list(self.hosted[worker]),
                self.host_class,
            ),
            name=f"hgpo-env-worker-{worker}",
            daemon=True,
        )
        process.start()
        child_end.close()  # the worker's death must close the pipe, so we must not hold its end
        self._processes[worker], self._conns[worker] = process, parent_end

    def _stop(self, worker: int) -> None:
        process, conn = self._processes[worker], self._conns[worker]
        self._processes[worker] = self._conns[worker] = None
        if process is not None:
            process.kill()
            process.join(CLOSE_TIMEOUT)
        if conn is not None:
            conn.close()

    def _send(self, worker: int, method: str, batch: list[Any]) -> None:
        conn = self._conns[worker]
        if conn is None:
            raise WorkerFailure("is not running")
        try:
            conn.send((method, batch))
        except OSError:
            raise WorkerFailure(self._died(worker)) from None

    def _ready(self, workers: Collection[int], timeout: float) -> Collection[int]:
        by_handle: dict[Any, int] = {}
        for worker in workers:
            by_handle[self._conns[worker]] = worker
            by_handle[self._processes[worker].sentinel] = worker
        return {by_handle[handle] for handle in multiprocessing.connection.wait(list(by_handle), timeout)}

    def _receive(self, worker: int) -> list[Any]:
        conn = self._conns[worker]
        try:
            if conn.poll():
                ok, payload = conn.recv()
                if ok:
                    return payload
                raise WorkerFailure(payload)
        except (EOFError, OSError):
            pass
        raise WorkerFailure(self._died(worker))

    def _died(self, worker: int) -> str:
        """Why the worker's pipe broke, in words."""
        process = self._processes[worker]
        process.join(CLOSE_TIMEOUT)
        if process.exitcode is None:
            return "closed its pipe but is still running"
        if process.exitcode < 0:
            return f"was killed by {signal.Signals(-process.exitcode).name}"
        return f"exited with code {process.exitcode}"

    def close(self) -> None:
        live = [w for w, conn in enumerate(self._conns) if conn is not None]
        for worker in live:
            try:
                self._conns[worker].send(("close", None))
            except OSError:
                pass
        deadline = time.monotonic() + CLOSE_TIMEOUT
        for worker in live:
            self._processes[worker].join(max(0.0, deadline - time.monotonic()))
            self._stop(worker)
