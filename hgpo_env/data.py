"""Where data lives, fetching it with checksums, and unpacking archives without surprises.

Environment families keep their downloads and generated defaults under :func:`data_home`.
Downloads resume after an interruption (HTTP ``Range``) and are verified before they replace
the destination, so a half-written or corrupted file is never mistaken for a good one.
Archives come from the network, so :func:`safe_extract` writes regular files and folders only,
after checking every member, and all of an archive or nothing.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import tarfile
import tempfile
import urllib.error
import urllib.request
import zipfile
from pathlib import Path, PurePosixPath
from typing import Any

_CHUNK = 1 << 20


def data_home() -> Path:
    """The root for downloaded and generated data: ``$HGPO_DATA`` or ``~/.cache/hgpo``."""
    root = os.environ.get("HGPO_DATA")
    return Path(root).expanduser() if root else Path.home() / ".cache" / "hgpo"


def sha256_of(path: Path) -> str:
    """Hex SHA-256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def download(url: str, dest: Path, sha256: str | None, *, resume: bool = True, timeout: float = 30) -> Path:
    """Fetch ``url`` to the file ``dest`` and return ``dest``.

    Bytes go to ``dest + ".part"`` first; with ``resume`` an existing part is continued with a
    ``Range`` request (restarted when the server ignores it). When ``sha256`` is given the file
    must match it: an existing ``dest`` that matches is kept without any network access, and a
    mismatch deletes the part and raises. Offline machines get a ``ConnectionError`` that says
    where to put the file by hand.
    """
    dest = Path(dest)
    if dest.is_file() and (sha256 is None or sha256_of(dest) == sha256.lower()):
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    offset = part.stat().st_size if resume and part.is_file() else 0
    request = urllib.request.Request(url, headers={"Range": f"bytes={offset}-"} if offset else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            append = offset > 0 and response.status == 206
            with open(part, "ab" if append else "wb") as out:
                shutil.copyfileobj(response, out, _CHUNK)
    except urllib.error.HTTPError as error:
        if not (error.code == 416 and offset):  # 416: the part already holds the whole file
            raise ConnectionError(f"cannot download {url}: HTTP {error.code} {error.reason}") from error
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise ConnectionError(
            f"cannot download {url}: {reason}. If this machine is offline, fetch the file "
            f"elsewhere and place it at {dest}"
        ) from error
    if sha256 is not None:
        actual = sha256_of(part)
        if actual != sha256.lower():
            part.unlink()
            raise ValueError(f"checksum mismatch for {url}: expected sha256 {sha256}, got {actual}")
    part.replace(dest)
    return dest


class UnsafeArchiveError(ValueError):
    """An archive member that :func:`safe_extract` will not write; nothing was written."""


def _member_parts(name: str, archive: Path) -> tuple[str, ...]:
    """The path parts of a member name, checked lexically: no absolute path, drive or ``..``."""
    path = PurePosixPath(name.replace("\\", "/"))
    if path.is_absolute() or (path.parts and path.parts[0].endswith(":")):
        raise UnsafeArchiveError(f"{archive}: member {name!r} has an absolute path")
    if ".." in path.parts:
        raise UnsafeArchiveError(f"{archive}: member {name!r} points outside the destination ('..')")
    return tuple(part for part in path.parts if part not in ("", "."))


def _unsupported(archive: Path, name: str, kind: str) -> UnsafeArchiveError:
    return UnsafeArchiveError(
        f"{archive}: member {name!r} is a {kind}; only regular files and folders are unpacked"
    )


def _tar_members(bundle: tarfile.TarFile, archive: Path) -> list[tuple[tuple[str, ...], Any]]:
    members = []
    for member in bundle.getmembers():
        parts = _member_parts(member.name, archive)
        if member.issym() or member.islnk():
            raise _unsupported(archive, member.name, "link")
        if not (member.isfile() or member.isdir()):
            raise _unsupported(archive, member.name, "device, pipe or other special file")
        members.append((parts, member if member.isfile() else None))
    return members


def _zip_members(bundle: zipfile.ZipFile, archive: Path) -> list[tuple[tuple[str, ...], Any]]:
    members = []
    for info in bundle.infolist():
        parts = _member_parts(info.filename, archive)
        kind = stat.S_IFMT(info.external_attr >> 16)  # 0 when the archiver stored no Unix mode
        if kind == stat.S_IFLNK:
            raise _unsupported(archive, info.filename, "link")
        if kind not in (0, stat.S_IFREG, stat.S_IFDIR):
            raise _unsupported(archive, info.filename, "device, pipe or other special file")
        members.append((parts, None if info.is_dir() else info))
    return members


def safe_extract(archive: Path, dest: Path) -> None:
    """Unpack a zip or tar archive (any compression) into ``dest``, whole or not at all.

    Only regular files and folders are accepted (the ALFWorld and WebShop archives hold nothing
    else), and every member's name is checked lexically (no absolute path, drive or ``..``)
    before anything is written, so no link can ever redirect a write. Members are written into
    a fresh folder beside ``dest``, with plain permissions (no setuid), and moved into ``dest``
    once all are written; top-level entries already in ``dest`` are replaced. Raises
    :class:`UnsafeArchiveError` (a ``ValueError``) naming the member otherwise.
    """
    archive, dest = Path(archive), Path(dest)
    is_zip = zipfile.is_zipfile(archive)
    if not is_zip and not tarfile.is_tarfile(archive):
        raise ValueError(f"{archive} is neither a zip nor a tar archive")
    try:
        with zipfile.ZipFile(archive) if is_zip else tarfile.open(archive) as bundle:
            if is_zip:
                _write_all(_zip_members(bundle, archive), bundle.open, dest)
            else:
                _write_all(_tar_members(bundle, archive), bundle.extractfile, dest)
    except (OSError, tarfile.TarError, zipfile.BadZipFile) as error:
        raise ValueError(f"{archive}: cannot unpack ({type(error).__name__}: {error})") from error


def _write_all(members: list[tuple[tuple[str, ...], Any]], read: Any, dest: Path) -> None:
    """Write checked members into a fresh folder beside ``dest``, then move them into it."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.unpacking-", dir=dest.parent))
    try:
        for parts, source in members:
            target = staging.joinpath(*parts)
            if source is None:
                target.mkdir(mode=0o755, parents=True, exist_ok=True)
                continue
            target.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
            with read(source) as data, open(target, "wb") as out:
                shutil.copyfileobj(data, out, _CHUNK)
            target.chmod(0o644)
        if not dest.exists():
            staging.replace(dest)
            return
        for entry in staging.iterdir():
            existing = dest / entry.name
            if existing.is_dir() and not existing.is_symlink():
                shutil.rmtree(existing)
            elif existing.exists() or existing.is_symlink():
                existing.unlink()
            entry.replace(existing)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
