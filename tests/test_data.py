"""Data helpers: data home, resumable checksummed downloads, archive extraction that refuses escapes."""

from __future__ import annotations

import hashlib
import http.server
import io
import socket
import stat
import struct
import tarfile
import threading
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

from hgpo_env.textenv.data import check_archive, data_home, download, safe_extract

PAYLOAD = bytes(range(256)) * 4096  # 1 MiB
PAYLOAD_SHA = hashlib.sha256(PAYLOAD).hexdigest()


class _RangeHandler(http.server.BaseHTTPRequestHandler):
    """Serves ``payload`` at any path and honours single ``bytes=N-`` ranges; ``fault`` makes it
    misbehave once: "close" (half the body, then a clean close), "reset" (half, then a TCP
    reset), "stall" (half, then silence), "no-range" (ignores Range: the whole file, 200)."""

    requests: ClassVar[list[str | None]] = []
    payload: ClassVar[bytes] = PAYLOAD
    fault: ClassVar[str | None] = None

    def do_GET(self) -> None:
        header = self.headers.get("Range")
        type(self).requests.append(header)
        fault, type(self).fault = type(self).fault, None
        start = int(header.removeprefix("bytes=").rstrip("-")) if header and fault != "no-range" else 0
        if start >= len(self.payload):
            self.send_response(416)
            self.end_headers()
            return
        body = self.payload[start:]
        self.send_response(206 if start else 200)
        self.send_header("Content-Length", str(len(body)))
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(self.payload) - 1}/{len(self.payload)}")
        self.end_headers()
        if fault is None or fault == "no-range":
            self.wfile.write(body)
            return
        self.wfile.write(body[: len(body) // 2])
        self.wfile.flush()
        if fault == "stall":
            time.sleep(3)
        elif fault == "reset":
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.close_connection = True

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def server() -> Iterator[str]:
    _RangeHandler.requests, _RangeHandler.payload, _RangeHandler.fault = [], PAYLOAD, None
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


@pytest.mark.parametrize("fault", ["close", "reset", "stall"])
def test_a_transfer_cut_short_keeps_its_part_and_the_next_run_resumes(
    server: str, tmp_path: Path, fault
) -> None:
    dest = tmp_path / "file.bin"
    _RangeHandler.fault = fault
    started = time.monotonic()
    with pytest.raises(ConnectionError, match="run again to resume"):
        download(server, dest, None, timeout=1)  # no checksum: only the announced size can tell
    assert time.monotonic() - started < 30 and not dest.exists()  # a stall ends, not waits forever
    kept = (tmp_path / "file.bin.part").stat().st_size
    assert 0 < kept < len(PAYLOAD)
    assert download(server, dest, None).read_bytes() == PAYLOAD
    assert _RangeHandler.requests == [None, f"bytes={kept}-"]


def test_a_server_that_ignores_range_gets_a_fresh_start(server: str, tmp_path: Path) -> None:
    (tmp_path / "file.bin.part").write_bytes(b"stale bytes of another file")
    _RangeHandler.fault = "no-range"
    assert download(server, tmp_path / "file.bin", PAYLOAD_SHA).read_bytes() == PAYLOAD


def _zip_bytes() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as bundle:
        bundle.writestr("data/x.txt", "x" * 10_000)
    return buffer.getvalue()


def test_archives_without_a_checksum_are_checked_whole(server: str, tmp_path: Path, caplog) -> None:
    whole = _zip_bytes()
    _RangeHandler.payload = whole[:-30]  # a truncated zip served as if whole
    dest = tmp_path / "games.zip"
    with pytest.raises(ValueError, match="not a whole archive"):
        download(server, dest, None, verify=check_archive)
    assert not dest.exists() and not (tmp_path / "games.zip.part").exists()
    dest.write_bytes(whole[:-30])  # a corrupt file cached under the final name
    _RangeHandler.payload = whole
    assert download(server, dest, None, verify=check_archive).read_bytes() == whole
    assert "removed it and fetching it again" in caplog.text


def test_two_downloads_of_one_file_at_once(server: str, tmp_path: Path) -> None:
    dest, errors = tmp_path / "file.bin", []

    def fetch() -> None:
        try:
            download(server, dest, PAYLOAD_SHA)
        except Exception as error:  # noqa: BLE001  -- asserted below
            errors.append(repr(error))

    threads = [threading.Thread(target=fetch) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors and dest.read_bytes() == PAYLOAD and len(_RangeHandler.requests) == 1


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
