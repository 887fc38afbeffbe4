"""Second round of probes against a real ``python -m hgpo_env serve`` (issue 40): what a stranger or a
careless client sends, and what a careless operator types. Each probe is run against the real
server and OpenEnv's real protocol, or the real command line."""

from __future__ import annotations

import contextlib
import http.client
import json
import re
import signal
import socket
import stat
import statistics
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest
from serve_helpers import running_server, ws_request
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.frames import Frame, Opcode
from websockets.sync.client import connect

from hgpo_env.serve.auth import MIN_TOKEN_CHARS, check_bind, read_token
from hgpo_env.serve.choices import Allowed, ClientChoices
from hgpo_env.serve.guards import MAX_BODY_BYTES

TOKEN = "a-token-long-enough-for-any-host"


@pytest.fixture(scope="module")
def server():
    with running_server(
        "HGPO-Rooms-v0", "history_length=2", "--allow-origin", "https://trainer.example", token=TOKEN
    ) as (url, _):
        yield url


def ws_url(url: str) -> str:
    return url.replace("http", "ws") + "/ws"


def test_a_session_whose_first_reset_failed_plays_after_a_good_reset(server):
    """gymnasium's env checker broke every later step of an env whose first reset raised."""
    with connect(ws_url(server), additional_headers={"Authorization": f"Bearer {TOKEN}"}) as ws:
        for _ in range(2):  # a failed reset, first or later, leaves the session usable
            assert ws_request(ws, "reset", {"seed": 0, "task_id": -1})["type"] == "error"
            assert ws_request(ws, "reset", {"seed": 0})["type"] == "observation"
            answer = ws_request(ws, "step", {"response": "look"})
            assert answer["type"] == "observation", answer


def test_browser_origins_are_refused_unless_allowed(server):
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with pytest.raises(InvalidStatus) as refused:
        connect(ws_url(server), additional_headers=headers, origin="https://evil.example")
    assert refused.value.response.status_code == 403
    with connect(ws_url(server), additional_headers=headers, origin="https://trainer.example") as ws:
        assert ws_request(ws, "reset", {"seed": 0})["type"] == "observation"
    with connect(ws_url(server), additional_headers=headers) as ws:  # no Origin: not a browser
        assert ws_request(ws, "reset", {"seed": 0})["type"] == "observation"


def post(url: str, body: bytes, *, chunked: bool = False, env_id: str = "HGPO-Rooms-v0") -> tuple[int, bytes]:
    """POST ``body`` to the Task API's task count (with a length, or chunked); the status and reply."""
    host, port = url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    if chunked:
        connection.request(
            "POST", f"/{env_id}/num_tasks", body=iter([body]), headers=headers, encode_chunked=True
        )
    else:
        connection.request("POST", f"/{env_id}/num_tasks", body=body, headers=headers)
    answer = connection.getresponse()
    return answer.status, answer.read()


def test_http_bodies_are_capped_on_every_route(server):
    huge = b'{"split": "' + b"x" * (8 * MAX_BODY_BYTES) + b'"}'
    for chunked in (False, True):
        status, reply = post(server, huge, chunked=chunked)
        assert status == 413 and len(reply) < 200, (chunked, status, reply[:200])
    status, reply = post(server, b'{"split": "nope"}')  # an ordinary body still reaches the route
    assert status == 400 and reply == b"{\"detail\":\"no split 'nope': this env has ['train', 'eval']\"}", (
        reply
    )


def test_the_bearer_scheme_is_case_insensitive(server):
    for scheme, expected in (("bearer", 200), ("BEARER", 200), ("Basic", 401)):
        request = urllib.request.Request(f"{server}/health", headers={"Authorization": f"{scheme} {TOKEN}"})
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                status = answer.status
        except urllib.error.HTTPError as error:
            status = error.code
        assert status == expected, scheme


def test_a_refusal_names_the_key_never_the_operators_value():
    choices = ClientChoices("HGPO-Rooms-v0", {"max_steps": 1234567})
    with pytest.raises(ValueError) as refused:
        choices.resolve({"max_steps": 3})
    assert "['max_steps'] are the operator's" in str(refused.value)
    assert "1234567" not in str(refused.value)


