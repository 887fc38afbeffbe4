"""Rollouts collected while the trainer updates (``train.async_staleness``), with whole groups and
a bound on how many policy versions old their tokens may be.

A synchronous run alternates: the engines idle through every update and the trainer through
every rollout. With a staleness bound S >= 1 a background thread collects the rollouts of the
next iterations while the current one trains, at most S iterations ahead of the trainer. Each
rollout is a whole iteration (every task group of it, every episode to its end), so groups are
never split across batches, none is dropped for being slow, and batches train in iteration
order: a long episode cannot be starved by short ones.

The engines' weights change only between rollouts: a rollout holds the weights' lock while it
samples, and a weight sync takes the same lock (first come, first served), so every step of a
rollout was sampled by one policy version, recorded in ``StepBatch.policy_version``. A version is
the number of updates the sampling weights had seen; the update of iteration ``i`` trains a
policy of version ``i``, so a row's staleness is ``i - policy_version``: 0 in a synchronous run,
at most S here.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Protocol

import numpy as np

from hgpo_train.rollout.batch import StepBatch

logger = logging.getLogger(__name__)

Collect = Callable[[int, Callable[[], bool]], StepBatch]
"""``collect(iteration, abandon)``: the iteration's rollout; it raises
:class:`~hgpo_train.run.stopping.RolloutStopped` soon after ``abandon()`` turns true."""

CLOSE_TIMEOUT_S = 300.0
"""How long :meth:`RolloutsAhead.close` waits for an abandoned rollout to return."""


class FairLock:
    """A lock granted in the order it was asked for (``threading.Lock`` is not: a rollout thread
    that releases and asks again could keep a waiting weight sync out)."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._waiting: deque[object] = deque()
        self._held = False

    def __enter__(self) -> None:
        ticket = object()
        with self._changed:
            self._waiting.append(ticket)
            self._changed.wait_for(lambda: not self._held and self._waiting[0] is ticket)
            self._waiting.popleft()
            self._held = True

    def __exit__(self, *exc: object) -> None:
        with self._changed:
            self._held = False
            self._changed.notify_all()


class EngineWeights:
    """The version of the weights the rollouts sample with, and the lock that keeps them fixed
    while a rollout (or an evaluation) samples.

    ``lock`` is any context manager; the OpenRLHF backend's is OpenRLHF's own ``VLLMLock``
    actor, shared with nothing else but queued in order as :class:`FairLock` is.
    """

    def __init__(self, version: int, lock: AbstractContextManager[Any] | None = None) -> None:
        self.version = version
        self._lock = lock if lock is not None else FairLock()

    @contextmanager
    def sampling(self) -> Iterator[int]:
        """Hold the weights fixed; yields their version."""
        with self._lock:
            yield self.version

    def replace(self, sync: Callable[[], None], version: int) -> None:
        """Run ``sync`` (which loads new weights into the engines) once no rollout samples; the
        weights are ``version`` after it."""
        with self._lock:
            sync()
            self.version = version


def sampled(
    collect: Collect, iteration: int, abandon: Callable[[], bool], weights: EngineWeights
) -> StepBatch:
    """The rollout of ``iteration``, sampled with the weights held fixed: every row's
    ``policy_version`` is theirs, and ``extras["timing"]["rollout_s"]`` its seconds."""
    with weights.sampling() as version:
        start = time.perf_counter()
        batch = collect(iteration, abandon)
        batch.extras.setdefault("timing", {})["rollout_s"] = time.perf_counter() - start
    batch.policy_version = np.full(len(batch), version, dtype=np.int64)
    return batch


class Rollouts(Protocol):
    """Where a trainer's iterations get their batches."""

    def take(self, iteration: int) -> StepBatch:
        """The rollout of ``iteration`` (0-based, called in order), its versions recorded."""

    def close(self) -> None:
        """Stop collecting (an unfinished rollout is abandoned)."""


class InOrder:
    """Synchronous rollouts: each is collected when the trainer asks for it."""

    def __init__(self, collect: Collect, weights: EngineWeights) -> None:
        self.collect, self.weights = collect, weights

    def take(self, iteration: int) -> StepBatch:
        return sampled(self.collect, iteration, lambda: False, self.weights)

    def close(self) -> None:
        """Nothing runs between calls."""


class RolloutsAhead:
    """Rollouts of iterations ``start..stop-1`` collected on a thread, at most ``staleness``
    iterations ahead of the trainer's :meth:`take`.

    A slot is taken before a rollout starts and given back when the trainer takes a batch, so
    while iteration ``i`` trains, rollouts up to ``i + staleness`` may run. A rollout that raises
    (a pool that failed for good, a stop request) ends the thread; :meth:`take` raises the same
    error in the trainer, at the iteration that would have trained on it.
    """

    def __init__(
        self, collect: Collect, weights: EngineWeights, *, start: int, stop: int, staleness: int
    ) -> None:
        if staleness < 1:
            raise ValueError(f"RolloutsAhead needs a staleness bound of at least 1, got {staleness}")
        self.collect, self.weights = collect, weights
        self._slots = threading.Semaphore(staleness)
        self._ready: queue.Queue[tuple[int, StepBatch | BaseException]] = queue.Queue()
        self._closing = threading.Event()
        self._thread = threading.Thread(
            target=self._produce, args=(start, stop), name="rollouts-ahead", daemon=True
        )
        self._thread.start()

    def _produce(self, start: int, stop: int) -> None:
        for iteration in range(start, stop):
            self._slots.acquire()
            if self._closing.is_set():
                return
            try:
                self._ready.put(
                    (iteration, sampled(self.collect, iteration, self._closing.is_set, self.weights))
                )
            except BaseException as error:  # noqa: BLE001  (raised again in the trainer by take)
                self._ready.put((iteration, error))
                return

    def take(self, iteration: int) -> StepBatch:
        got, result = self._ready.get()
        if got != iteration:
            raise RuntimeError(f"the rollout of iteration {got} came when {iteration} was asked for")
        self._slots.release()
        if isinstance(result, BaseException):
            raise result
        return result

    def close(self) -> None:
        self._closing.set()
        self._slots.release()  # a thread waiting for a slot sees the close
        self._thread.join(CLOSE_TIMEOUT_S)
        if self._thread.is_alive():
            logger.warning(
                "the rollout collected ahead did not stop within %.0f s of the run's end; left behind",
                CLOSE_TIMEOUT_S,
            )


def rollout_source(
    collect: Collect, weights: EngineWeights, *, start: int, stop: int, staleness: int
) -> Rollouts:
    """:class:`InOrder` for a synchronous run (``staleness`` 0), else :class:`RolloutsAhead`."""
    if staleness == 0:
        return InOrder(collect, weights)
    return RolloutsAhead(collect, weights, start=start, stop=stop, staleness=staleness)
