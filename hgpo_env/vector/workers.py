"""Running batches of env commands on a set of workers, with a deadline for every env.

This is what the backends share. A backend only knows how to launch, stop, send to and receive
from one worker; this base class sends every batch before waiting on any (so workers run in
parallel). A worker answers for the envs of its batch as they finish (the process backend sends
what finished within 50 ms together), and each answer has ``timeout`` seconds from the previous
one, so a hung env is found within ``timeout`` of its own command however many envs share its
worker. A worker that dies or misses a deadline is
killed and restarted; a worker that cannot be restarted stays down (its envs get no episodes)
until :meth:`Workers.revive` brings it back.
"""

from __future__ import annotations

import abc
import time
from collections.abc import Collection, Mapping, Sequence
from typing import Any, NamedTuple

from hgpo_env.vector.host import EnvSpec, Reply
from hgpo_env.vector.results import PoolError

REVIVE_DELAYS = (1.0, 2.0, 4.0)
"""Seconds to wait before each further attempt to restart a worker that could not start."""


class WorkerFailure(Exception):
    """A worker died or failed to start; the message says how."""


class Hosting(NamedTuple):
    """What the workers host: envs made from ``env`` with ``env_kwargs``; worker ``w`` hosts the env
    indices ``hosted[w]``."""

    env: EnvSpec
    env_kwargs: Mapping[str, Any]
    hosted: Sequence[Sequence[int]]


class BatchResult(NamedTuple):
    """A worker's answers to a batch: ``replies`` in batch order, cut short by ``failure`` (the
    reason the worker died or was killed, None when it answered for every env)."""

    replies: list[Reply]
    failure: str | None = None


