"""Starting and stopping ``python -m hgpo_env serve`` for tests: 127.0.0.1, a free port, stopped by pid."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path


def ws_request(ws, kind: str, data: dict | None = None) -> dict:
    """One message on an open ``/ws`` socket and its answer."""
    ws.send(json.dumps({"type": kind, **({"data": data} if data is not None else {})}))
    return json.loads(ws.recv(timeout=60))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_healthy(
    url: str,
    process: subprocess.Popen,
    log: Path,
    timeout: float = 60.0,
    token: str | None = None,
    ca_file: str | None = None,
) -> None:
    deadline = time.monotonic() + timeout
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    context = ssl.create_default_context(cafile=ca_file) if ca_file else None
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}:\n{log.read_text()}")
        try:
            request = urllib.request.Request(f"{url}/health", headers=headers)
            with urllib.request.urlopen(request, timeout=1, context=context) as answer:
                if answer.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"server at {url} not healthy after {timeout} s:\n{log.read_text()}")


@contextlib.contextmanager
def running_server(
    env_id: str = "HGPO-Rooms-v0",
    *args: str,
    token: str | None = None,
    port: int | None = None,
    ca_file: str | None = None,
    open_files: int | None = None,
) -> Iterator[tuple[str, subprocess.Popen]]:
    """A server subprocess (the tests folder importable, for ``byo_envs:Id``; with ``token``, a
    token file; on ``port``, or a free one; ``ca_file``: it serves https with a certificate that
    CA signed; ``open_files``: its soft and hard limit on open files); yields its base URL and
    process (``process.log``: the file its output goes to), and stops it (by pid) after."""
    port = port or free_port()
    with tempfile.TemporaryDirectory(prefix="hgpo-serve-") as folder:
        log = Path(folder) / "server.log"
        if token is not None:
            (Path(folder) / "token").write_text(token + "\n")
            (Path(folder) / "token").chmod(0o600)
            args = (*args, "--token-file", str(Path(folder) / "token"))
        tests = str(Path(__file__).resolve().parent)
        environment = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [tests, os.environ.get("PYTHONPATH")])),
        }
        environment.pop("HGPO_SERVE_TOKEN", None)
        with log.open("w") as sink:
            process = subprocess.Popen(
                [sys.executable, "-m", "hgpo_env", "serve", env_id, *args, "--port", str(port)],
                stdout=sink,
                stderr=subprocess.STDOUT,
                cwd=folder,
                env=environment,
            )
        if open_files is not None:  # long before the server reads it: it is still importing
            resource.prlimit(process.pid, resource.RLIMIT_NOFILE, (open_files, open_files))
        process.log = log
        url = f"{'https' if ca_file else 'http'}://127.0.0.1:{port}"
        try:
            wait_healthy(url, process, log, token=token, ca_file=ca_file)
            yield url, process
        finally:
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(15)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(5)


def rooms_served(*args: str) -> Iterator[str]:
    """A module fixture's body: the URL of a Rooms server (K = 2) run with ``args``, stopped after."""
    with running_server("HGPO-Rooms-v0", "history_length=2", *args) as (url, _):
        yield url
