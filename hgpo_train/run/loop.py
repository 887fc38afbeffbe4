"""The run both backends share: which tasks an iteration plays, what every iteration logs, and
the schedule around the iterations (evaluation, checkpoints, stopping at a safe point).

An iteration is collected by :func:`collect_iteration` and run by :func:`run_one_iteration` on
both backends, each supplying only its update (:class:`IterationParts`); the schedule,
:func:`run_iterations`, asks a backend only how it saves and evaluates (:class:`Backend`).
Every source of randomness of iteration ``i`` is seeded from ``(train.seed, i)``, so a run
killed and resumed repeats exactly the iterations a straight run would have done, on either
backend.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from hgpo_env.vector import GroupedEnvPool
from hgpo_train.advantage import AdvantageConfig, StepCredit
from hgpo_train.config import Config, UpdateConfig
from hgpo_train.rollout.batch import StepBatch
from hgpo_train.rollout.collect import collect_with_retries
from hgpo_train.rollout.episodes import Prompt
from hgpo_train.rollout.overlap import Rollouts
from hgpo_train.run.diagnostics import credit_metrics
from hgpo_train.run.stopping import RolloutStopped, StopRequested
from hgpo_train.run.tracking import MetricsLogger


def iteration_seed(seed: int, iteration: int) -> int:
    """A 31-bit seed that depends only on the run seed and the iteration."""
    return int(np.random.SeedSequence([seed, iteration]).generate_state(1)[0] >> 1)


def draw_group_tasks(
    rng: np.random.Generator, num_groups: int, num_tasks: int | None
) -> tuple[list[int], list[int] | None]:
    """The seeds and task ids of an iteration's groups, drawn first from the iteration's generator
    so every backend plays the same tasks in the same iteration. An env with a task list gets
    distinct tasks within the iteration (as verl-agent draws WebShop goals) while it has enough;
    one without (Rooms) draws its task from the seed."""
    seeds = rng.integers(2**31 - 1, size=num_groups).tolist()
    if num_tasks is None:
        return seeds, None
    return seeds, rng.choice(num_tasks, size=num_groups, replace=num_groups > num_tasks).tolist()


class IterationParts(Protocol):
    """What a backend holds for :func:`collect_iteration` and :func:`run_one_iteration`."""

    config: Config
    rollouts: Rollouts
    """Each iteration's rollout, collected now or ahead."""
    generator: Any
    """The rollout generator, whose ``encoder`` encodes prompts as the policy sees them."""
    pool: GroupedEnvPool
    num_tasks: int | None
    """The env's task count (None: generated without end)."""
    advantage_state: dict[str, Any] | None
    """What the estimator carries into the next iteration (MVPO's), saved in each checkpoint."""

    def stop_requested(self) -> bool:
        """Whether a stop was asked for (:mod:`hgpo_train.run.stopping`)."""

    def update_policy(
        self, iteration: int, batch: StepBatch, trained: StepBatch, advantages: np.ndarray
    ) -> dict[str, float]:
        """Update the policy on ``trained`` (the rows that train) with their ``advantages``
        (``batch`` is the whole rollout); the update's metrics."""


def collect_iteration(
    parts: IterationParts,
    iteration: int,
    abandon: Callable[[], bool],
    *,
    progress: Callable[[int, int, int], None],
    before_attempt: Callable[[], None] = lambda: None,
) -> StepBatch:
    """The iteration's rollouts, as both backends collect them: one episode per env of
    ``parts.pool``, the groups' seeds and tasks drawn from ``(train.seed, iteration)``, a pool that
    raises given the rollout again (:func:`~hgpo_train.rollout.collect.collect_with_retries`;
    ``before_attempt`` reseeds the sampler). A stop request or ``abandon()`` abandons it at the
    next turn (:class:`RolloutStopped`: a preemption's grace period is shorter than a rollout);
    ``progress(turn, running, steps)`` reports the rest."""
    config = parts.config
    rng = np.random.default_rng(iteration_seed(config.train.seed, iteration))
    seeds, task_ids = draw_group_tasks(rng, config.env.num_groups, parts.num_tasks)

    def on_turn(turn: int, running: int, steps: int) -> None:
        if parts.stop_requested() or abandon():
            raise RolloutStopped
        progress(turn, running, steps)

    return collect_with_retries(
        parts.pool,
        parts.generator,
        label=f"iteration {iteration + 1}",
        before_attempt=before_attempt,
        seeds=seeds,
        task_ids=task_ids,
        constrained=config.generation.constrained,
        response_format=config.env.response_format,
        agent_loop=config.generation.agent_loop,
        max_batch=config.generation.batch_size,
        on_turn=on_turn,
    )


