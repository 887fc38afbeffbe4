"""Writes that a kill cannot leave half done, for the files of a run folder.

A file written here is, after a kill at any moment, either its old version or its new one: the
new text goes to a hidden temporary file beside it, is flushed to the disk (``fsync``), and is then
renamed over the old one, which POSIX makes atomic. Once a function here returns, what it wrote
survives the loss of the node too, not only of the process (the page cache of a dead node is gone).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def temporary_name(path: Path) -> Path:
    """Where :func:`write_text` stages ``path``'s new version: one fixed name per file, so a kill
    leaves at most one leftover, which the next write of that file replaces."""
    return path.with_name(f".{path.name}.tmp")


def write_text(path: str | Path, text: str) -> None:
    """Replace ``path``'s content with ``text`` atomically and durably."""
    path = Path(path)
    staged = temporary_name(path)
    with open(staged, "w", encoding="utf-8") as out:
        out.write(text)
        out.flush()
        os.fsync(out.fileno())
    os.replace(staged, path)
    sync_folder(path.parent)


def append_line(path: str | Path, line: str) -> None:
    """Append one line in a single write and flush it to the disk. A kill can cut at most this
    line, and only where the disk itself loses the write; readers skip a cut last line."""
    with open(path, "a", encoding="utf-8") as out:
        out.write(line + "\n")
        out.flush()
        os.fsync(out.fileno())


def sync_folder(folder: str | Path) -> None:
    """Make the names in ``folder`` (a rename into it) durable."""
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def sync_tree(folder: str | Path) -> None:
    """Flush every file under ``folder`` and the folders' names to the disk (before renaming the
    folder into place: otherwise the rename can reach the disk before the files it names)."""
    for root, _, files in os.walk(folder):
        for name in files:
            descriptor = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(descriptor)
            finally:
                os.close(descriptor)
        sync_folder(root)


def replace_folder(staged: Path, target: Path) -> None:
    """Put the complete folder ``staged`` in ``target``'s place. No name ever holds a half-written
    folder: a kill leaves the old ``target``, the new one, or (between the two renames) none, with
    the new one still under ``staged``."""
    sync_tree(staged)
    aside = target.with_name(f".{target.name}.old")
    shutil.rmtree(aside, ignore_errors=True)
    if target.exists():
        target.replace(aside)
    staged.replace(target)
    sync_folder(target.parent)
    shutil.rmtree(aside, ignore_errors=True)
