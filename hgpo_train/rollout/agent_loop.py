"""Per-episode agent loops: each episode asks for its next response as soon as its own env step
returns, so env steps overlap generation and no episode waits for the slowest reply of a turn.

The loop submits one request per episode (:data:`Submit`) and steps the envs whose responses
have arrived while the rest are still being generated. An engine with its own scheduling (vLLM's
continuous batching behind :class:`~hgpo_train.openrlhf.engines.EngineGenerator`) takes each
request as it comes; a generator that answers batches (the local trainer's Hugging Face or
offline vLLM generator) gets them through a :class:`MicroBatcher`: whatever is waiting, up to
``generation.batch_size`` prompts at a time, in a thread of its own.

Episodes, keys and credit do not depend on the order in which responses arrive: each env steps
its own episode and the recorder files every step under its env (:mod:`hgpo_train.rollout.episodes`).
So a generator whose response depends on its prompt alone (greedy decoding) gives exactly the
lockstep loop's episodes; a sampling one draws its random numbers in an order that depends on
timing, so a per-episode rollout is not replayed exactly from its seed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from contextlib import contextmanager
from typing import Any, NamedTuple, Protocol, Self, get_args

from hgpo_train.config import AgentLoop
from hgpo_train.rollout.episodes import EnvPool, Episode, EpisodeRecorder, Generation, Generator, Prompt, R

AGENT_LOOPS: tuple[str, ...] = get_args(AgentLoop)

Submit = Callable[[str, dict[str, Any], int], "Future[R]"]
"""``submit(prompt, info, group)``: start generating the response to one prompt (``group`` is
its env's task group, for engines that keep a group's shared prefix in one cache)."""


class RequestSubmitter(Protocol):
    def submit(
        self, prompt: Prompt, admissible: Sequence[str] | None, temperature: float | None, group: int
    ) -> Future[Generation]: ...


def play_agent_loops(
    pool: EnvPool,
    submit: Submit[R],
    *,
    seeds: Sequence[int] | None = None,
    task_ids: Sequence[int] | None = None,
    on_turn: Callable[[int, int, int], None] | None = None,
) -> list[Episode[R]]:
    """Play one episode in every env of ``pool`` (one seed / task id per group), each on its own.

    Every episode's prompt is submitted as soon as its env returns it; whenever responses arrive,
    the envs they answer step together (the pool runs its workers in parallel) while the others'
    responses are still being generated. Episodes come back in env order, as from
    :func:`~hgpo_train.rollout.collect.play_episodes`. ``on_turn(calls, running, steps)`` is called after
    each such step call. A failing response (its future's exception) ends the rollout with it;
    requests still pending are cancelled.
    """
    recorder: EpisodeRecorder[R] = EpisodeRecorder(pool.reset(seeds=seeds, task_ids=task_ids))

    def ask(i: int) -> Future[R]:
        return submit(recorder.prompts[i], recorder.infos[i], recorder.groups[i])

    pending = {ask(i): i for i in sorted(recorder.prompts)}
    calls = steps = 0
    try:
        while pending:
            arrived, _ = wait(pending, return_when=FIRST_COMPLETED)
            responses = {pending.pop(future): future.result() for future in arrived}
            results = pool.step({i: responses[i].text for i in sorted(responses)})
            for result in results:
                if not recorder.record(responses[result.env_index], result):
                    pending[ask(result.env_index)] = result.env_index
            calls, steps = calls + 1, steps + len(results)
            if on_turn is not None:
                on_turn(calls, len(pending), steps)
    finally:
        for future in pending:
            future.cancel()
    return recorder.episodes()


class _Request(NamedTuple):
    future: Future[Generation]
    prompt: Prompt
    admissible: Sequence[str] | None
    temperature: float | None


class MicroBatcher:
    """Answers single requests with a batch generator: a thread of its own generates whatever
    requests are waiting, at most ``max_batch`` at a time, oldest first (requests that differ in
    temperature, or in being constrained, go to separate batches). Use it as a context manager:
    leaving it cancels what is still queued and waits for the batch in progress."""

    def __init__(self, generator: Generator, max_batch: int) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {max_batch}")
        self.generator, self.max_batch = generator, max_batch
        self._queue: list[_Request] = []
        self._ready = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name="hgpo-micro-batcher", daemon=True)
        self._thread.start()

    def submit(
        self, prompt: Prompt, admissible: Sequence[str] | None, temperature: float | None, group: int = 0
    ) -> Future[Generation]:
        future: Future[Generation] = Future()
        with self._ready:
            if self._closed:
                raise RuntimeError("the micro-batcher is closed")
            self._queue.append(_Request(future, prompt, admissible, temperature))
            self._ready.notify()
        return future

    def close(self) -> None:
        with self._ready:
            self._closed = True
            for request in self._queue:
                request.future.cancel()
            self._queue.clear()
            self._ready.notify()
        self._thread.join()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _next_batch(self) -> list[_Request]:
        """The oldest waiting requests that can share one call (cancelled ones included); empty
        once closed."""
        with self._ready:
            while not self._queue and not self._closed:
                self._ready.wait()
            if self._closed:
                return []
            first = self._queue[0]
            alike = (first.temperature, first.admissible is None)
            batch = [r for r in self._queue if (r.temperature, r.admissible is None) == alike][
                : self.max_batch
            ]
            taken = {id(r) for r in batch}
            self._queue = [r for r in self._queue if id(r) not in taken]
        return batch

    def _serve(self) -> None:
        while taken := self._next_batch():
            batch = [r for r in taken if r.future.set_running_or_notify_cancel()]
            if not batch:
                continue
            admissible = None if batch[0].admissible is None else [r.admissible or () for r in batch]
            try:
                generations = self.generator.generate(
                    [r.prompt for r in batch], admissible, batch[0].temperature
                )
            except Exception as error:  # noqa: BLE001  (any failure is the caller's: its result() raises it)
                for request in batch:
                    request.future.set_exception(error)
                continue
            for request, generation in zip(batch, generations):
                request.future.set_result(generation)


@contextmanager
def submitter(
    generator: Generator | RequestSubmitter,
    *,
    replies: Callable[[dict[str, Any]], Sequence[str]] | None,
    temperature: float | None,
    max_batch: int,
) -> Iterator[Submit[Generation]]:
    """The :data:`Submit` of ``generator`` for one rollout: its own ``submit`` where it takes
    single requests, else a :class:`MicroBatcher` over its ``generate``. ``replies`` (constrained
    decoding) gives the replies each prompt's response must be one of, from its info."""
    if hasattr(generator, "submit"):
        yield _asking(generator, replies, temperature)
        return
    with MicroBatcher(generator, max_batch) as batcher:
        yield _asking(batcher, replies, temperature)


def _asking(
    target: RequestSubmitter,
    replies: Callable[[dict[str, Any]], Sequence[str]] | None,
    temperature: float | None,
) -> Submit[Generation]:
    def submit(prompt: Prompt, info: dict[str, Any], group: int) -> Future[Generation]:
        admissible = replies(info) if replies is not None else None
        return target.submit(prompt, admissible, temperature, group)

    return submit
