"""Step credit for verifiers (v1): our envs as verifiers environments, verifiers traces under our
keys, and step advantages written into the traces. Its taskset id is ``hgpo-verifiers``."""

from integrations.verifiers.credit import assign_step_credit
from integrations.verifiers.env import (
    HGPOEnv,
    HGPOEnvConfig,
    HGPOTask,
    HGPOTaskData,
    HGPOTaskset,
    HGPOTasksetConfig,
)
from integrations.verifiers.steps import TraceSteps, trace_steps

__all__ = [
    "HGPOEnv",
    "HGPOEnvConfig",
    "HGPOTask",
    "HGPOTaskData",
    "HGPOTaskset",
    "HGPOTasksetConfig",
    "TraceSteps",
    "assign_step_credit",
    "trace_steps",
]
