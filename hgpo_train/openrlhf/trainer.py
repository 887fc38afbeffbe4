"""The single controller of an OpenRLHF run, replacing ``PPOTrainer``.

OpenRLHF's launcher (``openrlhf.cli.train_ppo_ray.train``) places the vLLM engines and the
DeepSpeed policy/reference actor groups, then starts ``PPOTrainer`` (a Ray actor) and calls its
``fit``. :class:`HGPOTrainer` subclasses ``PPOTrainer.__ray_actor_class__`` (the ``@ray.remote``
class itself cannot be subclassed) and keeps what is OpenRLHF's job:

* ``BasePPOTrainer.train_step``: experience making (policy and reference log-probs), handing the
  samples to the DeepSpeed ranks, the PPO update, and the weight broadcast to vLLM;
* the actors' DeepSpeed checkpoints (``save_checkpoint``) and their loading on start.

and replaces the prompt dataset with environments: each iteration plays ``env.num_groups`` task
groups with the shared rollout code on env actors spread over the cluster's CPUs
(``GroupedEnvPool`` with its Ray backend), computes the step credit as the single-machine trainer
does, turns every step into one sample carrying its advantage
(:mod:`~hgpo_train.openrlhf.samples`), which :class:`StepAdvantageMaker` writes on its tokens.
The run's schedule is the shared one (:func:`~hgpo_train.run.loop.run_iterations`), and its metrics
go to the same ``metrics.jsonl``/TensorBoard under the same names.
"""

from __future__ import annotations

import math
import shutil
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import ray
from openrlhf.trainer.ppo_trainer import BasePPOTrainer, PPOTrainer
from openrlhf.trainer.ray.vllm_engine import batch_vllm_engine_call
from openrlhf.utils.utils import get_tokenizer
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from hgpo_train.config import Config, OpenRLHFConfig
from hgpo_train.evaluation.evaluate import Evaluator
from hgpo_train.openrlhf.constraints import constraint_table, start_store
from hgpo_train.openrlhf.engines import EngineGenerator
from hgpo_train.openrlhf.experience_maker import StepAdvantageMaker
from hgpo_train.openrlhf.gap import gap_metrics, policy_logprobs, probe_rows, score_on_engines
from hgpo_train.openrlhf.padding import pad_multiple
from hgpo_train.openrlhf.resume import COMPLETE, tag_iteration
from hgpo_train.openrlhf.samples import SampleLayout, step_experiences
from hgpo_train.rollout.batch import StepBatch
from hgpo_train.rollout.collect import count_tasks, make_pool, progress_lines
from hgpo_train.rollout.overlap import EngineWeights, rollout_source
from hgpo_train.run import durable
from hgpo_train.run.checkpoint import kept_iterations
from hgpo_train.run.loop import collect_iteration, run_iterations, run_one_iteration
from hgpo_train.run.stopping import stop_requested
from hgpo_train.run.tracking import MetricsLogger

# OpenRLHF ships its samples to the model actors zero-copy (RAY_ENABLE_ZERO_COPY_TORCH_TENSORS, its
# own ray.init setting, on GPUs too), and Ray warns once per process that a tensor written after
# shipping could be corrupted: a risk of OpenRLHF's design, not of this run, and the warning
# reached every run's console; so did PyTorch's on the receiving side, that such a tensor is read-only.
warnings.filterwarnings("ignore", message="Zero-copy tensor serialization is enabled")
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")


LOCAL_NAMES = {
    "policy_loss": "update/pg_loss",
    "kl": "update/kl_ref",
    "actor_lr": "update/lr",
    "actor_grad_norm": "update/grad_norm",
    "timing/ppo_train": "time/update_s",
    "timing/broadcast": "time/sync_s",
    "vllm_kl": "update/behaviour_kl",
    "is_filter_ratio": "update/off_policy_filtered",
}
"""OpenRLHF's status keys that mean what a local trainer's metric means, under its name."""


def status_metrics(status: dict[str, Any]) -> dict[str, float]:
    """OpenRLHF's train_step status under this project's metric names.

    Its ``rollout/*`` statistics count padding samples, so they are dropped (the StepBatch's own
    are logged); what the local trainer also logs goes under its name (:data:`LOCAL_NAMES`), the
    other update statistics under ``update/`` and the other phase timings under ``time/``.
    ``update/loss`` is the policy loss, which the one-line summary shows.
    """
    out: dict[str, float] = {}
    for key, value in status.items():
        if not isinstance(value, (int, float)) or key.startswith("rollout/"):
            continue
        if key in LOCAL_NAMES:
            out[LOCAL_NAMES[key]] = float(value)
        elif key.startswith("timing/"):
            out[f"time/{key.removeprefix('timing/')}_s"] = float(value)
        else:
            out[f"update/{key}"] = float(value)
    if "policy_loss" in status:
        out["update/loss"] = float(status["policy_loss"])
    return out