def test_token_files_and_variables_are_checked_alike(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("HGPO_SERVE_TOKEN", raising=False)
    with pytest.raises(ValueError, match="cannot read the token file"):
        read_token(tmp_path)  # a directory
    two_lines = tmp_path / "two"
    two_lines.write_text("first\nsecond\n")
    two_lines.chmod(0o600)
    with pytest.raises(ValueError, match="several lines"):
        read_token(two_lines)
    shared = tmp_path / "shared"
    shared.write_text(TOKEN + "\n")
    shared.chmod(0o644)
    assert read_token(shared) == TOKEN
    assert "readable by other users" in capsys.readouterr().err
    shared.chmod(stat.S_IRUSR | stat.S_IWUSR)
    assert read_token(shared) == TOKEN and capsys.readouterr().err == ""
    monkeypatch.setenv("HGPO_SERVE_TOKEN", TOKEN + "\n")  # stripped, as the file is
    assert read_token() == TOKEN
    monkeypatch.setenv("HGPO_SERVE_TOKEN", "   ")
    with pytest.raises(ValueError, match="empty"):
        read_token()


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0"])
def test_a_short_token_is_refused_on_any_address(host):
    """Every user of a machine reaches its loopback server: a one-letter token guards nothing."""
    with pytest.raises(ValueError, match=f"use at least {MIN_TOKEN_CHARS}"):
        check_bind(host, "x" * (MIN_TOKEN_CHARS - 1), insecure=False)
    check_bind(host, "x" * MIN_TOKEN_CHARS, insecure=False)


def test_the_server_refuses_a_short_token_in_one_line(monkeypatch, capsys):
    from hgpo_env.__main__ import main

    monkeypatch.setenv("HGPO_SERVE_TOKEN", "a")
    assert main(["serve", "HGPO-Rooms-v0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: refusing a 1-character token: use at least 16")
    assert "secrets.token_urlsafe" in err  # how to make one


def test_an_empty_allowed_range_is_refused():
    with pytest.raises(ValueError, match="low bound is above the high one"):
        Allowed.parse("max_steps=10..1")


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (
            ["no_such_module:Env-v0"],
            "importing no_such_module for no_such_module:Env-v0 failed: ModuleNotFoundError",
        ),
        (
            ["byo_envs_broken:Env-v0"],
            "importing byo_envs_broken for byo_envs_broken:Env-v0 failed: RuntimeError",
        ),
        (["HGPO-Rooms-v0", "--port", "99999"], "--port 99999: a TCP port is 1 to 65535"),
        (["HGPO-Rooms-v0", "--limit-concurrency", "0"], "--limit-concurrency 0: it must be at least 1"),
        (["HGPO-Rooms-v0", "--max-sessions", "0"], "--max-sessions 0: it must be at least 1"),
        (["HGPO-Rooms-v0", "--session-timeout", "-1"], "--session-timeout -1.0: it must be a positive"),
        (["HGPO-Rooms-v0", "--send-timeout", "0"], "--send-timeout 0.0: it must be a positive"),
        (["HGPO-Rooms-v0", "--allow", "max_steps=10..1"], "low bound is above the high one"),
        (["HGPO-Rooms-v0", "--ssl-certfile", "/no/cert.pem"], "--ssl-certfile /no/cert.pem: no such file"),
        (["HGPO-Rooms-v0", "max_rooms"], "env arguments are key=value, got 'max_rooms'"),
        (["HGPO-Rooms-v0", "max_rooms=[3"], "env argument max_rooms: cannot read '[3'"),
    ],
)
def test_bad_command_lines_are_one_line(argv, said, tmp_path, monkeypatch, capsys):
    from hgpo_env.__main__ import main
    from hgpo_env.serve import server

    def bind(*args, **kwargs):
        raise AssertionError("the server started")

    monkeypatch.setattr(server._AnnouncingServer, "run", bind)
    (tmp_path / "byo_envs_broken.py").write_text("raise RuntimeError('this module breaks at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["serve", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and said in err and err.count("\n") == 1, err


def test_served_alfworld_sends_a_game_id_not_the_servers_path(shared_data):
    """The game file's absolute path names the server's folders; clients get its relative id."""
    data = shared_data / "alfworld"
    with (
        running_server("HGPO-ALFWorld-v0", "split=valid_seen", f"data_path={data}", "disk_cache=False") as (
            url,
            _,
        ),
        connect(ws_url(url)) as ws,
    ):
        for answer in (
            ws_request(ws, "reset", {"seed": 0, "task_id": 3}),
            ws_request(ws, "step", {"response": "look"}),
        ):
            metadata = answer["data"]["observation"]["metadata"]
            assert "game_file" not in metadata and str(data) not in str(answer)
            assert metadata["game_id"].startswith("valid_seen/") and metadata["game_id"].endswith(".tw-pddl")


def test_task_api_refusals_are_one_log_line_at_most(shared_data):
    """ALFWorld's splits: made-up ones were quiet, but a declared split whose games the server
    lacks (``train`` is not unpacked here) logged a traceback on every request, each building
    an env."""
    with running_server(
        "HGPO-ALFWorld-v0", "split=valid_seen", f"data_path={shared_data / 'alfworld'}", token=TOKEN
    ) as (url, process):
        for i in range(10):
            status, reply = post(
                url, json.dumps({"split": f"made-up-{i}"}).encode(), env_id="HGPO-ALFWorld-v0"
            )
            assert status == 400 and b"this env has" in reply and b"valid_seen" in reply, reply
        for _ in range(10):  # remembered: the log below says the env was built once
            status, reply = post(url, b'{"split": "train"}', env_id="HGPO-ALFWorld-v0")
            assert status == 500 and b"'train' split cannot be served" in reply, reply
        assert post(url, b'{"split": "valid_seen"}', env_id="HGPO-ALFWorld-v0") == (200, b'{"num_tasks":140}')
        logged = process.log.read_text()
    assert "Traceback" not in logged
    assert [line for line in logged.splitlines() if "split" in line] == [
        next(line for line in logged.splitlines() if line.startswith("the 'train' split cannot be served"))
    ], logged


def test_the_task_api_refuses_splits_an_env_does_not_declare_without_building_one(shared_data):
    """WebShop's split is a plain string: a made-up one used to build an env, answer 500 and log a
    traceback. Its splits now come from the env (under verl-agent's protocol: train and test)."""
    data = shared_data / "webshop"
    with running_server(
        "HGPO-WebShop-v0", f"data_path={data}", "protocol=verl-agent", "split=test", token=TOKEN
    ) as (url, _):
        for split in ("made-up", "eval"):
            started = time.monotonic()
            status, reply = post(url, json.dumps({"split": split}).encode(), env_id="HGPO-WebShop-v0")
            assert status == 400 and time.monotonic() - started < 2, (split, status, reply)
        status, reply = post(url, b'{"split": "test"}', env_id="HGPO-WebShop-v0")
        assert status == 200 and b"500" in reply, reply  # the papers' 500 test goals


def self_signed(folder: Path) -> tuple[str, str]:
    """A certificate for 127.0.0.1 signed by its own key (it is its own CA); (cert, key) paths."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return str(cert_path), str(key_path)


def test_tls_serves_wss_and_clients_verify_the_certificate(tmp_path, monkeypatch):
    """The token never crosses the network in clear text: https/wss with a certificate the client
    checks (here a self-signed one, trusted through SSL_CERT_FILE, OpenSSL's own variable)."""
    from hgpo_env.serve.client import RemoteEnv

    cert, key = self_signed(tmp_path)
    tls = ("--ssl-certfile", cert, "--ssl-keyfile", key)
    with running_server("HGPO-Rooms-v0", "history_length=2", *tls, token=TOKEN, ca_file=cert) as (url, _):
        assert url.startswith("https://")
        monkeypatch.setenv("SSL_CERT_FILE", cert)
        env = RemoteEnv([url], token=TOKEN, env_id="HGPO-Rooms-v0")
        try:
            prompt, info = env.reset(seed=0)
            assert prompt and info["fingerprints"] and env.step("look")[0]
        finally:
            env.close()
        monkeypatch.delenv("SSL_CERT_FILE")  # a client that does not trust the certificate stops
        with pytest.raises(Exception, match="CERTIFICATE_VERIFY_FAILED|certificate verify failed"):
            urllib.request.urlopen(f"{url}/health", timeout=10)


def stranger(url: str, source: str, sent: bytes = b"") -> socket.socket:
    """A TCP connection to the server from the loopback address ``source``, having sent ``sent``."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10, source_address=(source, 0))
    if sent:
        sock.sendall(sent)
    return sock


def closed_by_server(sock: socket.socket, within: float) -> bool:
    """Whether the server closes ``sock`` within ``within`` seconds (without answering)."""
    sock.settimeout(within)
    try:
        return sock.recv(1024) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True
    finally:
        sock.close()


@pytest.fixture(scope="module")
def strict_server():
    limits = ("--request-timeout", "3", "--max-pending-per-address", "4")
    with running_server("HGPO-Rooms-v0", "history_length=2", *limits, token=TOKEN) as (url, _):
        yield url


def test_connections_that_never_finish_a_request_are_closed_and_token_holders_play(strict_server):
    silent = [stranger(strict_server, "127.0.0.2") for _ in range(2)]
    half = [stranger(strict_server, "127.0.0.2", b"GET /health HTTP/1.1\r\nHost: x\r\n") for _ in range(2)]
    with connect(ws_url(strict_server), additional_headers={"Authorization": f"Bearer {TOKEN}"}) as ws:
        assert ws_request(ws, "reset", {"seed": 0})["type"] == "observation"
        # The 3 s deadline, not never; the margin is for a loaded machine.
        assert all(closed_by_server(sock, within=30) for sock in silent + half)
        assert ws_request(ws, "step", {"response": "look"})["type"] == "observation"  # held all along


def test_one_address_cannot_hold_more_than_its_share(strict_server):
    """Sockets held open without a request count against their address after a second; a burst of
    handshakes from one address (a trainer opening its sessions) is never refused, and at the cap
    the address's oldest incomplete connection is closed to admit the new one."""
    burst = [stranger(strict_server, "127.0.0.3") for _ in range(12)]  # 3 times the cap, at once
    request = f"GET /health HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nConnection: close\r\n\r\n"
    for sock in burst:
        sock.sendall(request.encode())
        assert sock.recv(1024).startswith(b"HTTP/1.1 200 "), "a burst from one address was refused"
        sock.close()
    held = [stranger(strict_server, "127.0.0.3") for _ in range(4)]
    time.sleep(1.3)  # now stale: they count
    extra = stranger(strict_server, "127.0.0.3")
    assert closed_by_server(held[0], within=0.5)  # the oldest makes room: the address holds 4
    assert not closed_by_server(extra, within=0.5)
    request = urllib.request.Request(f"{strict_server}/health", headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(request, timeout=10) as answer:  # another address is served
        assert answer.status == 200
    for sock in held:
        sock.close()


LIMIT = 8


def test_sockets_that_never_finish_a_request_cannot_use_up_the_concurrency_limit():
    """40 silent sockets (from 40 addresses, under every per-address cap) and 10 half-sent headers
    against ``--limit-concurrency 8``: token holders are still served (before, /health answered
    503), strangers' requests are refused and closed, the limit still binds token holders, and
    the silent sockets are closed at the header deadline."""
    limits = ("--limit-concurrency", str(LIMIT), "--request-timeout", "4")
    with running_server("HGPO-Rooms-v0", *limits, token=TOKEN) as (url, _):
        silent = [stranger(url, f"127.0.2.{i + 1}") for i in range(40)]
        half = [stranger(url, f"127.0.3.{i + 1}", b"GET /health HTTP/1.1\r\nHost: x\r\n") for i in range(10)]
        opened = time.monotonic()
        time.sleep(1.3)  # stale: they would count against their addresses now
        with connect(ws_url(url), additional_headers={"Authorization": f"Bearer {TOKEN}"}) as ws:
            assert ws_request(ws, "reset", {"seed": 0})["type"] == "observation"
            assert ws_request(ws, "step", {"response": "look"})["type"] == "observation"
        host, port = url.removeprefix("http://").split(":")
        tokenless = http.client.HTTPConnection(host, int(port), timeout=10)
        tokenless.request("GET", "/health")
        answer = tokenless.getresponse()
        assert answer.status == 401 and answer.getheader("connection") == "close"
        answer.read()
        kept, statuses = [], []
        for _ in range(LIMIT + 2):  # token holders' kept-alive connections: the limit binds them
            connection = http.client.HTTPConnection(host, int(port), timeout=10)
            connection.request("GET", "/health", headers={"Authorization": f"Bearer {TOKEN}"})
            answer = connection.getresponse()
            answer.read()
            statuses.append(answer.status)
            kept.append(connection)
        assert 503 in statuses and statuses.count(200) <= LIMIT, statuses  # uvicorn counts the asker too
        for connection in kept:
            connection.close()
        assert all(
            closed_by_server(sock, within=max(0.1, opened + 8 - time.monotonic())) for sock in silent + half
        )


def test_an_oversized_upgrade_header_is_answered(strict_server):
    sock = stranger(strict_server, "127.0.0.4")
    sock.sendall(
        b"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
        + f"Authorization: Bearer {TOKEN}\r\nX-Long: {'a' * 9000}\r\n\r\n".encode()
    )
    sock.settimeout(5)
    assert sock.recv(1024).startswith(b"HTTP/1.1 431 ")
    sock.close()


COMPACT = {"separators": (",", ":")}
WORST_FRAMES = {
    "two million values": json.dumps(
        {"type": "step", "data": {"response": "x", "metadata": {"v": [1] * 1_900_000}}}, **COMPACT
    ),
    "one long response": json.dumps({"type": "step", "data": {"response": "x" * 4_000_000}}),
    "deep nesting": '{"type": "step", "data": {"response": "x", "metadata": {"v": '
    + "[" * 1_900_000
    + "]" * 1_900_000
    + "}}}",
    "two hundred thousand keys": json.dumps(
        {"type": "step", "data": {f"k{i}": i for i in range(230_000)}}, **COMPACT
    ),
}
"""The costliest frames under the 4 MiB cap: to parse, to validate, to answer."""


@pytest.mark.parametrize("worst", sorted(WORST_FRAMES))
def test_a_bystanders_steps_stay_fast_while_a_client_sends_the_worst_frames(server, worst):
    frame = WORST_FRAMES[worst]
    assert len(frame) < 4 * 2**20
    headers = {"Authorization": f"Bearer {TOKEN}"}
    stop = threading.Event()

    def attack() -> None:
        with connect(ws_url(server), additional_headers=headers, max_size=None) as bad:
            while not stop.is_set():
                bad.send(frame)
                answer = json.loads(bad.recv(timeout=60))
                assert answer["type"] == "error" and len(json.dumps(answer)) < 2_000

    with connect(ws_url(server), additional_headers=headers) as ws:
        ws_request(ws, "reset", {"seed": 0, "task_id": 10_001})
        attacker = threading.Thread(target=attack)
        attacker.start()
        latencies = []
        try:
            for _ in range(60):
                started = time.monotonic()
                answer = ws_request(ws, "step", {"response": "<action>look</action>"})
                latencies.append(time.monotonic() - started)
                assert answer["type"] == "observation", answer
                if answer["data"]["done"]:
                    ws_request(ws, "reset", {"seed": 0, "task_id": 10_001})
        finally:
            stop.set()
            attacker.join(120)
    # A check held on the event loop would hold most of these steps (the frames come back to back
    # and take 0.3-5 s each to check), while a busy machine may pause any one step: so 9 in 10.
    p90 = statistics.quantiles(latencies, n=10)[-1]
    assert p90 < 0.05, f"{worst}: 9 in 10 steps within {p90 * 1000:.0f} ms"


def non_reader(url: str, source: str) -> socket.socket:
    """A token holder's WebSocket that plays a reset, then sends ``state`` requests and reads
    none of the replies, until the server stops reading too."""
    upgrade = (
        "GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
        f"Authorization: Bearer {TOKEN}\r\n\r\n"
    )
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the server's writes stall soon
    sock.settimeout(10)
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", int(url.rsplit(":", 1)[1])))
    sock.sendall(upgrade.encode())
    assert sock.recv(4096).startswith(b"HTTP/1.1 101 ")
    message = {"type": "reset", "data": {"seed": 0}}
    sock.sendall(Frame(Opcode.TEXT, json.dumps(message).encode()).serialize(mask=True))
    state = Frame(Opcode.TEXT, b'{"type": "state"}').serialize(mask=True)
    # the server has stopped reading once a send waits this long; a busy machine can keep a server
    # that still reads from a shorter wait, and the client would stop before the server's writes stall
    sock.settimeout(2.0)
    with contextlib.suppress(TimeoutError):
        while True:
            sock.sendall(state)
    return sock


def first_answer(url: str) -> dict:
    """A token holder's answer to a reset on a new connection (a full server closes it)."""
    try:
        with connect(ws_url(url), additional_headers={"Authorization": f"Bearer {TOKEN}"}) as ws:
            return ws_request(ws, "reset", {"seed": 0})
    except ConnectionClosed as closed:
        return {"type": "closed", "reason": str(closed)}


def rss_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("VmRSS:")[1].split()[0]) / 1024


def test_clients_that_never_read_their_replies_hold_bounded_memory_and_are_dropped():
    """Every session held by a client that stopped reading: the server's memory stays flat, and
    after --send-timeout the connections are dropped and a token holder gets a session (without it,
    no --session-timeout, they were held for ever)."""
    send_timeout = 4
    limits = ("--max-sessions", "4", "--send-timeout", str(send_timeout))
    with running_server("HGPO-Rooms-v0", "history_length=2", *limits, token=TOKEN) as (url, process):
        before = rss_mib(process.pid)
        stalled = [non_reader(url, "127.0.0.5") for _ in range(4)]
        last_stalled = time.monotonic()
        assert rss_mib(process.pid) - before < 32
        deadline = time.monotonic() + 15
        while (answer := first_answer(url))["type"] != "observation":  # the server is full
            assert time.monotonic() < deadline, f"no session freed: {answer}"
            time.sleep(0.25)
        time.sleep(max(0.0, last_stalled + send_timeout + 1 - time.monotonic()))
        for sock in stalled:  # reading now reads what the server wrote before it dropped them
            sock.settimeout(10)
            with contextlib.suppress(ConnectionResetError):
                while sock.recv(2**20):
                    pass
            sock.close()


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT])
def test_the_server_stops_within_its_grace_whatever_its_clients_do(stop):
    """Four sessions, a client that never reads its replies and one that never finishes its
    headers, with the limits that would drop them far off: the server exits within
    ``--shutdown-grace`` (before, it waited on the non-reader for ever), in one line."""
    limits = ("--shutdown-grace", "3", "--send-timeout", "600", "--request-timeout", "600")
    with contextlib.ExitStack() as held:
        url, process = held.enter_context(running_server("HGPO-Rooms-v0", *limits, token=TOKEN))
        for _ in range(4):
            ws = held.enter_context(
                connect(ws_url(url), additional_headers={"Authorization": f"Bearer {TOKEN}"})
            )
            assert ws_request(ws, "reset", {"seed": 0})["type"] == "observation"
        held.enter_context(non_reader(url, "127.0.0.6"))
        held.enter_context(stranger(url, "127.0.0.6", b"GET /health HTTP/1.1\r\nHost: x\r\n"))
        process.send_signal(stop)
        signalled = time.monotonic()
        process.wait(timeout=60)
        took = time.monotonic() - signalled
        said = process.log.read_text()
    assert took < 3 + 20, f"{took:.1f} s"  # the grace, and time to exit on a loaded machine
    [line] = [line for line in said.splitlines() if line.startswith(stop.name)]
    found = re.fullmatch(rf"{stop.name}: closing (\d) connections, exiting within 8 s", line)
    assert found and int(found[1]) >= 5, said  # 6 once the server has read the half-sent header
    assert "Traceback" not in said, said


def test_a_killed_server_leaves_no_frame_checker_behind():
    """A large frame starts the server's frame-check process; SIGKILL runs no shutdown, so the
    checker must notice its parent is gone by itself (before, it lived on as an orphan)."""
    with running_server("HGPO-Rooms-v0", token=TOKEN) as (url, process):
        with connect(
            ws_url(url), additional_headers={"Authorization": f"Bearer {TOKEN}"}, max_size=None
        ) as ws:
            ws.send(json.dumps({"type": "step", "data": {"response": "x" * 100_000, "x": [1] * 20_000}}))
            assert json.loads(ws.recv(timeout=60))["type"] == "error"
        checkers = psutil.Process(process.pid).children()
        assert checkers, "a large frame starts a checker process"
        process.kill()
        process.wait(10)
        _, alive = psutil.wait_procs(checkers, timeout=10)
        assert not alive, f"orphaned frame checkers: {alive}"
