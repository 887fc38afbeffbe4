"""Strangers never lock a token holder out: whatever tokenless clients do, from any address, the
token holder's own included, a client with the token gets a session and ``/health`` answers, as
long as the machine has room for one more connection. Each case runs the real server
(``python -m hgpo_env serve``) and OpenEnv's real WebSocket protocol; the strangers are raw
sockets, as an attacker's would be.

The token holder's handshakes are given 3 s: more than a loaded machine needs for the
milliseconds they take, less than the 10 s within which the server closes a stranger's
incomplete connection anyway (before, the strangers held the server for those 10 s).
"""

from __future__ import annotations

import contextlib
import socket
import time
import urllib.request
from collections.abc import Iterator

from serve_helpers import running_server, ws_request
from test_serve_strangers import TOKEN, closed_by_server, stranger, ws_url
from websockets.sync.client import connect

AUTH = {"Authorization": f"Bearer {TOKEN}"}
PATIENCE_S = 3.0
"""How long the token holder waits for a handshake or an answer (see the module's docstring)."""
HALF_HEADER = b"GET /ws HTTP/1.1\r\nHost: x\r\n"


def plays_a_session(url: str) -> None:
    """The token holder opens a session, resets and steps."""
    with connect(ws_url(url), additional_headers=AUTH, open_timeout=PATIENCE_S) as ws:
        assert ws_request(ws, "reset", {"seed": 0})["type"] == "observation"
        assert ws_request(ws, "step", {"response": "look"})["type"] == "observation"


def health(url: str) -> int:
    request = urllib.request.Request(f"{url}/health", headers=AUTH)
    with urllib.request.urlopen(request, timeout=PATIENCE_S) as answer:
        return answer.status


@contextlib.contextmanager
def strangers(url: str, source: str, count: int, sent: list[bytes]) -> Iterator[list[socket.socket]]:
    """``count`` connections from ``source``, the i-th having sent ``sent[i % len(sent)]``."""
    held = [stranger(url, source, sent[i % len(sent)]) for i in range(count)]
    try:
        yield held
    finally:
        for sock in held:
            sock.close()


def test_strangers_behind_the_token_holders_address_never_refuse_it():
    """100 connections trickling a request header from the token holder's own address (as behind a
    proxy or a NAT), with the server's defaults: each of the token holder's new sessions is
    served, and the strangers' oldest connections are the ones closed (before, the address's cap
    refused the token holder's)."""
    with (
        running_server("HGPO-Rooms-v0", token=TOKEN) as (url, _),
        strangers(url, "127.0.0.1", 100, [b"G"]) as held,
    ):
        time.sleep(1.3)  # incomplete for over a second: they count against the address
        for byte in b"ET ":
            plays_a_session(url)
            for sock in held:  # one more byte of the header: a trickle, never complete
                with contextlib.suppress(OSError):
                    sock.sendall(bytes([byte]))
        assert health(url) == 200
        gone = [i for i, sock in enumerate(held) if closed_by_server(sock, within=0.01)]
    assert len(gone) >= 4 and gone[:4] == [0, 1, 2, 3], gone  # the oldest first, one per newcomer


def test_a_burst_of_sockets_above_the_file_limit_locks_nobody_out():
    """300 tokenless sockets at once from one address, half silent and half with a header that
    never ends, against a server allowed 256 open files, twice (a stranger repeating the burst):
    the server caps incomplete connections at half its files, closing the oldest, so the token
    holder's session and ``/health`` are served at once (before, the burst held 242 sockets for
    the full 10 s and the token holder was locked out)."""
    with running_server("HGPO-Rooms-v0", token=TOKEN, open_files=256) as (url, process):
        for _ in range(2):
            with strangers(url, "127.0.0.7", 300, [b"", HALF_HEADER]) as burst:
                plays_a_session(url)
                assert health(url) == 200
                time.sleep(0.5)
                assert sum(not closed_by_server(sock, within=0.01) for sock in burst) <= 128
        said = process.log.read_text()
    assert "open files: 256; at most 128 connections may wait for their request headers" in said


def test_limit_concurrency_is_not_the_strangers_to_use_up():
    """``--limit-concurrency 32`` and 40 silent sockets from the token holder's own address: its
    WebSocket session is served (before, its handshake got no valid response)."""
    with (
        running_server("HGPO-Rooms-v0", "--limit-concurrency", "32", token=TOKEN) as (url, _),
        strangers(url, "127.0.0.1", 40, [b""]),
    ):
        time.sleep(1.3)
        plays_a_session(url)
        assert health(url) == 200
