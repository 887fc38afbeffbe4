"""Training throughput of asynchronous runs (``train.async_staleness: 1``) against synchronous ones.

    python benchmarks/async_throughput.py [--rounds 2] [--iterations 4] [--step-ms 20] [key=value ...]

Trains the demo config (the tiny model on CPU, the local backend) synchronously and
asynchronously in alternation, same seed, on (a) Rooms as it is and (b) Rooms whose every step
first waits ``--step-ms`` (what a web or simulator env costs; ``SlowStep`` of
``pool_throughput.py``). Both use per-episode agent loops. The first iteration of each run warms
up and is left out. Prints, per env and mode, env steps per second of training (steps trained
over wall time), the generator's idle share (the wall time it was not generating) and the
trainer's (the wall time it waited for a rollout or for a sync), and one line per env
``speedup: X.XX`` (async over sync, the median of paired rounds).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from agent_loop_throughput import SLOW_ID, STEP_MS_VAR

from hgpo_train.config import load_config
from hgpo_train.train import Trainer

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "rooms_demo.yaml"
MODES = {"sync": 0, "async": 1}


def measure(overrides: list[str], iterations: int) -> tuple[float, float, float]:
    """One run's (env steps per second, generator idle share, trainer idle share), its first
    iteration left out."""
    with tempfile.TemporaryDirectory() as run_dir:
        config = load_config(CONFIG, [*overrides, f"train.output_dir={run_dir}"])
        trainer = Trainer(config)
        logged: list[tuple[float, dict[str, float]]] = []
        generating: list[tuple[float, float]] = []
        log, generate = trainer.logger.log, trainer.generator.generate

        def logging_time(done: int, metrics: dict[str, float]) -> None:
            logged.append((time.perf_counter(), metrics))
            log(done, metrics)

        def timed_generate(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return generate(*args, **kwargs)
            finally:
                generating.append((start, time.perf_counter()))

        trainer.logger.log, trainer.generator.generate = logging_time, timed_generate
        try:
            trainer.fit()
        finally:
            trainer.close()
    (begin, _), *timed = logged
    end = timed[-1][0]
    wall = end - begin
    metrics = [m for _, m in timed]
    steps = sum(m["rollout/step_samples"] for m in metrics)
    busy = sum(max(0.0, min(b, end) - max(a, begin)) for a, b in generating)
    waiting = sum(m["time/rollout_wait_s"] + m["time/sync_s"] for m in metrics)
    return steps / wall, 1 - busy / wall, waiting / wall


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=4, help="per run, the first one a warm-up")
    parser.add_argument("--step-ms", type=float, default=20.0, help="the wait before each step of env (b)")
    parser.add_argument("overrides", nargs="*", help="section.field=value, on top of configs/rooms_demo.yaml")
    args = parser.parse_args(argv)
    envs = {
        "rooms": [],
        f"rooms + {args.step_ms:g} ms wait": [
            f"env.name=agent_loop_throughput:{SLOW_ID}",
            f"env.kwargs.{STEP_MS_VAR}={args.step_ms}",
            "env.num_workers=8",  # sleeping steps cost no CPU: a worker per 8 envs
        ],
    }
    common = [
        "generation.agent_loop=per_episode",
        "generation.batch_size=32",
        f"train.iterations={args.iterations}",
        "train.eval_every=0",
        "train.save_every=0",
        "logging.progress_bar=false",
        "logging.tensorboard=false",
    ]
    print(
        f"config {CONFIG.name} {' '.join(args.overrides)}; {args.rounds} paired rounds of {args.iterations} iterations"
    )
    for label, env_overrides in envs.items():
        results: dict[str, list[tuple[float, float, float]]] = {mode: [] for mode in MODES}
        for _ in range(args.rounds):
            for mode, staleness in MODES.items():
                overrides = [*common, *env_overrides, *args.overrides, f"train.async_staleness={staleness}"]
                results[mode].append(measure(overrides, args.iterations))
        print(f"\n({label})")
        for mode, rows in results.items():
            rates = [r for r, _, _ in rows]
            print(
                f"  {mode:<6} env steps/s {statistics.median(rates):7.1f} (min {min(rates):.1f}, max {max(rates):.1f})"
                f"   generator idle {100 * statistics.mean(g for _, g, _ in rows):5.1f}%"
                f"   trainer idle {100 * statistics.mean(t for _, _, t in rows):5.1f}%"
            )
        ratios = [a[0] / s[0] for s, a in zip(results["sync"], results["async"])]
        print(f"  speedup: {statistics.median(ratios):.2f} (rounds {', '.join(f'{r:.2f}' for r in ratios)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
