"""Throughput and peak memory of GroupedEnvPool against stepping the same envs in one process.

    python benchmarks/pool_throughput.py [--groups 16] [--group-size 8] [--workers N]
        [--env HGPO-Rooms-v0] [--env-kwargs '{"split": "eval"}'] [--variants fast,slow]

Each measurement runs in a fresh child process (so peak memory is its own): ``--rounds`` rollouts
of all envs, each a reset with fixed seeds and steps until every episode ends, with a fixed
policy (the ``step + env``-th admissible command) so both modes do identical work (checked).
Timing covers the rollouts, not making the envs or starting the workers; before any measurement
one env is reset on every task used, so a disk cache (ALFWorld's compiled games) is equally warm
for both modes (first-ever resets are what ``alfworld_latency.py`` measures). Peak memory
is the largest summed RSS of the child and all its descendants, sampled every 20 ms (RSS counts
shared pages once per process, so it overstates the pool a little). "CPU s" is the CPU time of
the whole measurement (start-up included), which other load on the machine does not change.

Variants: ``fast`` is the env as it is; ``slow`` adds ``--slow-ms`` of CPU-bound work to every
step (ALFWorld's steps take ~50 ms), where the pool should approach one speed-up per idle core
(``--slow-kind sleep`` waits instead, so the speed-up follows the workers, not the cores). For
ALFWorld itself: ``--env HGPO-ALFWorld-v0 --variants fast``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

import hgpo_env  # noqa: F401  -- registers the HGPO ids
from hgpo_env.vector import GroupedEnvPool


class SlowStep(gym.Wrapper):
    """Spends ``work_ms`` before each step: CPU time like a heavy engine, or asleep like one that
    waits on I/O (which shows the pool's own overhead and scaling, not the machine's cores)."""

    def __init__(self, env: gym.Env, work_ms: float, kind: str) -> None:
        super().__init__(env)
        self.work_s, self.kind = work_ms / 1000, kind

    def step(self, action: Any) -> Any:
        if self.kind == "sleep":
            time.sleep(self.work_s)
        else:
            deadline = time.thread_time() + self.work_s  # CPU time: the same work however busy the machine
            while time.thread_time() < deadline:
                pass
        return self.env.step(action)


def make_env(env_id: str, work_ms: float, kind: str, **env_kwargs: Any) -> gym.Env:
    env = gym.make(env_id, **env_kwargs)
    return SlowStep(env, work_ms, kind) if work_ms > 0 else env


def policy(step: int, env_index: int, info: dict[str, Any]) -> str:
    commands = info["admissible_actions"]
    return f"<action>{commands[(step + env_index) % len(commands)]}</action>"


def run_sequential(args: argparse.Namespace, factory: functools.partial) -> tuple[int, float, float]:
    """Steps, total reward and seconds of the rollouts (env creation not timed)."""
    envs = [factory() for _ in range(args.groups * args.group_size)]
    started = time.perf_counter()
    steps, reward = 0, 0.0
    for round_ in range(args.rounds):
        infos = {}
        for index, env in enumerate(envs):
            _, infos[index] = env.reset(seed=round_ * args.groups + index // args.group_size)
        step = 0
        while infos:
            for index in list(infos):
                _, r, terminated, truncated, infos[index] = envs[index].step(
                    policy(step, index, infos[index])
                )
                steps, reward = steps + 1, reward + r
                if terminated or truncated:
                    del infos[index]
            step += 1
    return steps, reward, time.perf_counter() - started


def run_pool(args: argparse.Namespace, factory: functools.partial) -> tuple[int, float, float]:
    """Steps, total reward and seconds of the rollouts (worker start-up not timed)."""
    steps, reward = 0, 0.0
    with GroupedEnvPool(
        factory, args.groups, args.group_size, num_workers=args.workers, backend=args.backend
    ) as pool:
        started = time.perf_counter()
        for round_ in range(args.rounds):
            seeds = [round_ * args.groups + group for group in range(args.groups)]
            infos = {r.env_index: r.info for r in pool.reset(seeds=seeds)}
            step = 0
            while infos:
                for result in pool.step({i: policy(step, i, info) for i, info in infos.items()}):
                    steps, reward = steps + 1, reward + result.reward
                    infos[result.env_index] = result.info
                    if result.done:
                        del infos[result.env_index]
                step += 1
        return steps, reward, time.perf_counter() - started


def warm_up(args: argparse.Namespace) -> None:
    """Reset one env on every task the measurements use (caches on disk then favour neither mode)."""
    env = make_env(args.env, 0.0, args.slow_kind, **json.loads(args.env_kwargs))
    for seed in range(args.rounds * args.groups):
        env.reset(seed=seed)
    env.close()


def child(args: argparse.Namespace) -> None:
    """One measurement; prints a JSON line."""
    work_ms = args.slow_ms if args.variant == "slow" else 0.0
    kwargs = json.loads(args.env_kwargs)
    if args.variant == "slow":
        kwargs.setdefault("max_steps", args.slow_max_steps)
    factory = functools.partial(make_env, args.env, work_ms, args.slow_kind, **kwargs)
    steps, reward, seconds = (run_pool if args.child == "pool" else run_sequential)(args, factory)
    cpu = sum(os.times()[:4])  # this process and its reaped children (the pool's workers)
    print(json.dumps({"steps": steps, "seconds": seconds, "reward": reward, "cpu": cpu}))


def tree_rss(process: psutil.Process) -> int:
    total = 0
    for member in [process, *process.children(recursive=True)]:
        try:
            total += member.memory_info().rss
        except psutil.Error:  # exited between listing and reading
            pass
    return total


def measure(argv: list[str]) -> dict[str, float]:
    """Run one child measurement, sampling the peak RSS of its process tree."""
    proc = subprocess.Popen([sys.executable, __file__, *argv], stdout=subprocess.PIPE, text=True)
    peak = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        parent = psutil.Process(proc.pid)
        while not done.is_set():
            try:
                peak = max(peak, tree_rss(parent))
            except psutil.NoSuchProcess:
                return
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, _ = proc.communicate()
    done.set()
    sampler.join()
    if proc.returncode != 0:
        raise SystemExit(f"measurement {argv} failed with code {proc.returncode}")
    return {**json.loads(out.strip().splitlines()[-1]), "peak_mib": peak / 2**20}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="HGPO-Rooms-v0", help="any registered id, e.g. HGPO-ALFWorld-v0")
    parser.add_argument("--env-kwargs", default="{}", help="JSON object of env kwargs")
    parser.add_argument("--groups", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--workers", type=int, default=None, help="default: one per CPU")
    parser.add_argument("--backend", choices=("process", "ray"), default="process")
    parser.add_argument("--rounds", type=int, default=3, help="rollouts (reset + episode) per measurement")
    parser.add_argument("--variants", default="fast,slow", help="comma-separated: fast, slow")
    parser.add_argument("--slow-ms", type=float, default=50.0, help="CPU work added to each step in 'slow'")
    parser.add_argument("--slow-kind", choices=("cpu", "sleep"), default="cpu", help="what the added work is")
    parser.add_argument(
        "--slow-max-steps", type=int, default=2, help="episode length in 'slow' (keeps it short)"
    )
    parser.add_argument("--child", choices=("sequential", "pool"), help=argparse.SUPPRESS)
    parser.add_argument("--variant", choices=("fast", "slow"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    workers = args.workers or len(os.sched_getaffinity(0))
    warm_up(args)
    print(
        f"{args.env}: {args.groups} groups x {args.group_size} envs, {args.rounds} rollouts, "
        f"{args.backend} backend with {workers} workers, {psutil.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.1f} (other work on the machine skews the speed-up)"
    )
    print(
        f"{'variant':<20}{'mode':<12}{'steps':>8}{'seconds':>10}{'steps/s':>10}{'CPU s':>8}{'peak RSS MiB':>14}"
    )
    for variant in args.variants.split(","):
        label = f"slow ({args.slow_ms:g} ms {args.slow_kind})" if variant == "slow" else variant
        rows = {}
        for mode in ("sequential", "pool"):
            argv = sys.argv[1:] + ["--child", mode, "--variant", variant, "--workers", str(workers)]
            row = rows[mode] = measure(argv)
            rate = row["steps"] / row["seconds"]
            print(
                f"{label:<20}{mode:<12}{row['steps']:>8}{row['seconds']:>10.2f}{rate:>10.0f}{row['cpu']:>8.1f}"
                f"{row['peak_mib']:>14.0f}"
            )
        seq, pool = rows["sequential"], rows["pool"]
        if (seq["steps"], seq["reward"]) != (pool["steps"], pool["reward"]):
            raise SystemExit(f"the modes disagree: {seq} vs {pool}")
        print(
            f"{'':<20}{'pool/seq':<12}{'':>8}{'':>10}{seq['seconds'] / pool['seconds']:>9.2f}x"
            f"{pool['cpu'] / seq['cpu']:>7.2f}x{pool['peak_mib'] / seq['peak_mib']:>13.2f}x"
        )


if __name__ == "__main__":
    main()