def timed_credit(
    batch: StepBatch, config: AdvantageConfig, state: dict[str, Any] | None
) -> tuple[StepCredit, float]:
    """The batch's step credit (:meth:`StepBatch.credit`, with what the estimator carried from the
    last iteration) and the seconds it took."""
    start = time.perf_counter()
    credit = batch.credit(config, state)
    return credit, time.perf_counter() - start


def rows_to_train(
    batch: StepBatch, advantages: np.ndarray, config: UpdateConfig
) -> tuple[StepBatch, np.ndarray]:
    """The rows the update trains on and their advantages: every row, or without the summary
    turns under ``update.train_summaries: false``."""
    if config.train_summaries or batch.summary_turn is None or not batch.summary_turn.any():
        return batch, advantages
    rows = np.flatnonzero(~batch.summary_turn)
    return batch.take(rows), advantages[rows]


@dataclass
class IterationResult:
    """What one iteration collected, its step credit, and its metrics."""

    batch: StepBatch
    credit: StepCredit
    metrics: dict[str, float]

    @property
    def advantages(self) -> np.ndarray:
        """The per-row advantages of the whole batch (the update trains on :func:`rows_to_train` of them)."""
        return self.credit.advantages


def run_one_iteration(parts: IterationParts, iteration: int) -> IterationResult:
    """One iteration, in the order both backends keep: take the rollout, credit its steps (with
    what the estimator carried from the last iteration, which it then carries on), choose the
    rows that train, update the policy (the backend's part), and the metrics every iteration logs."""
    config = parts.config
    start = time.perf_counter()
    batch = parts.rollouts.take(iteration)
    wait_s = time.perf_counter() - start
    credit, advantage_s = timed_credit(batch, config.advantage, parts.advantage_state)
    parts.advantage_state = credit.carried()
    trained, advantages = rows_to_train(batch, credit.advantages, config.update)
    metrics = parts.update_policy(iteration, batch, trained, advantages)
    metrics = {
        **iteration_metrics(
            iteration, batch, credit, config.advantage, advantage_s, parts.generator.encoder.prompt_ids
        ),
        **metrics,
        "time/rollout_wait_s": wait_s,
    }
    return IterationResult(batch, credit, metrics)


def iteration_metrics(
    iteration: int,
    batch: StepBatch,
    credit: StepCredit,
    config: AdvantageConfig,
    advantage_s: float,
    encode_prompt: Callable[[Prompt], Sequence[int]],
) -> dict[str, float]:
    """What every iteration logs on both backends, under the same names: the rollout's figures,
    the credit's, how stale its samples are, the prompt tokens its memory saved
    (``encode_prompt``: the policy's prompt encoding), and the rollout's times and throughput.
    Each backend adds its update's. The rollout's seconds are its own
    (``batch.extras["timing"]``), also when it ran while the trainer updated."""
    timing = batch.extras["timing"]
    rollout_s = timing["rollout_s"]
    tokens = int(batch.prompt_lengths.sum() + batch.response_lengths.sum())
    return {
        **batch.metrics(),
        **credit_metrics(batch, credit, config),
        **staleness_metrics(iteration, batch),
        **memory_savings(batch, encode_prompt),
        "time/rollout_s": rollout_s,
        "time/env_s": timing["env_s"],
        "time/generate_s": timing["generate_s"],
        "time/advantage_s": advantage_s,
        "throughput/steps_per_s": len(batch) / max(rollout_s, 1e-9),
        "throughput/tokens_per_s": tokens / max(rollout_s, 1e-9),
    }


def memory_savings(batch: StepBatch, encode_prompt: Callable[[Prompt], Sequence[int]]) -> dict[str, float]:
    """The prompt tokens a memory kind saved per action turn against the window of K, mean and
    share of the window's prompt; none where the env gave no window prompts (the window itself)."""
    if batch.window_prompts is None:
        return {}
    rows = [r for r, window in enumerate(batch.window_prompts) if window is not None]
    if not rows:
        return {}
    window = np.array([len(encode_prompt(batch.window_prompts[r])) for r in rows], dtype=np.float64)
    saved = window - batch.prompt_lengths[rows]
    return {
        "memory/prompt_tokens_saved": float(saved.mean()),
        "memory/prompt_tokens_saved_share": float(saved.sum() / window.sum()),
    }


