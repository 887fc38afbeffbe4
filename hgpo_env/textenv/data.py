"""Where data lives, fetching it with checksums, and unpacking archives without surprises.

Environment families keep their downloads and generated defaults under :func:`data_home`.
Downloads resume after an interruption (HTTP ``Range``) and are checked (announced size,
checksum, archive integrity) before they get their final name, so a half-written or corrupted
file is never mistaken for a good one.
Archives come from the network, so :func:`safe_extract` writes regular files and folders only,
after checking every member, and all of an archive or nothing.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import logging
import os
import shutil
import stat
import tarfile
import tempfile
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath
from typing import Any

try:
    import fcntl
except ImportError:  # Windows: no lock between processes
    fcntl = None  # type: ignore[assignment]

logger = logging.getLogger(__name__)
_CHUNK = 1 << 20
_NET_CHUNK = 1 << 16
"""Read size of a transfer: what a cut connection loses of the part at most."""


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


def check_archive(path: Path) -> None:
    """Raise ``ValueError`` unless ``path`` is a zip whose every CRC checks or a tar read to its end."""
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as bundle:
                bad = bundle.testzip()
            if bad is not None:
                raise ValueError(f"member {bad!r} fails its CRC")
            return
        with tarfile.open(path) as bundle:
            for member in bundle:
                source = bundle.extractfile(member) if member.isfile() else None
                while source is not None and source.read(_CHUNK):
                    pass
    except (OSError, EOFError, tarfile.TarError, zipfile.BadZipFile, ValueError) as error:
        raise ValueError(f"{path} is not a whole archive ({type(error).__name__}: {error})") from None


@contextlib.contextmanager
def _locked(dest: Path) -> Iterator[None]:
    """Hold an exclusive lock on the hidden ``.<name>.lock`` beside ``dest``, so two processes
    never fetch one file at once (the lock file stays: removing it would race a waiting process)."""
    with open(dest.with_name(f".{dest.name}.lock"), "a") as handle:
        if fcntl is not None:
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _expected_size(response: Any, offset: int) -> int | None:
    """The whole file's size as the response announces it (None: not announced)."""
    if response.status == 206:
        total = (response.headers.get("Content-Range") or "").rpartition("/")[2]
        if total.isdigit():
            return int(total)
    length = response.headers.get("Content-Length")
    if length is None or not length.isdigit():
        return None
    return int(length) + (offset if response.status == 206 else 0)


def download(
    url: str,
    dest: Path,
    sha256: str | None,
    *,
    resume: bool = True,
    timeout: float = 30,
    verify: Callable[[Path], None] | None = None,
) -> Path:
    """Fetch ``url`` to the file ``dest`` and return ``dest``; a partial file never gets its name.

    Bytes go to ``dest + ".part"`` first; with ``resume`` an existing part is continued with a
    ``Range`` request (restarted when the server ignores it). The part becomes ``dest`` only when
    it has the size the server announced, matches ``sha256`` (when given) and passes ``verify``
    (e.g. :func:`check_archive`, for files whose release publishes no checksum). An existing
    ``dest`` that fails them is removed, with a message, and fetched again. A transfer cut short
    (closed early, reset, stalled past ``timeout``) keeps the part for the next run to resume and
    raises ``ConnectionError``; offline, the message says where to put the file by hand. A lock
    file beside ``dest`` keeps two processes from fetching it at once.
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with _locked(dest):
        if dest.is_file():
            problem = _problem(dest, sha256, verify)
            if problem is None:
                return dest
            logger.warning("%s: %s; removed it and fetching it again", dest, problem)
            dest.unlink()
        part = dest.with_name(dest.name + ".part")
        _fetch(url, part, dest, resume, timeout)
        problem = _problem(part, sha256, verify)
        if problem is not None:
            part.unlink()
            raise ValueError(f"{url}: {problem}; removed the download")
        part.replace(dest)
    return dest


def _problem(path: Path, sha256: str | None, verify: Callable[[Path], None] | None) -> str | None:
    """Why ``path`` is not the file wanted, or None."""
    if sha256 is not None:
        actual = sha256_of(path)
        if actual != sha256.lower():
            return f"checksum mismatch: expected sha256 {sha256}, got {actual}"
    if verify is not None:
        try:
            verify(path)
        except ValueError as error:
            return str(error)
    return None


def _fetch(url: str, part: Path, dest: Path, resume: bool, timeout: float) -> None:
    """Bring ``part`` to the whole file (resuming it), or raise ``ConnectionError`` keeping it."""
    offset = part.stat().st_size if resume and part.is_file() else 0
    request = urllib.request.Request(url, headers={"Range": f"bytes={offset}-"} if offset else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            append = offset > 0 and response.status == 206
            expected = _expected_size(response, offset if append else 0)
            with open(part, "ab" if append else "wb") as out:
                shutil.copyfileobj(response, out, _NET_CHUNK)
    except urllib.error.HTTPError as error:
        if error.code == 416 and offset:  # the part already holds the whole file
            return
        raise ConnectionError(f"cannot download {url}: HTTP {error.code} {error.reason}") from error
    except (urllib.error.URLError, OSError, http.client.HTTPException) as error:
        reason = getattr(error, "reason", None) or f"{type(error).__name__}: {error}"
        kept = f" ({part.stat().st_size} bytes kept in {part}: run again to resume)" if part.is_file() else ""
        raise ConnectionError(
            f"cannot download {url}: {reason}{kept}. If this machine is offline, fetch the file "
            f"elsewhere and place it at {dest}"
        ) from error
    size = part.stat().st_size
    if expected is not None and size != expected:
        raise ConnectionError(
            f"download of {url} ended at {size} of {expected} bytes; {part} is kept: run again to resume"
        )


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
