"""From a run config to OpenRLHF 0.11.2's command line, checked by OpenRLHF's own parser.

OpenRLHF's parser and its cross-checks live under ``if __name__ == "__main__"`` of
``openrlhf.cli.train_ppo_ray``, so the only faithful way to resolve arguments is to run that
module as ``__main__``. :func:`resolve` does so and stops it at the first call of ``train()``
(``get_strategy``), returning the validated argument namespace; :func:`launch` runs it for real.
"""

from __future__ import annotations

import runpy
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any
from unittest import mock

from hgpo_train.config import Config, OpenRLHFConfig

CLI_MODULE = "openrlhf.cli.train_ppo_ray"
ESTIMATOR_PLACEHOLDER = "group_norm"
"""OpenRLHF's argparse only knows its own estimators; the experience maker ignores this one and
writes GRPO/GiGPO/HGPO advantages from the shared code (``advantage.estimator``)."""
ADAM_BETAS = (0.9, 0.999)
"""The local trainer's ``torch.optim.AdamW`` defaults; OpenRLHF would use (0.9, 0.95)."""
REWARD_SOURCE = "hgpo-env"
"""A ``--reward.remote_url`` that no request ever goes to: without one, OpenRLHF's launcher places a
reward-model actor group on GPUs. Rewards come from the envs, already set on every sample."""
UNLIMITED_CHECKPOINTS = 1_000_000
"""OpenRLHF's --ckpt.max_num: its rotation removes the oldest by count, which would remove the
``train.save_every`` checkpoints the trainer keeps (it prunes with ``kept_iterations`` instead)."""


CORRECTIONS = {"tis": ("token", "clip"), "icepop": ("token", "mask"), "seq_mask": ("seq", "mask")}
"""``update.off_policy_correction`` as OpenRLHF's (is_correction_level, is_correction_mode), ratio gating."""


def openrlhf_argv(
    config: Config, cluster: OpenRLHFConfig, *, checkpoint_dir: str, final_dir: str
) -> list[str]:
    """OpenRLHF flags for this run; ``cluster.extra_args`` come last, so they win."""
    update, gen, model = config.update, config.generation, config.model
    rollout_micro = cluster.rollout_micro_batch_size or update.micro_batch_size
    argv = [
        "--actor.model_name_or_path",
        model.name_or_path,
        "--actor.num_nodes",
        str(cluster.num_nodes),
        "--actor.num_gpus_per_node",
        str(cluster.gpus_per_node),
        "--ref.num_nodes",
        str(cluster.num_nodes),
        "--ref.num_gpus_per_node",
        str(cluster.gpus_per_node),
        "--vllm.num_engines",
        str(cluster.vllm_num_engines),
        "--vllm.tensor_parallel_size",
        str(cluster.vllm_tensor_parallel_size),
        "--vllm.gpu_memory_utilization",
        str(cluster.vllm_gpu_memory_utilization),
        "--vllm.sync_backend",
        cluster.vllm_sync_backend,
        "--ds.zero_stage",
        str(cluster.zero_stage),
        "--ds.param_dtype",
        "bf16" if cluster.param_dtype == "fp32" else cluster.param_dtype,  # fp32: process_env.FP32_VAR
        "--ds.attn_implementation",
        cluster.attn_implementation,
        "--data.max_len",
        str(cluster.max_len),
        "--rollout.max_new_tokens",
        str(gen.max_new_tokens),
        "--rollout.temperature",
        str(gen.temperature),
        "--rollout.top_p",
        str(gen.top_p),
        "--rollout.batch_size",
        str(config.env.num_groups),
        "--rollout.n_samples_per_prompt",
        str(config.env.group_size),
        "--rollout.micro_batch_size",
        str(rollout_micro),
        "--train.micro_batch_size",
        str(update.micro_batch_size),
        "--train.batch_size",
        str(update.mini_batch_size),
        "--train.max_epochs",
        str(update.ppo_epochs),
        "--train.seed",
        str(config.train.seed),
        "--actor.adam.lr",
        str(update.lr),
        "--actor.adam.weight_decay",
        str(update.weight_decay),
        "--actor.adam.betas",  # torch's AdamW defaults, as the local trainer (OpenRLHF's own: 0.9, 0.95)
        *map(str, ADAM_BETAS),
        "--actor.lr_scheduler",
        "constant",
        "--actor.eps_clip",
        str(update.clip_ratio),
        "--actor.max_norm",
        str(update.max_grad_norm),
        "--actor.entropy_coef",
        str(update.entropy_coef),
        "--actor.loss_agg_mode",
        "token-mean",
        "--algo.advantage.estimator",
        ESTIMATOR_PLACEHOLDER,
        "--algo.kl.init_coef",
        str(update.kl_coef),
        "--algo.kl.use_loss",
        "--algo.kl.estimator",
        "k3",
        "--reward.remote_url",
        REWARD_SOURCE,
        "--ckpt.path",
        checkpoint_dir,
        "--ckpt.output_dir",
        final_dir,
        "--ckpt.max_num",  # the trainer removes what kept_iterations does not keep; no rotation here
        str(UNLIMITED_CHECKPOINTS),
        "--eval.steps",
        "-1",
        "--ckpt.save_steps",
        "-1",
    ]
    overlap = config.train.async_staleness > 0
    # vLLM cannot sleep on CPU, nor while it generates beside the update
    sleep = cluster.colocate_all and cluster.device == "cuda" and not overlap
    flags = {
        # OpenRLHF's async mode: engines of their own (not in the policy's placement group), and
        # the weight sync over its broadcast group (CUDA IPC is for colocated engines)
        "--train.async_enable": overlap,
        "--train.colocate_all": cluster.colocate_all,
        "--train.colocate_actor_ref": not cluster.colocate_all and update.kl_coef > 0,
        "--vllm.enable_sleep": sleep,
        "--ds.enable_sleep": sleep,
        "--vllm.enable_prefix_caching": cluster.vllm_enable_prefix_caching,
        "--vllm.enforce_eager": cluster.vllm_enforce_eager,
        "--ds.adam_offload": cluster.adam_offload,
        "--ref.offload": cluster.ref_offload,
        "--actor.gradient_checkpointing_enable": model.gradient_checkpointing,
        "--ckpt.load_enable": config.train.resume,
    }
    argv += [flag for flag, on in flags.items() if on]
    if update.off_policy_correction != "off":  # the engines then return each token's log-prob
        level, mode = CORRECTIONS[update.off_policy_correction]
        argv += [
            "--algo.advantage.is_correction_level",
            level,
            "--algo.advantage.is_correction_mode",
            mode,
            "--algo.advantage.is_correction_threshold",
            *map(str, update.off_policy_bounds),
        ]
    if model.lora_rank > 0:
        argv += [
            "--ds.lora.rank",
            str(model.lora_rank),
            "--ds.lora.alpha",
            str(model.lora_alpha),
            "--ds.lora.dropout",
            str(model.lora_dropout),
            "--ds.lora.target_modules",
            *model.lora_target_modules,
        ]
    return argv + list(cluster.extra_args)


