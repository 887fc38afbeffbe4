"""Data helpers: data home, resumable checksummed downloads, archive extraction that refuses escapes."""

from __future__ import annotations

import hashlib
import http.server
import io
import socket
import stat
import tarfile
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

from hgpo_env.data import data_home, download, safe_extract

PAYLOAD = bytes(range(256)) * 4096  # 1 MiB
PAYLOAD_SHA = hashlib.sha256(PAYLOAD).hexdigest()


class _RangeHandler(http.server.BaseHTTPRequestHandler):
    """Serves PAYLOAD at any path and honours single ``bytes=N-`` ranges."""

    requests: ClassVar[list[str | None]] = []

    def do_GET(self) -> None:
        header = self.headers.get("Range")
        type(self).requests.append(header)
        start = int(header.removeprefix("bytes=").rstrip("-")) if header else 0
        if start >= len(PAYLOAD):
            self.send_response(416)
            self.end_headers()
            return
        body = PAYLOAD[start:]
        self.send_response(206 if header else 200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def server() -> Iterator[str]:
    _RangeHandler.requests = []
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _RangeHandler)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/file.bin"
    httpd.shutdown()
    httpd.server_close()


def test_data_home_follows_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HGPO_DATA", str(tmp_path))
    assert data_home() == tmp_path
    monkeypatch.delenv("HGPO_DATA")
    assert data_home() == Path.home() / ".cache" / "hgpo"


def test_download_verifies_and_skips_existing(server: str, tmp_path: Path) -> None:
    dest = tmp_path / "sub" / "file.bin"
    assert download(server, dest, PAYLOAD_SHA) == dest
    assert dest.read_bytes() == PAYLOAD
    download(server, dest, PAYLOAD_SHA)
    assert len(_RangeHandler.requests) == 1  # the second call found a verified file


def test_download_resumes_a_partial_file(server: str, tmp_path: Path) -> None:
    dest = tmp_path / "file.bin"
    (tmp_path / "file.bin.part").write_bytes(PAYLOAD[:1000])
    download(server, dest, PAYLOAD_SHA)
    assert _RangeHandler.requests == ["bytes=1000-"]
    assert dest.read_bytes() == PAYLOAD


def test_download_of_a_complete_part(server: str, tmp_path: Path) -> None:
    (tmp_path / "file.bin.part").write_bytes(PAYLOAD)
    assert download(server, tmp_path / "file.bin", PAYLOAD_SHA).read_bytes() == PAYLOAD


def test_download_rejects_a_bad_checksum(server: str, tmp_path: Path) -> None:
    dest = tmp_path / "file.bin"
    with pytest.raises(ValueError, match="checksum mismatch"):
        download(server, dest, "0" * 64)
    assert not dest.exists() and not (tmp_path / "file.bin.part").exists()


def test_download_offline_says_where_to_put_the_file(tmp_path: Path) -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dest = tmp_path / "file.bin"
    with pytest.raises(ConnectionError, match="place it at"):
        download(f"http://127.0.0.1:{port}/x", dest, None, timeout=2)


