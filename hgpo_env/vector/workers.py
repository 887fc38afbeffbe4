"""Running batches of env commands on a set of workers, with a deadline each.

This is what both backends share. A backend only knows how to launch, stop, send to and receive
from one worker; this base class sends every batch before waiting on any (so workers run in
parallel) and gives each worker ``timeout`` seconds per env in its batch. A worker that dies or
misses its deadline is killed and restarted, and its batch maps to the reason instead of replies.
"""

from __future__ import annotations

import abc
import time
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from hgpo_env.vector.host import Reply
from hgpo_env.vector.results import PoolError


class WorkerFailure(Exception):
    """A worker died or failed to start; the message says how."""


class Workers(abc.ABC):
    """Worker ``w`` hosts the envs ``hosted[w]``; :meth:`run` executes one batch on each."""

    def __init__(self, hosted: Sequence[Sequence[int]], start_timeout: float) -> None:
        self.hosted = hosted
        self.start_timeout = start_timeout
        self.restarts = 0
        self._pids = [-1] * len(hosted)

    # ----------------------------------------------------------------- for backends
    @abc.abstractmethod
    def _launch(self, worker: int) -> None:
        """Start the worker; its first reply is its pid once its envs are made."""

    @abc.abstractmethod
    def _stop(self, worker: int) -> None:
        """Kill the worker at once and release it; must not raise."""

    @abc.abstractmethod
    def _send(self, worker: int, method: str, batch: list[Any]) -> None:
        """Ask for ``EnvHost.<method>(batch)``; raises :class:`WorkerFailure` if it cannot."""

    @abc.abstractmethod
    def _ready(self, workers: Collection[int], timeout: float) -> Collection[int]:
        """Those of ``workers`` whose reply (or death) can be received now, waiting up to ``timeout`` s."""

    @abc.abstractmethod
    def _receive(self, worker: int) -> Any:
        """The worker's reply; raises :class:`WorkerFailure` if it died."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stop every worker and wait until they are gone; idempotent."""

    def _budget(self, timeout: float, batch_size: int) -> float:
        """Seconds a worker gets for a batch: ``timeout`` per env command."""
        return timeout * batch_size

    # ----------------------------------------------------------------- shared
    def pids(self) -> list[int]:
        """The process id of each worker (-1 for one that is not running)."""
        return list(self._pids)

    def start(self) -> None:
        """Launch every worker and wait until all have made their envs."""
        self._boot(range(len(self.hosted)))

    def run(
        self, method: str, batches: Mapping[int, list[Any]], timeout: float
    ) -> dict[int, list[Reply] | str]:
        """Each worker's replies to its batch, or the reason it failed (it is then restarted)."""
        started = time.monotonic()
        replies: dict[int, Any] = {}
        budgets: dict[int, float] = {}
        for worker, batch in batches.items():
            try:
                self._send(worker, method, batch)
                budgets[worker] = self._budget(timeout, len(batch))
            except WorkerFailure as failure:
                replies[worker] = failure
        replies.update(self._gather(budgets, started))
        failed = [worker for worker, reply in replies.items() if isinstance(reply, WorkerFailure)]
        for worker in failed:
            pid = f"(pid {self._pids[worker]}) " if self._pids[worker] > 0 else ""
            replies[worker] = (
                f"{pid}{replies[worker]} while running {len(batches[worker])} env {method}(s), "
                f"{timeout:g} s allowed each"
            )
            self._stop(worker)
        if failed:
            self.restarts += len(failed)
            self._boot(failed)
        return replies

    def _boot(self, workers: Collection[int]) -> None:
        started = time.monotonic()
        for worker in workers:
            self._pids[worker] = -1
            self._launch(worker)
        budgets = {w: self.start_timeout * max(1, len(self.hosted[w])) for w in workers}
        failed = {}
        for worker, reply in self._gather(budgets, started).items():
            if isinstance(reply, WorkerFailure):
                failed[worker] = reply
                self._stop(worker)
            else:
                self._pids[worker] = reply
        if failed:
            reasons = "\n".join(f"worker {w}: {reason}" for w, reason in sorted(failed.items()))
            raise PoolError(f"{len(failed)} worker(s) could not start and make their envs:\n{reasons}")

    def _gather(self, budgets: Mapping[int, float], started: float) -> dict[int, Any]:
        """Replies of the workers in ``budgets``, or a :class:`WorkerFailure` for those that died
        or did not answer within their budget (seconds from ``started``)."""
        deadlines = {worker: started + budget for worker, budget in budgets.items()}
        replies: dict[int, Any] = {}
        pending = set(deadlines)
        while pending:
            wait = max(0.0, min(deadlines[w] for w in pending) - time.monotonic())
            for worker in self._ready(pending, wait):
                try:
                    replies[worker] = self._receive(worker)
                except WorkerFailure as failure:
                    replies[worker] = failure
                pending.discard(worker)
            now = time.monotonic()
            for worker in [w for w in pending if deadlines[w] <= now]:
                replies[worker] = WorkerFailure(
                    f"gave no answer within {budgets[worker]:.3g} s and was killed"
                )
                pending.discard(worker)
        return replies
