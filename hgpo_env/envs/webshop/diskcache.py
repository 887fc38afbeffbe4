"""Per-catalog artefacts (search index, title nouns) cached under ``data_home()/webshop``.

They are pure functions of the catalog and a format version, so a path keyed by both is safe to
reuse across processes. Writing goes through a temporary sibling that is renamed into place, so
a reader never sees half an artefact; a data home that cannot be written only costs a warning.
Each kind is bounded (:func:`prune`): past a count or a size, the least recently used go.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

import xxhash

from hgpo_env.textenv.data import data_home


def cache_path(kind: str, *key: str) -> Path:
    """Where the artefact ``kind`` for ``key`` (catalog digest, format settings) lives."""
    return data_home() / "webshop" / kind / xxhash.xxh3_128_hexdigest("|".join(key).encode())


def store(path: Path, write: Callable[[Path], None]) -> None:
    """Create ``path`` (a file or a folder) with ``write(temporary_path)``, atomically."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".writing-", dir=path.parent)) / path.name
        write(staging)
        try:
            staging.rename(path)
        except OSError:  # another process stored it first
            pass
        shutil.rmtree(staging.parent, ignore_errors=True)
    except OSError as error:
        warnings.warn(f"could not cache {path.name} under {path.parent}: {error}", stacklevel=3)


def touch(path: Path) -> None:
    """Mark an artefact used now (what :func:`prune` keeps longest)."""
    with contextlib.suppress(OSError):
        os.utime(path)


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def prune(kind: str, max_entries: int, max_bytes: int, keep: Path | None = None) -> list[Path]:
    """Delete the least recently used artefacts of ``kind`` beyond ``max_entries`` or ``max_bytes``
    (never ``keep``, the one just made); returns what went. Half-written ones are not counted."""
    folder = data_home() / "webshop" / kind
    try:
        entries = [p for p in folder.iterdir() if not p.name.startswith(".writing-")]
    except OSError:
        return []
    entries.sort(key=lambda p: (p == keep, p.stat().st_mtime), reverse=True)  # newest (and keep) first
    removed, total = [], 0
    for count, entry in enumerate(entries, start=1):
        total += _size(entry)
        if entry != keep and (count > max_entries or total > max_bytes):
            if entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
            removed.append(entry)
    return removed
