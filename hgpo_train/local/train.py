"""The single-machine backend: rollout -> advantages -> PPO update, on the shared run schedule
(:mod:`hgpo_train.run.loop`).

Every source of randomness of iteration ``i`` (task seeds, sampling, mini-batch order) is seeded
from ``(train.seed, i)``, so a run killed and resumed from a checkpoint repeats exactly the
iterations a straight run would have done.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
import transformers

from hgpo_env.vector import GroupedEnvPool
from hgpo_train.config import Config, ConfigError
from hgpo_train.evaluation.evaluate import Evaluator
from hgpo_train.rollout.batch import StepBatch
from hgpo_train.rollout.collect import count_tasks, make_pool
from hgpo_train.rollout.generation import end_token_id
from hgpo_train.rollout.overlap import EngineWeights, InOrder, Rollouts, rollout_source
from hgpo_train.run import durable
from hgpo_train.run.checkpoint import (
    BackgroundSave,
    checkpoint_advantage_state,
    clear_run_folder,
    latest_checkpoint,
    load_training_state,
    rng_states,
    save_checkpoint,
    tidy_checkpoints,
)
from hgpo_train.run.loop import (
    IterationResult,
    collect_iteration,
    draw_group_tasks,
    iteration_seed,
    run_iterations,
    run_one_iteration,
)
from hgpo_train.run.provenance import record_start
from hgpo_train.run.resume import check_resumed_config
from hgpo_train.run.stopping import clear_stop, stop_requested
from hgpo_train.run.tracking import MetricsLogger
from hgpo_train.update.modeling import Reference, load_policy, resolve_device
from hgpo_train.update.policy import build_generator, load_run_policy
from hgpo_train.update.ppo import PolicyUpdater

logger = logging.getLogger(__name__)


class Trainer:
    """Owns the model, optimizer, env pool, generator and logs of one run folder.

    A run folder with checkpoints is resumed. Its config must match ``config`` but for
    :data:`~hgpo_train.run.resume.RESUMABLE_CHANGES`, else :class:`ConfigError` lists the changes;
    ``allow_config_change=True`` resumes anyway, ``overwrite=True`` removes the old run first.
    """

    def __init__(self, config: Config, *, allow_config_change: bool = False, overwrite: bool = False) -> None:
        self.config = config
        cfg = config.train
        if cfg.threads is not None:
            torch.set_num_threads(cfg.threads)
        self.run_dir = Path(cfg.output_dir)
        self.allow_config_change = allow_config_change
        self.pool: GroupedEnvPool | None = None
        self.evaluator: Evaluator | None = None
        self.logger: MetricsLogger | None = None
        self.checkpoints = BackgroundSave()
        # every iteration is saved: transformers' bar per save ("Writing model shards") would print
        # a line each iteration under the run's own progress bar
        transformers.utils.logging.disable_progress_bar()
        self.status: Callable[[str], None] = _quiet
        """Shows what the current iteration is doing (the progress bar's description while training)."""
        self.resumed_from: Path | None = None
        self.completed = 0
        """Iterations done so far, resumed ones included."""
        if overwrite:
            clear_run_folder(self.run_dir)
        fresh = not self.run_dir.exists()
        try:
            self._start(config)
        except BaseException:  # a failed start leaves no run folder it made, and no workers
            self.close()
            if fresh:
                shutil.rmtree(self.run_dir, ignore_errors=True)
            raise

    def _start(self, config: Config) -> None:
        cfg = config.train
        try:  # the env first: a missing extra or a wrong argument is said in seconds, before the model
            self.num_tasks = count_tasks(config.env)
        except (TypeError, ValueError, gym.error.Error) as error:
            raise ConfigError(f"env {config.env.env_id} (env.kwargs {config.env.kwargs}): {error}") from error
        self.run_dir.mkdir(parents=True, exist_ok=True)
        clear_stop(self.run_dir)  # a request to an earlier run
        tidy_checkpoints(self.run_dir, cfg.keep_checkpoints, cfg.save_every)  # what a kill during a save left
        checkpoint = latest_checkpoint(self.run_dir)
        if checkpoint is not None and not cfg.resume:
            raise ConfigError(
                f"{self.run_dir} already has checkpoints and train.resume=false: "
                "choose another train.output_dir, or pass --overwrite to start it again"
            )
        if checkpoint is not None:
            changes = check_resumed_config(checkpoint / "config.yaml", config, allow=self.allow_config_change)
            if changes:
                logger.warning("resuming %s with a changed config:\n  %s", self.run_dir, "\n  ".join(changes))
        self.device = resolve_device(cfg.device)
        loaded = load_run_policy(config, self.run_dir, self.device, checkpoint)
        self.model, self.tokenizer, self.base_path = loaded.model, loaded.tokenizer, loaded.base_path
        self.reference = None
        if config.update.kl_coef > 0:
            initial = None
            if checkpoint is not None and config.model.lora_rank == 0:  # the reference is the initial model
                initial = load_policy(config.model, self.base_path, self.device)
            self.reference = Reference(self.model, initial)
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            params, lr=config.update.lr, weight_decay=config.update.weight_decay
        )
        self.start_iteration = (
            load_training_state(checkpoint, self.optimizer) if checkpoint is not None else 0
        )
        self.completed, self.resumed_from = self.start_iteration, checkpoint
        self.advantage_state = checkpoint_advantage_state(checkpoint) if checkpoint is not None else None
        """What the estimator carries into the next iteration (MVPO's), saved with each checkpoint."""
        self.generator = build_generator(config, loaded)
        self.weights = EngineWeights(self.start_iteration)
        """The generator's weights: their version, and the lock a rollout holds while it samples."""
        self.rollouts: Rollouts = InOrder(self._collect, self.weights)
        """Where iterations get their batches (:meth:`fit` collects ahead in an asynchronous run)."""
        end_id = end_token_id(self.tokenizer)
        self.updater = PolicyUpdater(
            self.model,
            self.reference,
            self.optimizer,
            config.update,
            pad_id=self.tokenizer.pad_token_id,
            end_id=end_id,
            temperature=config.generation.temperature,
        )
        self.pool = make_pool(  # count_tasks made one env with these arguments already
            config.env,
            config.env.num_groups,
            config.env.group_size,
            seed=cfg.seed,
            tokenizer=self.tokenizer,
            probe=False,
        )
        self.evaluator = Evaluator(config, self.generator, self.tokenizer)
        durable.write_text(self.run_dir / "config.yaml", config.to_yaml())
        record_start(self.run_dir, config.to_dict(), backend="local", device=str(self.device))
        self.logger = MetricsLogger(
            self.run_dir, config.logging, start_iteration=self.start_iteration, run_config=config.to_dict()
        )

    # ----------------------------------------------------------------- one iteration
    def run_iteration(self, iteration: int) -> IterationResult:
        """One iteration (:func:`~hgpo_train.run.loop.run_one_iteration`); 0-based."""
        return run_one_iteration(self, iteration)

    def update_policy(
        self, iteration: int, batch: StepBatch, trained: StepBatch, advantages: np.ndarray
    ) -> dict[str, float]:
        """PPO on the rows that train, then the new weights to the generator."""
        start = time.perf_counter()
        self.wait_for_save()  # the last iteration's checkpoint, written while this rollout ran
        self.status(f"update on {len(trained)} steps")
        rng, _, _ = self._draws(iteration)  # mini-batch order: the generator after the tasks' draws
        metrics = self.updater.update(trained, advantages, rng)
        update_s = time.perf_counter() - start
        start = time.perf_counter()
        self.weights.replace(lambda: self.generator.sync_weights(self.model), iteration + 1)
        return {**metrics, "time/update_s": update_s, "time/sync_s": time.perf_counter() - start}

    def train_iteration(self, iteration: int) -> dict[str, float]:
        return self.run_iteration(iteration).metrics

    def _draws(self, iteration: int) -> tuple[np.random.Generator, list[int], list[int] | None]:
        """The iteration's generator, after it drew the groups' seeds and task ids (returned)."""
        rng = np.random.default_rng(iteration_seed(self.config.train.seed, iteration))
        return rng, *draw_group_tasks(rng, self.config.env.num_groups, self.num_tasks)

    def _collect(self, iteration: int, abandon: Callable[[], bool]) -> StepBatch:
        """The iteration's rollouts (:func:`~hgpo_train.run.loop.collect_iteration`), the sampler
        seeded from the iteration; a stop request, or ``abandon()``, abandons it."""
        seed = iteration_seed(self.config.train.seed, iteration)
        batch = collect_iteration(
            self,
            iteration,
            abandon,
            progress=lambda turn, running, steps: self.status(
                f"rollout turn {turn}: {running}/{self.pool.num_envs} episodes running, {steps} steps"
            ),
            before_attempt=lambda: torch.manual_seed(seed),
        )
        if self.config.update.off_policy_correction != "off" and batch.behaviour_logprobs is None:
            # the hf generator's sampling weights score their own tokens, while no sync can change them
            sampler = self.generator.model
            batch.behaviour_logprobs = [t.numpy() for t in self.updater.response_logprobs(sampler, batch)]
        return batch

    # ----------------------------------------------------------------- the loop
    def fit(self) -> dict[str, float]:
        """Run the remaining iterations on the shared schedule (:func:`~hgpo_train.run.loop.run_iterations`:
        evaluations, a checkpoint per iteration, stopping at a safe point); returns the last
        iteration's metrics."""
        cfg = self.config.train
        progress = _progress(cfg.iterations, self.start_iteration, self.config.logging.progress_bar)

        def logged(done: int, metrics: dict[str, float]) -> None:
            self.completed = done
            progress.set_postfix(
                {
                    "success": f"{metrics.get('rollout/success_rate', 0.0):.2f}",
                    "loss": f"{metrics.get('update/loss', 0.0):.4f}",
                    "steps": int(metrics.get("rollout/step_samples", 0)),
                    "s/it": f"{metrics.get('time/iteration_s', 0.0):.1f}",
                }
            )
            progress.update(1)

        self.status = lambda text: progress.set_description_str(text, refresh=True)
        self.rollouts = rollout_source(
            self._collect,
            self.weights,
            start=self.start_iteration,
            stop=cfg.iterations,
            staleness=cfg.async_staleness,
        )
        try:
            return run_iterations(
                self,
                start=self.start_iteration,
                iterations=cfg.iterations,
                eval_every=cfg.eval_every,
                logger=self.logger,
                on_logged=logged,
            )
        finally:
            self.rollouts.close()
            self.rollouts = InOrder(self._collect, self.weights)
            self.status = _quiet
            progress.close()

    def evaluate(self, iteration: int) -> dict[str, float]:
        """The policy after ``iteration`` on the eval panel: its metrics (``eval/``), and its results
        file in the run folder (:meth:`Evaluator.record`)."""
        self.status("evaluation")
        with self.weights.sampling():  # the generator is the rollouts' too
            return self.evaluator.record(iteration, self.run_dir).metrics("eval/")

    def stop_requested(self) -> bool:
        return stop_requested(self.run_dir)

    def start_save(self, iteration: int) -> None:
        """:meth:`save` on a thread, with the generators' and the estimator's states as they are now."""
        rng, state = rng_states(), self.advantage_state
        self.checkpoints.start(lambda: self._write(iteration, rng, state))

    def wait_for_save(self) -> None:
        self.checkpoints.wait()

    def save(self, iteration: int) -> Path:
        """Checkpoint the run now, as after ``iteration`` iterations."""
        return self._write(iteration, rng_states(), self.advantage_state)

    def _write(self, iteration: int, rng: dict[str, Any], advantage_state: dict[str, Any] | None) -> Path:
        cfg = self.config.train
        return save_checkpoint(
            self.run_dir,
            iteration,
            self.model,
            self.optimizer,
            self.config.to_yaml(),
            cfg.keep_checkpoints,
            cfg.save_every,
            rng,
            advantage_state,
        )

    def last_checkpoint(self) -> Path | None:
        """The newest complete checkpoint in the run folder."""
        return latest_checkpoint(self.run_dir)

    def close(self) -> None:
        self.checkpoints.close()
        clear_stop(self.run_dir)
        for part in (self.pool, self.evaluator, self.logger):
            if part is not None:
                part.close()


def _quiet(text: str) -> None:
    """A status line nobody shows (outside :meth:`Trainer.fit`)."""


def _progress(total: int, initial: int, enabled: bool) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, disable=not enabled, unit="it", dynamic_ncols=True)
