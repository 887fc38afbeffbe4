"""A run config loaded and checked as ``--backend openrlhf`` checks it, for the tests."""

from __future__ import annotations

from pathlib import Path

from hgpo_train.config import Config, OpenRLHFConfig, load_config
from hgpo_train.openrlhf.checks import validate_cluster


def load_run(
    path: str | Path | None, overrides: list[str] | tuple[str, ...] = ()
) -> tuple[Config, OpenRLHFConfig]:
    """The run config and its ``openrlhf:`` section, checked for this backend."""
    config = load_config(path, overrides)
    validate_cluster(config)
    return config, config.openrlhf
