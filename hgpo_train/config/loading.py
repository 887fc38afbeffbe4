"""Resolving a run config.

A run is resolved in this order, each layer overriding the one before:

1. the field defaults of :mod:`hgpo_train.config.sections` (the paper's ALFWorld setting),
2. the preset of the chosen env (:data:`ENV_PRESETS`: step limit, normalisation mode),
3. a YAML file (``--config``), nested like the sections,
4. ``--env`` / ``--model`` and ``section.field=value`` (or ``--section.field value``) overrides.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from hgpo_train.config.keys import ConfigError, merge, one_line, parse_override, read_config_file, set_dotted
from hgpo_train.config.sections import ENV_IDS, Config, EnvConfig

ENV_PRESETS: dict[str, dict[str, Any]] = {
    "alfworld": {
        "env.max_steps": 50,
        "advantage.mode": "mean_std_norm",
        "eval.env_kwargs": {"split": "valid_seen"},
    },
    "webshop": {"env.max_steps": 30, "advantage.mode": "mean_norm", "eval.env_kwargs": {"split": "test"}},
    "rooms": {"env.max_steps": 30, "advantage.mode": "mean_std_norm", "eval.env_kwargs": {"split": "eval"}},
    "HGPO-TextWorldExpress-v0": {"eval.env_kwargs": {"split": "test"}},
    "HGPO-ScienceWorld-v0": {"eval.env_kwargs": {"split": "test"}},
    "HGPO-BabyAI-v0": {"eval.env_kwargs": {"split": "eval"}},
    "HGPO-TextArena-v0": {"eval.env_kwargs": {"split": "eval"}},
}
"""Per-env defaults from the paper (ALFWorld 50 steps with mean_std_norm, WebShop 30 with mean_norm)
and each env's held-out evaluation split; an env without an entry gets the dataclass defaults."""


def check_env_name(name: str) -> None:
    """Raise ConfigError unless ``name`` is a short name or a Gymnasium id that ``make`` can build."""
    if name in ENV_IDS:
        return
    import gymnasium as gym

    from hgpo_env.textenv.registration import import_env_module

    try:
        env_id = import_env_module(name)
    except ImportError as error:
        raise ConfigError(
            f"env.name: {name!r}: cannot import {name.rpartition(':')[0]!r} ({error})"
        ) from None
    if env_id not in gym.registry:
        close = difflib.get_close_matches(env_id, [*ENV_IDS, *gym.registry], n=3)
        hint = f"; did you mean {' or '.join(map(repr, close))}?" if close else ""
        raise ConfigError(
            f"env.name: {name!r} is not {', '.join(ENV_IDS)} or a registered Gymnasium id "
            f"(register yours in a module and name it 'module:Id'){hint}"
        )


def load_config(
    path: str | Path | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    *,
    env: str | None = None,
    model: str | None = None,
    ray_address: str | None = None,
) -> Config:
    """Resolve a run config from defaults, the env preset, a YAML file and overrides."""
    tree = read_config_file(path) if path is not None else {}
    cli: dict[str, Any] = {}
    for text in overrides:
        set_dotted(cli, *parse_override(text, Config))
    for key, value in (
        ("env.name", env),
        ("model.name_or_path", model),
        ("openrlhf.ray_address", ray_address),
    ):
        if value is not None:
            set_dotted(cli, key, value)
    name = cli.get("env", {}).get("name") or (tree.get("env") or {}).get("name") or EnvConfig().name
    check_env_name(name)
    preset: dict[str, Any] = {}
    short = {env_id: short for short, env_id in ENV_IDS.items()}.get(name, name)
    for key, value in ENV_PRESETS.get(short, {}).items():
        set_dotted(preset, key, value)
    # a config is data: validated as JSON in strict mode, so ``true`` is no 1, ``"3"`` no 3 and
    # ``3.0`` no 3 (Python's lax mode takes all three); what YAML reads beyond JSON, a date, is text
    resolved = json.dumps(merge(merge(preset, tree), cli), default=str)
    try:
        return Config.model_validate_json(resolved, strict=True)
    except ValidationError as error:
        raise one_line(error, Config) from None
