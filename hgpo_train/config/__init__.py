"""Stage 0 of an iteration, the run config: its sections, how files and overrides resolve into
one, and the dotted keys both backends read.

May import :mod:`hgpo_train.advantage` (the estimator's settings are a section) and hgpo_env's
option checks; nothing else of hgpo_train. Every name of the config is importable from here.
"""

from hgpo_train.config.keys import CommaList, ConfigError, Section
from hgpo_train.config.loading import ENV_PRESETS, check_env_name, load_config
from hgpo_train.config.openrlhf import CPU_SETTINGS, OpenRLHFConfig
from hgpo_train.config.sections import (
    BACKEND_SECTION,
    ENV_IDS,
    AgentLoop,
    Config,
    EnvConfig,
    EvalConfig,
    GenerationConfig,
    LoggingConfig,
    ModelConfig,
    OffPolicyCorrection,
    TinyModelConfig,
    TrainConfig,
    UpdateConfig,
)

__all__ = [
    "BACKEND_SECTION",
    "CPU_SETTINGS",
    "ENV_IDS",
    "ENV_PRESETS",
    "AgentLoop",
    "CommaList",
    "Config",
    "ConfigError",
    "EnvConfig",
    "EvalConfig",
    "GenerationConfig",
    "LoggingConfig",
    "ModelConfig",
    "OffPolicyCorrection",
    "OpenRLHFConfig",
    "Section",
    "TinyModelConfig",
    "TrainConfig",
    "UpdateConfig",
    "check_env_name",
    "load_config",
]
