"""``python -m hgpo_env serve`` against the real ``openenv`` package: servers run as subprocesses on
127.0.0.1 (each on a free port, stopped by pid), clients are OpenEnv's own, a plain WebSocket,
and the pool's ``openenv`` backend."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import gymnasium as gym
import pytest
from openenv.core import GenericEnvClient
from serve_helpers import free_port, rooms_served, running_server, ws_request
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

import hgpo_env  # noqa: F401  (registers the ids)
from hgpo_env.contract.milestones import MILESTONES_KEY, SIGNATURE_KEY
from hgpo_env.prompting.tool_calls import ToolCall, write_call
from hgpo_env.serve.client import HGPOEnvClient, RemoteEnv
from hgpo_env.serve.wire import HGPOAction
from hgpo_env.vector import GroupedEnvPool, PoolError


@pytest.fixture(scope="module")
def rooms_server():
    yield from rooms_served("--max-sessions", "80", "--allow", "max_steps=1..100")


def expert_episode(env, task_id, seed=3):
    """In process: the prompts, rewards, flags and fingerprints of an expert episode, and its responses."""
    prompt, info = env.reset(seed=seed, options={"task_id": task_id})
    trace, responses = [(prompt, info["fingerprints"], info["initial_fingerprint"])], []
    while True:
        response = f"<think>plan</think><action>{env.unwrapped.expert_action()}</action>"
        prompt, reward, terminated, truncated, info = env.step(response)
        responses.append(response)
        trace.append((prompt, reward, terminated, truncated, info["fingerprints"]))
        if terminated or truncated:
            return trace, responses


def test_openenv_client_plays_what_gym_make_plays_in_process(rooms_server):
    local = gym.make("HGPO-Rooms-v0", history_length=2)
    for task_id in (10_007, 10_123):
        expected, responses = expert_episode(local, task_id)
        with HGPOEnvClient(base_url=rooms_server).sync() as client:
            result = client.reset(seed=3, task_id=task_id)
            meta = result.observation.metadata
            got = [
                (
                    result.observation.prompt,
                    tuple(map(int, meta["fingerprints"])),
                    int(meta["initial_fingerprint"]),
                )
            ]
            for response in responses:
                result = client.step(HGPOAction(response=response))
                meta = result.observation.metadata
                fingerprints = tuple(map(int, meta["fingerprints"]))
                got.append(
                    (
                        result.observation.prompt,
                        result.reward,
                        meta["terminated"],
                        meta["truncated"],
                        fingerprints,
                    )
                )
                assert result.done == (meta["terminated"] or meta["truncated"])
        assert got == expected
    with GenericEnvClient(base_url=rooms_server).sync() as generic:  # no typed client needed
        result = generic.reset(seed=3, task_id=10_007)
        assert result.observation["prompt"] == expected[0][0] or result.observation["prompt"].startswith(
            "You are"
        )


def test_a_plain_websocket_client_gets_the_in_process_fingerprints(rooms_server):
    expected, responses = expert_episode(gym.make("HGPO-Rooms-v0", history_length=2), 10_050)
    with connect(rooms_server.replace("http", "ws") + "/ws") as ws:
        answer = ws_request(ws, "reset", {"seed": 3, "task_id": 10_050})
        assert answer["type"] == "observation"
        assert [int(k) for k in answer["data"]["metadata"]["fingerprints"]] == list(expected[0][1])
        for response, step in zip(responses, expected[1:]):
            answer = ws_request(ws, "step", {"response": response})
            assert tuple(int(k) for k in answer["data"]["metadata"]["fingerprints"]) == step[4]
            assert answer["data"]["reward"] == step[1] and answer["data"]["observation"]["prompt"] == step[0]
        assert answer["data"]["done"] and answer["data"]["metadata"]["won"]


def test_remote_env_matches_gym_make_including_info(rooms_server):
    remote, local = RemoteEnv([rooms_server], history_length=2), gym.make("HGPO-Rooms-v0", history_length=2)
    try:
        assert remote.reset(seed=1, options={"task_id": 10_009}) == local.reset(
            seed=1, options={"task_id": 10_009}
        )
        for _ in range(6):
            response = f"<action>{local.unwrapped.expert_action()}</action>"
            answer = remote.step(response)
            assert answer == local.step(response)
            assert isinstance(answer[-1][MILESTONES_KEY], tuple) and SIGNATURE_KEY in answer[-1]
    finally:
        remote.close()


def test_a_served_chat_env_sends_messages_and_takes_tool_calls():
    """The operator serves chat prompts and tool calls (env arguments are the operator's)."""
    chat = {"history_length": 2, "prompt_format": "chat", "response_format": "tool_call"}
    with running_server("HGPO-Rooms-v0", *[f"{key}={value}" for key, value in chat.items()]) as (url, _):
        remote, local = RemoteEnv([url]), gym.make("HGPO-Rooms-v0", **chat)
        try:
            prompt, info = remote.reset(seed=1, options={"task_id": 10_009})
            assert (prompt, info) == local.reset(seed=1, options={"task_id": 10_009})
            assert prompt[0]["role"] == "system" and info["tools"][0]["function"]["name"] == "act"
            expert = write_call(ToolCall("act", {"command": local.unwrapped.expert_action()}))
            for reply in [expert, "no call"]:
                answer = remote.step(reply)
                assert answer == local.step(reply)
            assert answer[-1]["parse"] == "no_call" and answer[0][-1]["content"].startswith("Error: no_call")
        finally:
            remote.close()


BAD = [
    ("not json", "INVALID_JSON"),
    (json.dumps({"type": "dance"}), "UNKNOWN_TYPE"),
    (json.dumps({"type": "step", "data": {"response": 5}}), "VALIDATION_ERROR"),
    (json.dumps({"type": "step", "data": {"response": "x" * 1_000_001}}), "EXECUTION_ERROR"),  # over the cap
    (json.dumps({"type": "reset", "data": {"sed": 1}}), "VALIDATION_ERROR"),  # a typo is refused, not dropped
    # what pydantic would answer with every input echoed, and parse on the event loop
    (
        json.dumps({"type": "step", "data": {"response": "x", **{f"k{i}": i for i in range(100_000)}}}),
        "VALIDATION_ERROR",
    ),
    (
        json.dumps({"type": "step", "data": {"response": "x", "metadata": {"a": list(range(20_000))}}}),
        "VALIDATION_ERROR",
    ),
    (json.dumps({"type": "step", "extra": 1, "data": {"response": "x"}}), "VALIDATION_ERROR"),
    (json.dumps({"type": "reset", "data": {"env_id": "HGPO-WebShop-v0"}}), "EXECUTION_ERROR"),
    # frames OpenEnv's own loop cannot read, which used to end the session (FrameGuard answers them)
    ("[1, 2]", "VALIDATION_ERROR"),
    ("null", "VALIDATION_ERROR"),
    (b"\x00binary", "INVALID_JSON"),
    ("[" * 100_000 + "]" * 100_000, "INVALID_JSON"),  # past any recursion limit (jedi sets 3000)
    ('{"type": "reset", "data": {"seed": ' + "9" * 5000 + "}}", "INVALID_JSON"),
]


def test_bad_messages_get_an_error_reply_and_every_session_goes_on(rooms_server):
    ws_url = rooms_server.replace("http", "ws") + "/ws"
    with connect(ws_url, max_size=None) as bad, connect(ws_url) as good:
        first = ws_request(bad, "step", {"response": "<action>look</action>"})
        assert first["type"] == "error" and "reset first" in first["data"]["message"]  # step before reset
        ws_request(good, "reset", {"seed": 0, "task_id": 10_001})
        for message, code in BAD:
            bad.send(message)
            answer = json.loads(bad.recv(timeout=30))
            assert answer["type"] == "error" and answer["data"]["code"] == code, (message[:40], answer)
            assert len(json.dumps(answer)) < 10_000  # a huge input is not echoed back
            assert ws_request(good, "step", {"response": "<action>look</action>"})["type"] == "observation"
        ws_request(bad, "reset", {"seed": 0, "task_id": 10_001, "env_kwargs": {"max_steps": 1}})
        assert ws_request(bad, "step", {"response": "look"})["data"]["done"]
        after = ws_request(bad, "step", {"response": "look"})  # step after done
        assert after["type"] == "error" and "episode is over" in after["data"]["message"]
        assert ws_request(bad, "reset", {"seed": 0})["type"] == "observation"  # the session still works


def test_a_frame_over_the_cap_closes_only_its_connection(rooms_server):
    """A frame is read whole before anything can answer it: the server stops reading one over
    4 MiB and drops that connection (the protocol's answer; the client sees the close or a reset),
    the other sessions go on."""
    ws_url = rooms_server.replace("http", "ws") + "/ws"
    with connect(ws_url, max_size=None) as bad, connect(ws_url) as good:
        ws_request(good, "reset", {"seed": 0, "task_id": 10_001})
        with pytest.raises((ConnectionClosed, OSError)):
            bad.send(json.dumps({"type": "step", "data": {"response": "x" * 10_000_000}}))
            bad.recv(timeout=30)
        assert ws_request(good, "step", {"response": "<action>look</action>"})["type"] == "observation"


def test_64_concurrent_sessions_each_play_their_own_task(rooms_server):
    results, errors = {}, []

    def play(task_id):
        try:
            with connect(rooms_server.replace("http", "ws") + "/ws") as ws:
                ws_request(ws, "reset", {"seed": 0, "task_id": task_id})
                local = gym.make("HGPO-Rooms-v0", history_length=2)
                local.reset(seed=0, options={"task_id": task_id})
                while True:
                    response = f"<action>{local.unwrapped.expert_action()}</action>"
                    answer = ws_request(ws, "step", {"response": response})["data"]
                    local.step(response)
                    if answer["done"]:
                        results[task_id] = (answer["metadata"]["won"], answer["metadata"]["fingerprints"])
                        return
        except Exception as error:  # noqa: BLE001  -- collected and asserted below
            errors.append(repr(error))

    threads = [threading.Thread(target=play, args=(10_000 + i,)) for i in range(64)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors and len(results) == 64
    assert all(won for won, _ in results.values())
    assert len({tuple(keys) for _, keys in results.values()}) > 32  # different tasks, different ends


def test_a_full_server_refuses_a_session_clearly():
    with running_server("HGPO-Rooms-v0", "--max-sessions", "2") as (url, _):
        ws_url = url.replace("http", "ws") + "/ws"
        with connect(ws_url) as one, connect(ws_url) as two:
            ws_request(one, "reset", {"seed": 0})
            ws_request(two, "reset", {"seed": 0})
            with connect(ws_url) as three:
                answer = json.loads(three.recv(timeout=30))
                assert answer["data"]["code"] == "CAPACITY_REACHED" and "2" in answer["data"]["message"]
        with connect(ws_url) as again:  # the two closed: room again
            assert ws_request(again, "reset", {"seed": 0})["type"] == "observation"


def test_idle_sessions_are_reclaimed_after_the_session_timeout():
    with running_server("HGPO-Rooms-v0", "--max-sessions", "1", "--session-timeout", "1") as (url, _):
        ws_url = url.replace("http", "ws") + "/ws"
        with connect(ws_url) as idle:
            ws_request(idle, "reset", {"seed": 0})
            deadline = time.monotonic() + 30
            while True:  # the reaper looks every 5 s at the least
                time.sleep(1)
                with connect(ws_url) as newcomer:
                    try:
                        answer = ws_request(newcomer, "reset", {"seed": 0})
                    except ConnectionClosed:  # refused: the server is still full
                        answer = {"type": "refused"}
                if answer["type"] == "observation" or time.monotonic() > deadline:
                    break
            assert answer["type"] == "observation", answer


def test_sigterm_closes_sessions_and_exits():
    with running_server("HGPO-Rooms-v0") as (url, process), connect(url.replace("http", "ws") + "/ws") as ws:
        ws_request(ws, "reset", {"seed": 0})
        process.send_signal(signal.SIGTERM)
        process.wait(60)  # a server that waits on its open session never exits
        with pytest.raises(ConnectionClosed):
            ws_request(ws, "step", {"response": "look"})


def test_the_pool_over_two_servers_survives_losing_one():
    served = ("history_length=2", "response_format=plain", "max_steps=30")
    with (
        running_server("HGPO-Rooms-v0", *served) as (first, _),
        running_server("HGPO-Rooms-v0", *served) as (
            second,
            doomed,
        ),
    ):
        options = {"history_length": 2, "response_format": "plain", "max_steps": 30}
        with GroupedEnvPool(
            "HGPO-Rooms-v0", 4, 4, num_workers=4, seed=0, backend="openenv", servers=[first, second],
            step_timeout=10, **options,
        ) as pool:  # fmt: skip
            started = pool.reset(task_ids=[10_001, 10_002, 10_003, 10_004])
            local = gym.make("HGPO-Rooms-v0", **options)
            for result in started:  # the same prompts as in process; groups verified by the pool
                assert result.obs == local.reset(options={"task_id": 10_001 + result.group})[0]
            pool.step({i: "look" for i in pool.running})
            doomed.kill()
            doomed.wait(10)
            results = pool.step({i: "look" for i in pool.running})
            lost = {r.env_index for r in results if "env_error" in r.info}
            assert lost == {
                i for i in range(16) if pool.worker_of(i) % 2 == 1
            }  # workers 1, 3 used the lost one
            assert all(r.truncated for r in results if r.env_index in lost)
            assert not any(r.truncated for r in results if r.env_index not in lost)
            assert len(pool.reset(task_ids=[10_001, 10_002, 10_003, 10_004])) == 16  # all on the live server
            assert not any("env_error" in r.info for r in pool.step({i: "look" for i in pool.running}))


def test_task_api_splits_and_a_reset_by_split_and_index(rooms_server):
    import urllib.error
    import urllib.request

    with urllib.request.urlopen(f"{rooms_server}/HGPO-Rooms-v0/splits", timeout=30) as answer:
        assert [split["name"] for split in json.load(answer)] == ["train", "eval"]
    request = urllib.request.Request(
        f"{rooms_server}/HGPO-Rooms-v0/num_tasks",
        data=b'{"split": "eval"}',
        headers={"Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as unbounded:  # Rooms generates tasks without end
        urllib.request.urlopen(request, timeout=30)
    assert unbounded.value.code == 501
    local = gym.make("HGPO-Rooms-v0", history_length=2, split="eval")
    with connect(rooms_server.replace("http", "ws") + "/ws") as ws:
        answer = ws_request(ws, "reset", {"seed": 5, "split": "eval", "index": 3})
    assert answer["data"]["observation"]["prompt"] == local.reset(seed=5, options={"task_id": 3})[0]


def test_a_server_that_stops_answering_truncates_only_its_episodes_within_the_step_timeout():
    with (
        running_server("HGPO-Rooms-v0", "response_format=plain") as (live, _),
        running_server("HGPO-Rooms-v0", "response_format=plain") as (hung, frozen),
        GroupedEnvPool(
            "HGPO-Rooms-v0", 6, 2, num_workers=2, seed=0, backend="openenv", servers=[live, hung],
            step_timeout=2, response_format="plain",
        ) as pool,
    ):  # fmt: skip
        pool.reset(task_ids=list(range(10_001, 10_007)))
        frozen.send_signal(signal.SIGSTOP)  # alive but silent
        try:
            started = time.monotonic()
            results = pool.step({i: "look" for i in pool.running})
            elapsed = time.monotonic() - started
        finally:
            frozen.send_signal(signal.SIGCONT)
        silent = {r.env_index for r in results if "env_error" in r.info}
        assert silent == {i for i in range(12) if pool.worker_of(i) == 1}
        assert all(
            f"TimeoutError: {hung}: no answer to step within 2 s" in results[i].info["env_error"]
            for i in silent
        )
        # The worker waits on its 6 sessions at once: one step_timeout, not one each (12 s).
        assert elapsed < 2 + 6


def test_the_pool_takes_a_restarted_server_back_when_the_other_is_full():
    """Servers sized to their share: one dies, the other refuses the extra sessions (a refusal
    fails over like a lost connection), and once the dead one is back the next reset uses it."""
    served = ("response_format=plain", "--max-sessions", "4")
    port = free_port()
    with running_server("HGPO-Rooms-v0", *served) as (first, _):
        with running_server("HGPO-Rooms-v0", *served, port=port) as (second, doomed):
            pool = GroupedEnvPool(
                "HGPO-Rooms-v0", 2, 4, num_workers=2, seed=0, backend="openenv", servers=[first, second],
                step_timeout=10, response_format="plain",
            )  # fmt: skip
            pool.reset(task_ids=[10_001, 10_002])
            doomed.kill()
            doomed.wait(10)
        try:
            with pytest.raises(PoolError, match="CAPACITY_REACHED"):  # the live server is full
                pool.reset(task_ids=[10_001, 10_002])
            with running_server("HGPO-Rooms-v0", *served, port=port):  # back, on its address
                results = pool.reset(task_ids=[10_001, 10_002])
                assert len(results) == 8 and not any(
                    "env_error" in r.info for r in pool.step({i: "look" for i in pool.running})
                )
        finally:
            pool.close()


@pytest.mark.parametrize("switch", ["false", "true"])
def test_openenvs_web_ui_is_imported_only_when_its_switch_is_on(switch: str) -> None:
    """OpenEnv's Gradio UI costs every server, pool worker and client seconds of start-up; it stays
    out unless ENABLE_WEB_INTERFACE, OpenEnv's own switch for it, asks for it."""
    probe = "import sys, hgpo_env.serve.server; print('gradio' in sys.modules)"
    env = {**os.environ, "ENABLE_WEB_INTERFACE": switch}
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == str(switch == "true")
