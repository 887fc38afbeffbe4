"""What the OpenRLHF backend checks beyond the ``openrlhf:`` section's own types.

Everything about *what* is trained (model, env, advantages, PPO hyper-parameters, run folder)
and *where* an OpenRLHF run goes (the section :class:`~hgpo_train.config.OpenRLHFConfig`) is one
:class:`~hgpo_train.config.Config`; here are the checks across the two that only this backend needs.
"""

from __future__ import annotations

from hgpo_train.config import BACKEND_SECTION, Config, ConfigError

SECTION = BACKEND_SECTION

CORRECTION_FLAGS = ("level", "mode", "threshold", "gating")
REFUSED_ARGS = {
    f"--algo.advantage.is_correction_{flag}": (
        "is set by update.off_policy_correction (tis, icepop, seq_mask) and update.off_policy_bounds, "
        "which also make the engines record the log-probs it reads"
    )
    for flag in CORRECTION_FLAGS
}
"""OpenRLHF flags this backend cannot honour, with why, refused before anything starts."""


def validate_cluster(config: Config) -> None:
    """Checks of the ``openrlhf:`` section against the rest, with messages that name the keys to change."""
    cluster = config.openrlhf
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
    if cluster.device != "cpu" and cluster.param_dtype == "fp32":
        raise ConfigError(
            f"{SECTION}.param_dtype=fp32 is for {SECTION}.device=cpu: OpenRLHF trains in bf16 or fp16 on GPUs"
        )
    refused = sorted({a.split("=")[0] for a in cluster.extra_args} & set(REFUSED_ARGS))
    if refused:
        raise ConfigError(f"{SECTION}.extra_args: {refused[0]} {REFUSED_ARGS[refused[0]]}")
    if config.generation.max_new_tokens >= cluster.max_len:
        raise ConfigError(f"generation.max_new_tokens must be below {SECTION}.max_len")