class EngineLock:
    """OpenRLHF's ``VLLMLock`` (its asynchronous trainer's mutex between generation and the weight
    broadcast, an actor granting in order) as a context manager."""

    def __init__(self) -> None:
        from openrlhf.trainer.ppo_trainer_async import VLLMLock

        self.actor = VLLMLock.remote()

    def __enter__(self) -> None:
        ray.get(self.actor.acquire.remote())

    def __exit__(self, *exc: object) -> None:
        ray.get(self.actor.release.remote())


def summary_line(done: int, iterations: int, metrics: dict[str, float]) -> str:
    """One line per iteration: what a user watches (success, invalid actions, loss, the engine gap)."""
    parts = [
        f"iteration {done}/{iterations}",
        f"success {metrics.get('rollout/success_rate', 0.0):.2f}",
        f"invalid {metrics.get('rollout/invalid_rate', 0.0):.2f}",
        f"loss {metrics.get('update/loss', 0.0):.4f}",
    ]
    if "engine_gap/mean" in metrics:
        parts.append(f"engine gap {metrics['engine_gap/mean']:.2g} (max {metrics['engine_gap/max']:.2g})")
    if "eval/success_rate" in metrics:
        parts.append(f"eval success {metrics['eval/success_rate']:.2f}")
    parts.append(f"{metrics.get('time/iteration_s', 0.0):.1f} s")
    return ", ".join(parts)


