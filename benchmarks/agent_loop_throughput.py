"""Rollout throughput of per-episode agent loops against lockstep turns, same model, same envs.

    python benchmarks/agent_loop_throughput.py [--rounds 4] [--step-ms 20] [key=value ...]

Plays the demo config's rollouts (the tiny model, choice-constrained, on CPU) with
``generation.agent_loop`` lockstep and per_episode in alternation, from the same task seeds, on
(a) Rooms as it is (microsecond steps) and (b) Rooms whose every step first waits ``--step-ms``
(what a web or simulator env costs; ``SlowStep`` of ``pool_throughput.py``). Both modes generate
``generation.batch_size`` prompts per call (half the envs by default). Prints, per env and mode,
env steps per second, the generator's idle share (the rollout's wall time it was not generating)
and one line per env ``speedup: X.XX`` (per_episode over lockstep, the median of paired rounds).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import gymnasium as gym

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from pool_throughput import SlowStep

from hgpo_train.config import load_config
from hgpo_train.local.train import Trainer
from hgpo_train.rollout.collect import collect_rollouts

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "rooms_demo.yaml"
SLOW_ID = "HGPO-SlowRooms-v0"
STEP_MS_VAR = "step_ms"


def slow_rooms(step_ms: float = 20.0, **kwargs: Any) -> gym.Env:
    return SlowStep(gym.make("HGPO-Rooms-v0", **kwargs), step_ms, "sleep")


if SLOW_ID not in gym.registry:  # the pool's workers import this module (agent_loop_throughput:<id>)
    gym.register(SLOW_ID, entry_point=slow_rooms)


class BusyClock:
    """The trainer's generator, with the seconds it spends generating added up."""

    def __init__(self, generator: Any) -> None:
        self.generator, self.busy_s = generator, 0.0

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return self.generator.generate(*args, **kwargs)
        finally:
            self.busy_s += time.perf_counter() - start


def measure(trainer: Trainer, rounds: int, batch_size: int) -> dict[str, list[tuple[float, float]]]:
    """Per mode, each round's (env steps per second, generator idle share)."""
    config = trainer.config
    out: dict[str, list[tuple[float, float]]] = {"lockstep": [], "per_episode": []}
    for round_ in range(rounds):
        seeds = [1000 * round_ + g for g in range(config.env.num_groups)]
        for mode, rows in out.items():
            clock = BusyClock(trainer.generator)
            start = time.perf_counter()
            batch = collect_rollouts(
                trainer.pool,
                clock,
                seeds=seeds,
                constrained=config.generation.constrained,
                response_format=config.env.response_format,
                agent_loop=mode,
                max_batch=batch_size,
            )
            wall = time.perf_counter() - start
            rows.append((len(batch) / wall, 1 - clock.busy_s / wall))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--step-ms", type=float, default=20.0, help="the wait before each step of env (b)")
    parser.add_argument("overrides", nargs="*", help="section.field=value, on top of configs/rooms_demo.yaml")
    args = parser.parse_args(argv)
    envs = compared_envs(args.step_ms)
    print(f"config {CONFIG.name} {' '.join(args.overrides)}; {args.rounds} paired rounds")
    for label, env_overrides in envs.items():
        with tempfile.TemporaryDirectory() as run_dir:
            config = load_config(
                CONFIG,
                [
                    "env.num_workers=8",  # sleeping steps cost no CPU: a worker per 8 envs
                    "generation.batch_size=32",
                    *env_overrides,
                    *args.overrides,
                    f"train.output_dir={run_dir}",
                    "logging.progress_bar=false",
                    "logging.tensorboard=false",
                ],
            )
            trainer = Trainer(config)
            try:
                collect_rollouts(
                    trainer.pool,
                    trainer.generator,
                    constrained=config.generation.constrained,
                    response_format=config.env.response_format,
                )  # warm-up
                results = measure(trainer, args.rounds, config.generation.batch_size)
            finally:
                trainer.close()
        envs_n = config.env.num_groups * config.env.group_size
        print(
            f"\n({label}) {envs_n} envs, {config.env.num_workers} workers, {config.generation.batch_size} prompts per call"
        )
        report(results, ["generator idle"], baseline="lockstep", candidate="per_episode")
    return 0


def compared_envs(step_ms: float) -> dict[str, list[str]]:
    """The two envs the throughput benchmarks compare, as config overrides by label: (a) Rooms and
    (b) Rooms whose every step first waits ``step_ms``."""
    slow = [f"env.name=agent_loop_throughput:{SLOW_ID}", f"env.kwargs.{STEP_MS_VAR}={step_ms}"]
    return {"rooms": [], f"rooms + {step_ms:g} ms wait": slow}


def report(
    results: dict[str, list[tuple[float, ...]]], shares: list[str], *, baseline: str, candidate: str
) -> None:
    """Per mode, the median env steps/s of its rounds (each round's first figure) and the mean of
    each of its ``shares`` (the figures after it); then ``candidate``'s speedup over ``baseline``,
    the median of paired rounds."""
    for mode, rows in results.items():
        rates = [row[0] for row in rows]
        shown = "".join(
            f"   {name} {100 * statistics.mean(row[k + 1] for row in rows):5.1f}%"
            for k, name in enumerate(shares)
        )
        print(
            f"  {mode:<12} env steps/s {statistics.median(rates):7.1f} "
            f"(min {min(rates):.1f}, max {max(rates):.1f}){shown}"
        )
    ratios = [c[0] / b[0] for b, c in zip(results[baseline], results[candidate])]
    print(f"  speedup: {statistics.median(ratios):.2f} (rounds {', '.join(f'{r:.2f}' for r in ratios)})")


if __name__ == "__main__":
    raise SystemExit(main())
