"""Env steps per second and step latency over OpenEnv's WebSocket, beside the in-process pool.

    python benchmarks/serve_throughput.py [--seconds 5] [--sessions 1 16 64 256 1024] [--servers 1] [--webshop-data PATH]

For Rooms and WebShop, a server (``python -m hgpo_env serve``, one process) is started on
127.0.0.1 and N sessions are opened (connect and first reset; the time is printed, "open s"), then
play random admissible commands over ``/ws`` from one asyncio client process for the given
seconds, resetting as episodes end; each step's round trip is timed, and the server's resident
memory is sampled (its peak over the idle server's, per session: an upper bound), and the CPU
time per step of the servers and of the client (they share the cores). The baseline,
in the same run, is ``GroupedEnvPool`` (process backend, 2 workers) stepping N envs the same way.
Targets on 2 cores: at least 2,000 Rooms steps/s with 64 sessions, p99 under 20 ms; p99 under
100 ms at 256; at 1,024, p99 under 250 ms and steps/s no lower than at 256.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import psutil
from websockets.asyncio.client import connect

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from serve_helpers import running_server

from hgpo_env.vector import GroupedEnvPool

RESPONSE = "<think>ok</think><action>{}</action>"


async def open_session(url: str, seed: int, opening: asyncio.Semaphore) -> tuple[Any, dict, random.Random]:
    """A connected session after its first reset (at most ``opening``'s count handshaking at once)."""
    rng = random.Random(seed)
    async with opening:
        ws = await connect(url, max_size=None)
        await ws.send(json.dumps({"type": "reset", "data": {"seed": rng.randrange(10**6)}}))
        return ws, json.loads(await ws.recv()), rng


async def play(ws: Any, reply: dict, rng: random.Random, until: float, latencies: list[float]) -> int:
    """Random admissible commands until ``until``, resetting as episodes end; each step's round trip timed."""
    steps = 0
    while time.perf_counter() < until:
        if reply["data"]["done"]:
            await ws.send(json.dumps({"type": "reset", "data": {"seed": rng.randrange(10**6)}}))
            reply = json.loads(await ws.recv())
        command = rng.choice(reply["data"]["metadata"]["admissible_actions"])
        started = time.perf_counter()
        await ws.send(json.dumps({"type": "step", "data": {"response": RESPONSE.format(command)}}))
        reply = json.loads(await ws.recv())
        latencies.append(time.perf_counter() - started)
        steps += 1
    return steps


def resident(servers: list[psutil.Process]) -> int:
    return sum(server.memory_info().rss for server in servers)


def cpu_seconds(servers: list[psutil.Process]) -> float:
    return sum(sum(server.cpu_times()[:2]) for server in servers)  # user + system


async def served(
    urls: list[str], sessions: int, seconds: float, servers: list[psutil.Process]
) -> tuple[float, list[float], float, float, tuple[float, float]]:
    """Steps/s, step latencies, the servers' peak resident memory (bytes, together), the seconds
    it took to open the sessions (connect and first reset, 64 at a time; session i on server
    i mod the number of servers), and the CPU seconds per step of the servers and of this client
    while playing: a trainer opens its sessions once, so all but the opening time are of open
    sessions only. Client and servers share the machine's cores, so steps/s is bounded by their
    CPU per step together; the servers' alone is what a server machine of its own would spend."""
    began = time.perf_counter()
    opening = asyncio.Semaphore(64)
    opened = await asyncio.gather(*(open_session(urls[i % len(urls)], i, opening) for i in range(sessions)))
    open_s = time.perf_counter() - began
    latencies: list[float] = []
    peak = resident(servers)
    playing = True

    async def sample() -> None:
        nonlocal peak
        while playing:
            peak = max(peak, resident(servers))
            await asyncio.sleep(0.2)

    sampler = asyncio.create_task(sample())
    server_cpu, client_cpu = cpu_seconds(servers), time.process_time()
    started = time.perf_counter()
    until = started + seconds
    steps = await asyncio.gather(*(play(ws, reply, rng, until, latencies) for ws, reply, rng in opened))
    rate = sum(steps) / (time.perf_counter() - started)
    cpu = ((cpu_seconds(servers) - server_cpu) / sum(steps), (time.process_time() - client_cpu) / sum(steps))
    playing = False
    await sampler
    await asyncio.gather(*(ws.close() for ws, _, _ in opened))
    return rate, latencies, peak, open_s, cpu


def pooled(env_id: str, kwargs: dict, envs: int, seconds: float) -> tuple[float, list[float]]:
    rng, latencies, steps = random.Random(0), [], 0
    with GroupedEnvPool(env_id, envs, 1, num_workers=min(2, envs), seed=0, **kwargs) as pool:
        infos = {r.env_index: r.info for r in pool.reset()}
        deadline = time.perf_counter() + seconds
        started = time.perf_counter()
        while time.perf_counter() < deadline:
            if not pool.running:
                infos = {r.env_index: r.info for r in pool.reset()}
            actions = {i: RESPONSE.format(rng.choice(infos[i]["admissible_actions"])) for i in pool.running}
            begun = time.perf_counter()
            for result in pool.step(actions):
                infos[result.env_index] = result.info
            latencies.append(time.perf_counter() - begun)
            steps += len(actions)
        return steps / (time.perf_counter() - started), latencies


def quantile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[q - 1] * 1e3 if len(values) > 1 else values[0] * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--sessions", type=int, nargs="+", default=[1, 16, 64, 256, 1024])
    parser.add_argument(
        "--servers", type=int, default=1, help="server processes, each with its share of the sessions"
    )
    parser.add_argument(
        "--webshop-data", default=str(Path(__file__).resolve().parents[2] / "shared/data/webshop")
    )
    args = parser.parse_args()
    webshop = [f"data_path={args.webshop_data}"] if Path(args.webshop_data).is_dir() else []
    envs = [("HGPO-Rooms-v0", []), ("HGPO-WebShop-v0", webshop)]
    print(f"{args.seconds:g} s per cell; latency = one step's round trip (pool: one pool.step over all envs)")
    print(
        f"{'env':<17}{'sessions':>9}{'open s':>8}{'served steps/s':>16}{'p50 ms':>8}{'p99 ms':>8}{'KiB/session':>12}"
        f"{'CPU us/step server':>20}{'client':>8}{'pool steps/s':>14}{'p50 ms':>8}{'p99 ms':>8}"
    )
    for env_id, env_args in envs:
        kwargs = dict(arg.split("=", 1) for arg in env_args)
        with contextlib.ExitStack() as stack:
            started = [
                stack.enter_context(
                    running_server(env_id, *env_args, "--max-sessions", str(max(args.sessions)))
                )
                for _ in range(args.servers)
            ]
            urls = [url.replace("http", "ws") + "/ws" for url, _ in started]
            servers = [psutil.Process(process.pid) for _, process in started]
            idle = resident(servers)  # the started servers, each with its env made once
            for n in args.sessions:
                rate, lat, peak, open_s, (server_cpu, client_cpu) = asyncio.run(
                    served(urls, n, args.seconds, servers)
                )
                grown = peak - idle
                pool_rate, pool_lat = pooled(env_id, kwargs, n, args.seconds)
                print(
                    f"{env_id:<17}{n:>9}{open_s:>8.2f}{rate:>16.0f}{quantile(lat, 50):>8.2f}{quantile(lat, 99):>8.2f}"
                    f"{grown / n / 1024:>12.0f}{server_cpu * 1e6:>20.0f}{client_cpu * 1e6:>8.0f}{pool_rate:>14.0f}{quantile(pool_lat, 50):>8.2f}{quantile(pool_lat, 99):>8.2f}"
                )


if __name__ == "__main__":
    main()
