"""Resuming a run folder: which changes to its config a re-run may make without asking.

A run folder keeps the config it was trained with (``config.yaml``); a re-run of the same command
resumes from its latest checkpoint only if the config still computes the same iterations.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hgpo_env.textenv.arguments import read_yaml
from hgpo_train.config import BACKEND_SECTION, Config, ConfigError
from hgpo_train.config.keys import flatten_dotted

RESUMABLE_CHANGES = frozenset(
    {"train.iterations", "train.output_dir", "train.threads", "train.device", "logging.progress_bar"}
)
"""Keys a resumed run may change without asking: they do not change what the iterations compute."""


def config_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """``key: old -> new`` for each key whose value differs between two config dicts, apart
    from :data:`RESUMABLE_CHANGES` and the ``openrlhf:`` section."""
    flat_old, flat_new = flatten_dotted(old, depth=1), flatten_dotted(new, depth=1)  # dict fields stay whole
    return [
        f"{key}: {flat_old.get(key, '(unset)')!r} -> {flat_new.get(key, '(unset)')!r}"
        for key in sorted(flat_old.keys() | flat_new.keys())
        if key not in RESUMABLE_CHANGES
        and not key.startswith(BACKEND_SECTION + ".")  # where an OpenRLHF run goes, not what it computes
        and flat_old.get(key) != flat_new.get(key)
    ]


def check_resumed_config(saved: Path, config: Config, *, allow: bool) -> list[str]:
    """The changes from the config a run folder was trained with (``saved``, its config.yaml) to
    ``config``; raises :class:`ConfigError` listing them unless ``allow``."""
    changes = config_changes(read_yaml(saved.read_text()), config.to_dict())
    if changes and not allow:
        raise ConfigError(
            f"{config.train.output_dir} was trained with a different config; changed:\n  "
            + "\n  ".join(changes)
            + "\nre-run with the old settings, pass --allow-config-change to resume with these, "
            "or --overwrite to start the run again"
        )
    return changes
