"""Who may connect to an env server: a bearer token on every route and WebSocket upgrade, checked
against the real ``openenv`` client and server; loopback-only without one; ``module:Id`` servers
reachable by the id their clients were given; a line saying the server is ready."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from openenv.core.generic_client import GenericEnvClient
from serve_helpers import running_server
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from hgpo_env.serve.auth import check_bind, is_loopback, read_token
from hgpo_env.serve.client import RemoteEnv
from hgpo_env.vector import GroupedEnvPool

TOKEN = "s3cret-token-for-tests"


@pytest.fixture(scope="module")
def guarded_server():
    with running_server("HGPO-Rooms-v0", "history_length=2", token=TOKEN) as (url, process):
        yield url, process


def http_status(url: str, headers: dict[str, str] | None = None) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=10) as answer:
            return answer.status
    except urllib.error.HTTPError as error:
        return error.code


def test_every_route_needs_the_token(guarded_server):
    url, _ = guarded_server
    for route in ("/health", "/metadata", "/schema", "/HGPO-Rooms-v0/splits"):
        assert http_status(url + route) == 401, route
        assert http_status(url + route, {"Authorization": "Bearer wrong"}) == 401, route
    assert http_status(url + "/health", {"Authorization": f"Bearer {TOKEN}"}) == 200


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}])
def test_a_websocket_without_the_token_is_refused_at_the_upgrade(guarded_server, headers):
    url, _ = guarded_server
    with pytest.raises(InvalidStatus) as refused:
        connect(url.replace("http", "ws") + "/ws", additional_headers=headers, open_timeout=10)
    assert refused.value.response.status_code == 403


def test_openenvs_stock_client_and_remote_env_play_with_the_token(guarded_server, monkeypatch):
    url, _ = guarded_server
    with GenericEnvClient(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}).sync() as client:
        assert client.reset(seed=1, task_id=10_001).observation["prompt"].startswith("You are")
    env = RemoteEnv([url], token=TOKEN, history_length=2)
    try:
        prompt, info = env.reset(seed=1, options={"task_id": 10_001})
        assert info["task_id"] == 10_001 and prompt
    finally:
        env.close()
    monkeypatch.setenv("HGPO_SERVE_TOKEN", TOKEN)  # what the pool's workers inherit
    with GroupedEnvPool(
        "HGPO-Rooms-v0", 1, 2, num_workers=1, backend="openenv", servers=[url], history_length=2
    ) as pool:
        assert len({r.info["task_key"] for r in pool.reset(task_ids=[10_002])}) == 1
    monkeypatch.delenv("HGPO_SERVE_TOKEN")
    with pytest.raises(ConnectionError, match="no server took the reset"):
        RemoteEnv([url], history_length=2, timeout=10).reset(seed=0)


def test_the_server_says_when_it_is_ready(guarded_server):
    url, process = guarded_server
    log = Path(process.args[process.args.index("--token-file") + 1]).parent / "server.log"
    lines = log.read_text().splitlines()
    assert f"serving HGPO-Rooms-v0 at {url} (64 sessions, token required)" in lines


def test_a_module_id_server_answers_to_the_id_its_clients_were_given():
    with running_server("byo_envs:TestLockbox-v0", "response_format=plain") as (url, _):
        env = RemoteEnv([url], env_id="byo_envs:TestLockbox-v0", response_format="plain")
        try:
            _, info = env.reset(seed=3)
            assert info["task"] == "Open the lockbox."
        finally:
            env.close()


def test_reachable_addresses_need_a_token_or_insecure():
    for host in ("127.0.0.1", "::1", "localhost", "127.0.0.5"):
        assert is_loopback(host)
        check_bind(host, None, insecure=False)
    for host in ("0.0.0.0", "10.1.2.3", "::", "example.org"):
        assert not is_loopback(host)
        with pytest.raises(ValueError, match="refusing to serve"):
            check_bind(host, None, insecure=False)
        check_bind(host, TOKEN, insecure=False)
        check_bind(host, None, insecure=True)


def test_the_cli_refuses_before_binding(monkeypatch, capsys):
    """``serve --host 0.0.0.0`` without a token stops with one line; nothing is bound."""
    from hgpo_env.__main__ import main
    from hgpo_env.serve import server

    def bind(*args, **kwargs):
        raise AssertionError("the server started")

    monkeypatch.setattr(server._AnnouncingServer, "run", bind)
    monkeypatch.delenv("HGPO_SERVE_TOKEN", raising=False)
    assert main(["serve", "HGPO-Rooms-v0", "--host", "0.0.0.0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: refusing to serve 0.0.0.0 without a token") and err.count("\n") == 1


def test_token_sources(tmp_path, monkeypatch):
    monkeypatch.delenv("HGPO_SERVE_TOKEN", raising=False)
    assert read_token() is None
    monkeypatch.setenv("HGPO_SERVE_TOKEN", "from-env")
    assert read_token() == "from-env"
    (tmp_path / "t").write_text("  from-file\n")
    assert read_token(tmp_path / "t") == "from-file"
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ValueError, match="empty"):
        read_token(tmp_path / "empty")


def test_the_metadata_route_does_not_leak_to_strangers(guarded_server):
    """The 401 body says what is missing, nothing about the server."""
    url, _ = guarded_server
    try:
        urllib.request.urlopen(url + "/metadata", timeout=10)
    except urllib.error.HTTPError as error:
        assert json.loads(error.read()) == {"detail": "missing or wrong bearer token"}
        assert error.headers["WWW-Authenticate"] == "Bearer"


def test_connection_limits_reach_uvicorn(monkeypatch, tmp_path):
    from hgpo_env.__main__ import main
    from hgpo_env.serve import server

    seen = {}

    def run(self):
        seen["config"], seen["line"] = self.config, self.line

    monkeypatch.setattr(server._AnnouncingServer, "run", run)
    (tmp_path / "token").write_text(TOKEN)
    argv = ["serve", "HGPO-Rooms-v0", "--keep-alive", "2.5", "--limit-concurrency", "300"]
    assert main([*argv, "--token-file", str(tmp_path / "token"), "--port", "9"]) == 0
    assert (seen["config"].timeout_keep_alive, seen["config"].limit_concurrency) == (2.5, 300)
    assert seen["line"] == "serving HGPO-Rooms-v0 at http://127.0.0.1:9 (64 sessions, token required)"