class HGPOTrainer(PPOTrainer.__ray_actor_class__):
    """Env rollouts -> shared advantages -> one sample per step -> OpenRLHF's PPO update and weight sync.

    ``config`` and ``cluster`` come from :class:`BoundTrainer`, through which OpenRLHF's launcher
    creates the trainer (with its own fixed arguments).
    """

    maker_class: ClassVar[type[StepAdvantageMaker]] = StepAdvantageMaker
    """The experience maker (a subclass may record what it writes)."""

    def __init__(
        self,
        pretrain: str,
        strategy: Any,
        actor_model_group: Any,
        critic_model_group: Any,
        reward_model_group: Any,
        reference_model_group: Any,
        vllm_engines: list[Any],
        *,
        config: Config,
        cluster: OpenRLHFConfig,
        **generate_kwargs: Any,
    ) -> None:
        # PPOTrainer.__init__ would build OpenRLHF's prompt dataloaders; the envs replace them, and the
        # sampling settings (generate_kwargs) come from config.generation instead.
        self.config, self.cluster, args = config, cluster, strategy.args
        tokenizer = get_tokenizer(
            pretrain, None, "left", strategy, use_fast=not args.data.disable_fast_tokenizer
        )
        BasePPOTrainer.__init__(
            self,
            strategy,
            actor_model_group,
            critic_model_group,
            reward_model_group,
            reference_model_group,
            vllm_engines,
            tokenizer,
        )
        self.experience_maker = self.maker_class(
            actor_model_group,
            critic_model_group,
            reward_model_group,
            reference_model_group,
            self.kl_ctl,
            strategy,
            tokenizer,
        )
        self.run_dir = Path(config.train.output_dir)
        self.advantage_state: dict[str, Any] | None = None
        """What the estimator carries into the next iteration (MVPO's), in each checkpoint's client state."""
        self.generator = EngineGenerator(
            vllm_engines,
            tokenizer,
            config.generation,
            args.data.max_len,
            record_logprobs=config.update.off_policy_correction != "off",
        )
        self.multiple = pad_multiple(
            self.cluster.dp_size, args.rollout.micro_batch_size, args.train.batch_size
        )
        pool_options = (  # env servers when configured, else env actors on the Ray cluster
            None
            if config.env.backend == "openenv"
            else {"backend": "ray", "ray_actor_options": {"num_cpus": self.cluster.env_actor_cpus}}
        )
        self.num_tasks = count_tasks(config.env)  # makes one env: bad arguments fail here, in one line
        self.pool = make_pool(
            config.env,
            config.env.num_groups,
            config.env.group_size,
            seed=config.train.seed,
            tokenizer=tokenizer,
            pool_options=pool_options,
            probe=False,
        )
        self.evaluator = Evaluator(config, self.generator, tokenizer)
        self.saving: list[Any] = []
        """The Ray refs of the checkpoint being written (the policy actors write it while the
        engines sample the next rollout; Ray runs an actor's calls in order)."""
        self.saving_tag = ""
        """The tag of that checkpoint (``global_stepN``)."""
        self.constraints = start_store() if config.generation.constrained else None
        self.policy_version = 0
        """Updates the DeepSpeed policy has had (its weights' version, :mod:`hgpo_train.rollout.overlap`)."""
        self.weights = EngineWeights(0, EngineLock() if config.train.async_staleness else None)
        """The engines' weights' version, and the lock a rollout holds while it samples with them."""
        self.measure_gap = config.generation.temperature == 1.0
        if not self.measure_gap:
            print(
                f"the engine-policy gap is not measured: it compares temperature-1 log-probs and "
                f"generation.temperature is {config.generation.temperature}",
                file=sys.stderr,
                flush=True,
            )

    def get_max_steps(self) -> int:
        """Optimizer steps of the run, for OpenRLHF's LR scheduler (an upper bound: episodes may end early)."""
        env = self.config.env
        most_samples = env.num_groups * env.group_size * env.max_steps
        return self.config.train.iterations * math.ceil(most_samples / self.args.train.batch_size)

    # ----------------------------------------------------------------- generation
    @contextmanager
    def _engines_awake(self) -> Iterator[None]:
        """Wake sleeping engines for generation and put them back to sleep after (colocated runs)."""
        asleep = self.args.vllm.enable_sleep
        if asleep:
            batch_vllm_engine_call(self.vllm_engines, "wake_up")
        try:
            yield
        finally:
            if asleep:
                batch_vllm_engine_call(self.vllm_engines, "sleep")

    def collect(self, iteration: int, abandon: Callable[[], bool]) -> StepBatch:
        """The iteration's rollouts (:func:`~hgpo_train.run.loop.collect_iteration`) on awake
        engines; a stop request, or ``abandon()``, abandons it."""
        with self._engines_awake():
            return collect_iteration(
                self,
                iteration,
                abandon,
                progress=progress_lines(f"iteration {iteration + 1} rollout", self.pool.num_envs),
            )

    def engine_gap(self, batch: StepBatch) -> dict[str, float]:
        """The gap between every engine and the policy on this iteration's probe samples, before
        the update (both hold the weights of the last sync); a line on stderr above the threshold."""
        rows = probe_rows(batch) if self.measure_gap else []
        if not rows:
            return {}
        with self._engines_awake():
            engine_scores = score_on_engines(self.vllm_engines, batch, rows)
        if self.constraints is not None:  # the policy scores the probes over the whole vocabulary
            ray.get(self.constraints.put.remote({}))
        return self.gap_warning(
            gap_metrics(engine_scores, policy_logprobs(self.actor_model_group, batch, rows))
        )

    def publish_constraints(self, batch: StepBatch) -> None:
        """This iteration's choices, for the DeepSpeed actors' constrained log-probs (constrained runs)."""
        if self.constraints is not None:
            ray.get(self.constraints.put.remote(constraint_table(batch, self.generator.encoder.end_id)))

    def gap_warning(self, gap: dict[str, float]) -> dict[str, float]:
        """``gap``, after a line on stderr when it is above ``openrlhf.engine_gap_warning``."""
        limit = self.cluster.engine_gap_warning
        if gap["engine_gap/mean"] > limit:
            print(
                f"warning: engine-policy gap {gap['engine_gap/mean']:.4f} nats/token is above "
                f"openrlhf.engine_gap_warning={limit}: the engines may not hold the policy's weights "
                "(weight sync); see docs/training/openrlhf.md",
                file=sys.stderr,
                flush=True,
            )
        return gap

    def evaluate(self, global_step: int = 0, **_: Any) -> dict[str, float]:
        """The policy after iteration ``global_step`` on the eval panel, its results file kept
        in the run folder as the local trainer keeps it."""
        with self.weights.sampling(), self._engines_awake():
            return self.evaluator.record(global_step, self.run_dir).metrics("eval/")

    def broadcast_to_vllm(self) -> None:
        """OpenRLHF's weight sync, once no rollout samples (:class:`EngineWeights`); the engines
        then hold the policy's weights, of version :attr:`policy_version`."""
        self.weights.replace(super().broadcast_to_vllm, self.policy_version)

    # ----------------------------------------------------------------- one iteration
    def train_iteration(self, iteration: int) -> dict[str, float]:
        """One iteration (:func:`~hgpo_train.run.loop.run_one_iteration`); 0-based."""
        return run_one_iteration(self, iteration).metrics

    def update_policy(
        self, iteration: int, batch: StepBatch, trained: StepBatch, advantages: np.ndarray
    ) -> dict[str, float]:
        """Check the engines against the policy, make one sample per step, train and sync weights."""
        began = time.perf_counter()
        gap = self.engine_gap(batch)
        gap_s = time.perf_counter() - began
        self.publish_constraints(trained)
        samples, layout = self.make_samples(trained, advantages)
        self.wait_for_save()  # the update changes what it writes
        print(f"iteration {iteration + 1}: update on {len(trained)} steps", file=sys.stderr, flush=True)
        self.policy_version = iteration + 1  # train_step updates the policy, then broadcasts it
        status, _ = self.train_step(samples, iteration)
        return {
            **status_metrics(status),
            **gap,
            "rollout/padding_samples": float(layout.padding.sum()),
            "time/engine_gap_s": gap_s,
        }

    def make_samples(self, batch: StepBatch, advantages: np.ndarray) -> tuple[list[Any], SampleLayout]:
        """One OpenRLHF sample per step, with its advantage, padded for the data-parallel ranks."""
        return step_experiences(batch, advantages, self.multiple, self.generator.encoder.end_ids)

    def start_save(self, iteration: int) -> None:
        """Start the DeepSpeed checkpoint of the policy on every rank (``global_step`` is what a
        resume starts from); :meth:`wait_for_save` finishes it."""
        self.wait_for_save()
        states = {
            "global_step": iteration,
            "episode": 0,
            "total_consumed_prompts": 0,
            "data_loader_state_dict": {},
            "advantage_state": self.advantage_state,
        }
        self.saving_tag = f"global_step{iteration}"
        self.saving = self.actor_model_group.async_run_method(
            method_name="save_checkpoint", tag=self.saving_tag, client_states=states
        )

    def wait_for_save(self) -> None:
        """Wait for the checkpoint being written on every rank, mark it complete
        (:data:`~hgpo_train.openrlhf.resume.COMPLETE`), then remove those :func:`kept_iterations`
        does not keep."""
        if not self.saving:
            return
        ray.get(self.saving)
        self.saving = []
        actor_dir = Path(self.args.ckpt.path) / "_actor"
        durable.write_text(actor_dir / self.saving_tag / COMPLETE, "every policy rank wrote its part\n")
        tags = {p: tag_iteration(p.name) for p in actor_dir.glob("global_step*") if p.is_dir()}
        kept = kept_iterations(
            set(tags.values()), self.config.train.keep_checkpoints, self.config.train.save_every
        )
        for folder, iteration in tags.items():
            if iteration not in kept:
                shutil.rmtree(folder, ignore_errors=True)

    # ----------------------------------------------------------------- the loop
    def stop_requested(self) -> bool:
        return stop_requested(self.run_dir)

    def fit(self, global_step: int = 0) -> None:
        """Run the remaining iterations on the shared schedule (:func:`~hgpo_train.run.loop.run_iterations`),
        resuming from the actors' loaded checkpoint if there is one, with a line per iteration."""
        cfg = self.config.train
        states = self.init_checkpoint_states()
        start, self.advantage_state = int(states.get("global_step", 0)), states.get("advantage_state")
        self.policy_version = start
        if start:
            self.broadcast_to_vllm()  # the engines still hold the base weights
        self.rollouts = rollout_source(
            self.collect, self.weights, start=start, stop=cfg.iterations, staleness=cfg.async_staleness
        )
        logger = MetricsLogger(
            self.run_dir, self.config.logging, start_iteration=start, run_config=self.config.to_dict()
        )
        try:
            run_iterations(
                self,
                start=start,
                iterations=cfg.iterations,
                eval_every=cfg.eval_every,
                logger=logger,
                on_logged=lambda done, metrics: print(
                    summary_line(done, cfg.iterations, metrics), file=sys.stderr, flush=True
                ),
            )
        finally:
            self.rollouts.close()
            logger.close()
            self.pool.close()
            self.evaluator.close()


class BoundTrainer:
    """The trainer actor class as OpenRLHF's launcher meets it (in place of ``PPOTrainer``): its
    ``remote`` adds the run's config and cluster settings to the launcher's fixed arguments."""

    def __init__(self, actor_class: Any, config: Config, cluster: OpenRLHFConfig) -> None:
        self.actor_class, self.config, self.cluster = actor_class, config, cluster

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        return self.actor_class.remote(*args, config=self.config, cluster=self.cluster, **kwargs)


def trainer_actor(
    config: Config, cluster: OpenRLHFConfig, base: type[HGPOTrainer] = HGPOTrainer
) -> BoundTrainer:
    """``base`` (HGPOTrainer or a subclass) as a Ray actor for this run, pinned to the driver's node.

    Pinning keeps the run folder (metrics, config) on the machine the run was launched from.
    """
    node = ray.get_runtime_context().get_node_id()
    actor = ray.remote(num_cpus=1, scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False))(base)
    return BoundTrainer(actor, config, cluster)