class _Resolved(Exception):
    """Raised from ``get_strategy`` to stop OpenRLHF's CLI once its arguments are final."""

    def __init__(self, args: SimpleNamespace) -> None:
        super().__init__("resolved")
        self.namespace = args


@contextmanager
def _argv(argv: list[str]) -> Iterator[None]:
    saved = sys.argv
    sys.argv = [CLI_MODULE, *argv]
    try:
        yield
    finally:
        sys.argv = saved


def resolve(argv: list[str]) -> SimpleNamespace:
    """OpenRLHF's hierarchical argument namespace for ``argv``, after all its own checks.

    Needs openrlhf importable (on a machine without vllm/flash-attn, inside
    :func:`~hgpo_train.openrlhf.stubs.stubbed_gpu_packages`). Raises SystemExit on a flag its
    parser rejects and AssertionError on a combination it rejects, as the CLI itself would.
    """
    import openrlhf.utils
    import ray

    def stop(args: Any) -> None:
        raise _Resolved(args)

    # train() calls ray.init() unless Ray is up, then get_strategy(args): say Ray is up, stop there.
    with (
        _argv(argv),
        mock.patch.object(ray, "is_initialized", return_value=True),
        mock.patch.object(openrlhf.utils, "get_strategy", side_effect=stop),
    ):
        try:
            runpy.run_module(CLI_MODULE, run_name="__main__")
        except _Resolved as resolved:
            return resolved.namespace
    raise RuntimeError(f"{CLI_MODULE} returned without calling train(); has OpenRLHF's CLI changed?")


def launch(argv: list[str], trainer_class: Any) -> None:
    """Run OpenRLHF's launcher with ``trainer_class`` (a Ray actor class) as its PPOTrainer.

    ``train()`` imports ``PPOTrainer`` from ``openrlhf.trainer.ppo_trainer``, or with
    ``--train.async_enable`` ``PPOTrainerAsync`` from ``openrlhf.trainer.ppo_trainer_async``, when
    it is called (train_ppo_ray.py lines 145-148), so replacing both module attributes first
    substitutes ours: it overlaps generation with the update itself (:mod:`hgpo_train.rollout.overlap`).
    """
    from openrlhf.trainer import ppo_trainer, ppo_trainer_async

    with (
        _argv(argv),
        mock.patch.object(ppo_trainer, "PPOTrainer", trainer_class),
        mock.patch.object(ppo_trainer_async, "PPOTrainerAsync", trainer_class),
    ):
        runpy.run_module(CLI_MODULE, run_name="__main__")


def namespace_dict(args: SimpleNamespace) -> dict[str, Any]:
    """A nested namespace as plain nested dicts (for printing)."""
    return {k: namespace_dict(v) if isinstance(v, SimpleNamespace) else v for k, v in vars(args).items()}