def _tar(path: Path, *members: tuple[tarfile.TarInfo, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as bundle:
        for info, data in members:
            info.size = len(data)
            bundle.addfile(info, io.BytesIO(data) if data else None)
    return path


def _member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    return info


def test_safe_extract_unpacks_tar_and_zip_whole_with_plain_permissions(tmp_path: Path) -> None:
    setuid = _member("d/run.sh")
    setuid.mode = 0o4755
    archive = _tar(tmp_path / "a.tgz", (_member("d/x.txt"), b"x"), (setuid, b"#!/bin/sh"))
    out = tmp_path / "out"
    safe_extract(archive, out)
    assert (out / "d" / "x.txt").read_text() == "x"
    assert stat.S_IMODE((out / "d" / "run.sh").stat().st_mode) == 0o644  # no setuid, no exec
    (out / "keep.txt").write_text("mine")
    with zipfile.ZipFile(tmp_path / "b.zip", "w") as bundle:
        bundle.writestr("d/y.txt", "y")
    safe_extract(tmp_path / "b.zip", out)
    assert (out / "d" / "y.txt").read_text() == "y" and not (out / "d" / "x.txt").exists()  # d replaced whole
    assert (out / "keep.txt").read_text() == "mine"  # what the archive does not hold stays
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.tgz", "b.zip", "out"]  # no staging left


@pytest.mark.parametrize(
    ("member", "reason"),
    [
        (_member("/etc/evil"), "absolute path"),
        (_member("C:/evil"), "absolute path"),
        (_member("d/../../evil"), "outside"),
        (_member("d/l", tarfile.SYMTYPE, "x.txt"), "is a link"),  # even one that stays inside
        (_member("d/l", tarfile.SYMTYPE, "/etc/passwd"), "is a link"),
        (_member("d/h", tarfile.LNKTYPE, "ok.txt"), "is a link"),
        (_member("d/dev", tarfile.CHRTYPE), "device"),
        (_member("d/fifo", tarfile.FIFOTYPE), "device"),
    ],
)
def test_safe_extract_rejects_escapes(tmp_path: Path, member: tarfile.TarInfo, reason: str) -> None:
    archive = _tar(tmp_path / "bad.tar.gz", (_member("ok.txt"), b"ok"), (member, b""))
    with pytest.raises(ValueError, match=reason):
        safe_extract(archive, tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.tar.gz"]  # nothing written, nowhere


def test_safe_extract_writes_nothing_for_upward_link_chains(tmp_path: Path) -> None:
    """Nested upward links (the old member check let them through and the stdlib filter stopped
    them only after earlier members were written), and links under a chain of long folder names
    (the shape of the CVE-2025-4517 class, where os.path.realpath stops resolving past PATH_MAX):
    every link is refused before anything is written, whatever it resolves to."""
    nested = _tar(
        tmp_path / "nested.tar",
        (_member("a.txt"), b"written first"),
        (_member("d/s", tarfile.SYMTYPE, ".."), b""),
        (_member("d/s/t", tarfile.SYMTYPE, ".."), b""),
        (_member("d/s/t/evil.txt"), b"escaped"),
    )
    long_name, path, members = "d" * 247, "", [(_member("a.txt"), b"written first")]
    for step in "abcdefghijklmnop":
        members.append((_member(f"{path}{long_name}", tarfile.DIRTYPE), b""))
        members.append((_member(f"{path}{step}", tarfile.SYMTYPE, long_name), b""))
        path += f"{long_name}/"
    members.append((_member("abcdefghijklmnop/up", tarfile.SYMTYPE, "../" * 16), b""))
    members.append((_member("abcdefghijklmnop/up/../evil.txt"), b"escaped"))
    chain = _tar(tmp_path / "chain.tar", *members)
    for archive in (nested, chain):
        dest = tmp_path / "sandbox" / "out"
        with pytest.raises(ValueError, match="is a link|outside"):
            safe_extract(archive, dest)
        assert not (tmp_path / "sandbox").exists() or not any((tmp_path / "sandbox").iterdir())
        assert not list(tmp_path.rglob("evil.txt")) and not list(tmp_path.rglob("a.txt"))


def test_safe_extract_rejects_zip_links_and_special_files(tmp_path: Path) -> None:
    for mode, reason in ((stat.S_IFLNK | 0o777, "is a link"), (stat.S_IFCHR | 0o644, "device")):
        with zipfile.ZipFile(tmp_path / "odd.zip", "w") as bundle:
            bundle.writestr("ok.txt", "ok")
            info = zipfile.ZipInfo("d/odd")
            info.external_attr = mode << 16
            bundle.writestr(info, "../../etc/passwd")
            bundle.writestr("d/odd/next.txt", "x")
        with pytest.raises(ValueError, match=reason):
            safe_extract(tmp_path / "odd.zip", tmp_path / "out")
        assert not (tmp_path / "out").exists()


def test_safe_extract_rejects_zip_traversal_and_other_files(tmp_path: Path) -> None:
    with zipfile.ZipFile(tmp_path / "bad.zip", "w") as bundle:
        bundle.writestr("../evil.txt", "x")
    with pytest.raises(ValueError, match="outside"):
        safe_extract(tmp_path / "bad.zip", tmp_path / "out")
    (tmp_path / "plain.txt").write_text("not an archive")
    with pytest.raises(ValueError, match="neither a zip nor a tar"):
        safe_extract(tmp_path / "plain.txt", tmp_path / "out")
