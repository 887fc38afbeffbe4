"""A served env under strangers and load (real ``openenv`` server, 127.0.0.1, stopped by pid): what
a client may choose, one session model under one cap, and listings that do not stall sessions."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request

import pytest
from serve_helpers import rooms_served, running_server, ws_request
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from hgpo_env.serve.choices import Allowed, ClientChoices, redact
from hgpo_env.serve.idle import IDLE_CLOSE_CODE
from hgpo_env.serve.wire import HGPOAction


@pytest.fixture(scope="module")
def rooms():
    yield from rooms_served("--allow", "max_steps=1..50", "--max-sessions", "3")


def test_clients_choose_the_task_not_the_operators_arguments(rooms):
    with connect(rooms.replace("http", "ws") + "/ws") as ws:
        for kwargs, refused in (
            ({"history_length": 2_000_000}, "['history_length'] are the operator's"),
            ({"data_path": "/etc"}, "['data_path'] are the operator's"),
            ({"max_steps": 10_000}, "must be a number in [1, 50]"),
        ):
            answer = ws_request(ws, "reset", {"seed": 0, "env_kwargs": kwargs})
            assert answer["type"] == "error" and refused in answer["data"]["message"], answer
        # repeating the server's own values (a trainer sends its whole config), the split, an allowed key
        same = {
            "history_length": 2,
            "fingerprint_mode": "observations_actions",
            "split": "eval",
            "max_steps": 5,
        }
        answer = ws_request(ws, "reset", {"seed": 0, "env_kwargs": same})
        assert answer["type"] == "observation"
        for _ in range(5):
            answer = ws_request(ws, "step", {"response": "look"})
        assert answer["data"]["done"]  # max_steps=5 took


def test_a_hostile_clients_huge_arguments_get_short_errors(rooms):
    with connect(rooms.replace("http", "ws") + "/ws", max_size=None) as ws:
        for kwargs in ({"k" * 1_000_000: 1}, {"split": "s" * 1_000_000}, {"max_steps": "9" * 1_000_000}):
            answer = ws_request(ws, "reset", {"seed": 0, "env_kwargs": kwargs})
            assert answer["type"] == "error" and len(json.dumps(answer)) < 5_000, str(answer)[:200]
        assert ws_request(ws, "reset", {"seed": 0})["type"] == "observation"  # the session goes on
    request = urllib.request.Request(
        f"{rooms}/HGPO-Rooms-v0/num_tasks",
        data=b'{"split": "nope"}',
        headers={"Content-Type": "application/json"},
    )
    started = time.monotonic()
    with pytest.raises(urllib.error.HTTPError) as refused:  # a split the env does not name: no env is built
        urllib.request.urlopen(request, timeout=30)
    assert refused.value.code == 400 and time.monotonic() - started < 2


def test_the_http_session_routes_are_off(rooms):
    for path in ("/reset", "/step", "/mcp"):
        request = urllib.request.Request(
            rooms + path, data=b"{}", headers={"Content-Type": "application/json"}
        )
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(request, timeout=10)
        assert missing.value.code in (404, 405), path


def test_an_idle_session_is_closed_with_a_reason_and_the_cap_holds():
    with running_server("HGPO-Rooms-v0", "--max-sessions", "1", "--session-timeout", "2") as (url, _):
        ws_url = url.replace("http", "ws") + "/ws"
        with connect(ws_url) as idle:
            assert ws_request(idle, "reset", {"seed": 0})["type"] == "observation"
            with connect(ws_url) as newcomer:  # refused while the idle one holds the only slot
                assert json.loads(newcomer.recv(timeout=30))["data"]["code"] == "CAPACITY_REACHED"
            with pytest.raises(ConnectionClosed) as closed:  # the server closes it once idle for 2 s
                idle.recv(timeout=30)
            assert (
                closed.value.rcvd.code == IDLE_CLOSE_CODE
                and "idle for more than 2 s" in closed.value.rcvd.reason
            )
        deadline = time.monotonic() + 30
        while True:  # the slot comes free as OpenEnv ends the closed session
            with connect(ws_url) as newcomer:
                answer = ws_request(newcomer, "reset", {"seed": 0})
            if answer["type"] == "observation" or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert answer["type"] == "observation", answer


def test_a_closed_session_makes_no_env_past_the_cap():
    """What a message still reaching a closed session gets (OpenEnv's reaper beat the socket)."""
    from hgpo_env.serve.server import HGPOEnvironment

    session = HGPOEnvironment("HGPO-Rooms-v0")
    session.reset(seed=0)
    session.close()
    for call in (lambda: session.reset(seed=0), lambda: session.step(HGPOAction(response="look"))):
        with pytest.raises(RuntimeError, match="closed by the server .* open a new connection"):
            call()
    assert session.env is None


def test_a_task_listing_does_not_stall_the_sessions_stepping():
    """400 tasks, an env that takes 1 s to build: the listing builds one, in a thread."""
    with (
        running_server("byo_envs:TestSlowDial-v0", "response_format=plain") as (url, _),
        connect(url.replace("http", "ws") + "/ws") as ws,
    ):
        ws_request(ws, "reset", {"seed": 0})
        listed = {}

        def list_tasks():
            request = urllib.request.Request(
                f"{url}/TestSlowDial-v0/tasks",
                data=json.dumps({"split": "train"}).encode(),
                headers={"Content-Type": "application/json"},
            )
            started = time.monotonic()
            with urllib.request.urlopen(request, timeout=120) as answer:
                listed["tasks"] = json.load(answer)["tasks"]
            listed["seconds"] = time.monotonic() - started

        lister = threading.Thread(target=list_tasks)
        lister.start()
        latencies = []
        while lister.is_alive() or len(latencies) < 20:
            started = time.monotonic()
            ws_request(ws, "step", {"response": "up"})
            latencies.append(time.monotonic() - started)
        lister.join()
    assert len(listed["tasks"]) == 400 and listed["seconds"] < 10
    # the 1 s build never ran on the event loop (a busy machine may still pause a step a while)
    assert max(latencies) < 0.5, max(latencies)


def test_client_choices_and_redaction():
    choices = ClientChoices("HGPO-Rooms-v0", {"history_length": 2}, [Allowed.parse("max_steps=1..50")])
    assert choices.resolve({"history_length": 2, "protocol": "strict", "split": "eval"}) == {
        "history_length": 2,
        "split": "eval",
    }
    with pytest.raises(ValueError, match=r"\['history_length', 'show_carried'\] are the operator's"):
        choices.resolve({"history_length": 3, "show_carried": True})
    for bad in ("max_steps=1", "max steps", "max_steps=a..b"):
        with pytest.raises(ValueError, match="--allow takes"):
            Allowed.parse(bad)
    assert redact("no games in /data/alfworld/json_2.1.1/train (see http://x.org/a)") == (
        "no games in <path> (see http://x.org/a)"
    )
    assert redact("see ~/games/a.json and ../b/c.json") == "see <path> and <path>"
    launched = {"data_path": "/srv/my games/alfworld", "api_key": "sk-123456", "history_length": 2}
    said = "FileNotFoundError: /srv/my games/alfworld/x: no such file (key sk-123456)"
    assert (
        redact(said, launched.values())
        == "FileNotFoundError: <server argument><path>: no such file (key <server argument>)"
    )
    echoed = (
        "TypeError: bad arg was raised from the environment creator for X-v0 with kwargs ({'api_key': 'zz'})"
    )
    assert redact(echoed) == "TypeError: bad arg was raised from the environment creator for X-v0"