class Workers(abc.ABC):
    """Worker ``w`` hosts the envs ``hosted[w]``; :meth:`run` executes one batch on each."""

    def __init__(self, hosting: Hosting, start_timeout: float) -> None:
        self.hosting = hosting
        self.hosted = hosting.hosted
        self.start_timeout = start_timeout
        self.restarts = 0
        self.down: dict[int, str] = {}
        """Workers that could not be restarted, and why."""
        self._pids = [-1] * len(self.hosted)

    # ----------------------------------------------------------------- for backends
    @abc.abstractmethod
    def _launch(self, worker: int) -> None:
        """Start the worker; its first answer is its pid once its envs are made. Raises
        :class:`WorkerFailure` when it cannot be placed."""

    @abc.abstractmethod
    def _stop(self, worker: int) -> None:
        """Kill the worker at once and release it; must not raise."""

    @abc.abstractmethod
    def _send(self, worker: int, method: str, batch: list[Any]) -> None:
        """Ask for ``EnvHost.<method>(batch)``, answered env by env; raises :class:`WorkerFailure`."""

    @abc.abstractmethod
    def _ready(self, workers: Collection[int], timeout: float) -> Collection[int]:
        """Those of ``workers`` with an answer (or a death) to receive now, waiting up to ``timeout`` s."""

    @abc.abstractmethod
    def _receive(self, worker: int) -> list[Any]:
        """The worker's next answers (one or more); raises :class:`WorkerFailure` if it died."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stop every worker and wait until they are gone; idempotent."""

    def _env(self, worker: int) -> EnvSpec:
        """What the worker makes its envs from."""
        return self.hosting.env

    def _patience(self, timeout: float) -> float:
        """Seconds a worker gets for one env's command."""
        return timeout

    def _failed(self, worker: int, failure: WorkerFailure) -> None:
        """Note why a worker failed, before it is stopped (the Ray backend avoids its node)."""

    # ----------------------------------------------------------------- shared
    def pids(self) -> list[int]:
        """The process id of each worker (-1 for one that is not running)."""
        return list(self._pids)

    def start(self) -> None:
        """Launch every worker and wait until all have made their envs; raises :class:`PoolError`."""
        self._boot(range(len(self.hosted)))
        if self.down:
            reasons = "\n".join(f"worker {w}: {reason}" for w, reason in sorted(self.down.items()))
            raise PoolError(f"{len(self.down)} worker(s) could not start and make their envs:\n{reasons}")

    def revive(self) -> None:
        """Restart the workers that are down, retrying with backoff; raises :class:`PoolError`
        naming each one that still cannot start."""
        for delay in (*REVIVE_DELAYS, None):
            if not self.down:
                return
            self._boot(list(self.down))
            if self.down and delay is not None:
                time.sleep(delay)
        reasons = "\n".join(f"worker {w}: {reason}" for w, reason in sorted(self.down.items()))
        raise PoolError(
            f"{len(self.down)} worker(s) could not be restarted after {len(REVIVE_DELAYS) + 1} attempts, "
            f"so their envs cannot start episodes:\n{reasons}"
        )

    def run(self, method: str, batches: Mapping[int, list[Any]], timeout: float) -> dict[int, BatchResult]:
        """Each worker's answers to its batch. A worker that fails is restarted (or left down)."""
        results: dict[int, BatchResult] = {}
        sent: dict[int, list[Any]] = {}
        for worker, batch in batches.items():
            try:
                if worker in self.down:
                    raise WorkerFailure(f"is down ({self.down[worker]})")
                self._send(worker, method, batch)
                sent[worker] = batch
            except WorkerFailure as failure:
                results[worker] = BatchResult([], self._describe(worker, str(failure), method, batch, []))
        counts = {worker: len(batch) for worker, batch in sent.items()}
        for worker, (replies, failure) in self._gather(counts, self._patience(timeout)).items():
            if failure is not None:
                failure = self._describe(worker, failure, method, sent[worker], replies)
            results[worker] = BatchResult(replies, failure)
        failed = [w for w, result in results.items() if result.failure is not None and w not in self.down]
        if failed:
            self.restarts += len(failed)
            self._boot(failed)
        return results

    def _describe(self, worker: int, failure: str, method: str, batch: list[Any], replies: list[Any]) -> str:
        pid = f"(pid {self._pids[worker]}) " if self._pids[worker] > 0 else ""
        during = f" during env {batch[len(replies)][0]}'s {method}" if len(replies) < len(batch) else ""
        return f"{pid}{failure}{during}"

    def _boot(self, workers: Collection[int]) -> None:
        """(Re)start ``workers``; those that cannot start are left down."""
        for worker in workers:
            self._stop(worker)
            self._pids[worker] = -1
            self.down.pop(worker, None)
        launched: dict[int, int] = {}
        for worker in workers:
            try:
                self._launch(worker)
                launched[worker] = 1  # one answer: the pid
            except WorkerFailure as failure:
                self.down[worker] = str(failure)
        patience = {w: self.start_timeout * max(1, len(self.hosted[w])) for w in launched}
        for worker, (answers, failure) in self._gather(launched, patience).items():
            if failure is None:
                self._pids[worker] = answers[0]
            else:
                self.down[worker] = failure

    def _gather(
        self, expected: Mapping[int, int], patience: float | Mapping[int, float]
    ) -> dict[int, BatchResult]:
        """Receive ``expected[w]`` answers from each worker ``w``, each within its patience
        (seconds) of the one before; a worker that dies or is late is stopped."""
        if not isinstance(patience, Mapping):
            patience = dict.fromkeys(expected, patience)
        now = time.monotonic()
        deadlines = {worker: now + patience[worker] for worker in expected}
        answers: dict[int, list[Any]] = {worker: [] for worker in expected}
        results = {worker: BatchResult([]) for worker, count in expected.items() if not count}
        pending = {worker for worker, count in expected.items() if count}

        def end(worker: int, failure: WorkerFailure) -> None:
            self._failed(worker, failure)
            self._stop(worker)
            results[worker] = BatchResult(answers[worker], str(failure))
            pending.discard(worker)

        while pending:
            wait = max(0.0, min(deadlines[w] for w in pending) - time.monotonic())
            for worker in self._ready(pending, wait):
                try:
                    answers[worker].extend(self._receive(worker))
                except WorkerFailure as failure:
                    end(worker, failure)
                    continue
                deadlines[worker] = time.monotonic() + patience[worker]
                if len(answers[worker]) == expected[worker]:
                    results[worker] = BatchResult(answers[worker])
                    pending.discard(worker)
            now = time.monotonic()
            for worker in [w for w in pending if deadlines[w] <= now]:
                end(worker, WorkerFailure(f"gave no answer within {patience[worker]:.3g} s and was killed"))
        return results