def staleness_metrics(iteration: int, batch: StepBatch) -> dict[str, float]:
    """How many updates behind the policy trained at 0-based ``iteration`` (version ``iteration``)
    the weights that sampled the batch were (:mod:`hgpo_train.rollout.overlap`): 0 in a synchronous run."""
    if batch.policy_version is None or not len(batch):
        return {}
    staleness = iteration - batch.policy_version
    return {
        "rollout/staleness_mean": float(staleness.mean()),
        "rollout/staleness_max": float(staleness.max()),
    }


class Backend(Protocol):
    """What a trainer supplies to :func:`run_iterations`."""

    def train_iteration(self, iteration: int) -> dict[str, float]:
        """Collect, credit and update for 0-based ``iteration``; its metrics. Raises
        :class:`RolloutStopped` when a stop request abandons the rollout."""

    def start_save(self, iteration: int) -> None:
        """Start checkpointing the run after ``iteration`` iterations (it may finish later)."""

    def wait_for_save(self) -> None:
        """Return once the checkpoint being written is complete."""

    def evaluate(self, iteration: int) -> dict[str, float]:
        """The policy after ``iteration`` iterations on the eval panel (``eval/`` metrics)."""

    def stop_requested(self) -> bool:
        """Whether a stop was asked for (:mod:`hgpo_train.run.stopping`)."""


def run_iterations(
    backend: Backend,
    *,
    start: int,
    iterations: int,
    eval_every: int,
    logger: MetricsLogger,
    on_logged: Callable[[int, dict[str, float]], None] = lambda done, metrics: None,
) -> dict[str, float]:
    """Run iterations ``start..iterations-1``; returns the last one's metrics.

    With ``eval_every``, the untrained policy is evaluated first (logged as iteration 0), then
    every ``eval_every`` iterations and after the last one. Every iteration is checkpointed while
    the next one samples, so a kill loses at most the iteration in progress; its metrics are staged
    on disk before its checkpoint starts, and its line in the record is written once its
    evaluation is done. A resume from a checkpoint whose line is missing (a kill during the
    evaluation, or before the line was written) finishes that line: the staged metrics, and the
    evaluation again when one was due. A stop request abandons a rollout in progress, lets an
    update finish, skips the evaluation (leaving the line to the resume) and raises
    :class:`StopRequested` once the last completed iteration is checkpointed. ``on_logged`` sees
    each iteration's metrics once they are logged.
    """

    def finish(done: int, metrics: dict[str, float], stop: bool, began: float | None = None) -> None:
        """Evaluate when due and write ``done``'s line (``time/iteration_s`` from ``began`` when
        given); a stop leaves a due evaluation, and the line, to the resume."""
        if eval_every and (done % eval_every == 0 or done == iterations):
            if stop:
                return
            metrics.update(backend.evaluate(done))
        if began is not None:
            metrics["time/iteration_s"] = time.perf_counter() - began
        logger.log(done, metrics)
        on_logged(done, metrics)

    metrics: dict[str, float] = {}
    if eval_every and start == 0 and 0 not in logger.logged:
        logger.log(0, backend.evaluate(0))
    if start > 0 and start not in logger.logged:
        metrics = restored_metrics(logger, start)
        stop = backend.stop_requested()
        finish(start, metrics, stop)
        if stop:  # a stop asked for while the run started: the checkpoint is there
            raise StopRequested(start)
    for iteration in range(start, iterations):
        began = time.perf_counter()
        try:
            metrics = backend.train_iteration(iteration)
        except RolloutStopped:
            backend.wait_for_save()
            raise StopRequested(iteration, abandoned=True) from None
        done = iteration + 1
        metrics["time/iteration_s"] = time.perf_counter() - began
        logger.stage(done, metrics)  # on disk before the checkpoint that makes it the resume point
        backend.start_save(done)
        stop = backend.stop_requested()
        finish(done, metrics, stop, began)
        if stop or done == iterations:
            backend.wait_for_save()
        if stop and (done < iterations or done not in logger.logged):  # the last line left to a resume
            raise StopRequested(done)
    return metrics


def restored_metrics(logger: MetricsLogger, iteration: int) -> dict[str, float]:
    """The staged metrics of checkpointed ``iteration``, whose line a kill kept from the record.
    A run folder written before metrics were staged has none: its line says they were lost."""
    staged = logger.staged(iteration)
    if staged is not None:
        return staged
    logging.getLogger(__name__).warning(
        "iteration %d was checkpointed but its metrics were not kept: its line in %s has only "
        "'record/lost' (and its evaluation, when one is due)",
        iteration,
        logger.path,
    )
    return {"record/lost": 1.0}
