"""Training throughput of asynchronous runs (``train.async_staleness: 1``) against synchronous ones.

    python benchmarks/async_throughput.py [--rounds 2] [--iterations 4] [--step-ms 20] [key=value ...]
    .venv-openrlhf/bin/python benchmarks/async_throughput.py --backend openrlhf

Trains a CPU config synchronously and asynchronously in alternation, same seed, each run its own
``python -m hgpo_train`` process: the demo config (the tiny model, the local backend) or, with
``--backend openrlhf``, the OpenRLHF CPU stack's config (vLLM, DeepSpeed, Ray). Each on (a) Rooms
as it is and (b) Rooms whose every step first waits ``--step-ms`` (what a web or simulator env
costs; ``SlowStep`` of ``pool_throughput.py``), with per-episode agent loops. The first iteration
of a run warms up and is left out. From each run's ``metrics.jsonl`` it prints, per env and mode:
env steps per second of training (steps trained over the iterations' wall time), the share of
that time no rollout was running (the generator or engines idle) and the share the trainer
waited (for a rollout, or for a sync to wait for one), and one line per env ``speedup: X.XX``
(async over sync, the median of paired rounds).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent
REPO = BENCHMARKS.parent
sys.path.insert(0, str(REPO))  # run from a checkout

from agent_loop_throughput import compared_envs, report

CONFIGS = {"local": "configs/rooms_demo.yaml", "openrlhf": "configs/openrlhf_rooms_cpu.yaml"}
MODES = {"sync": 0, "async": 1}


def measure(backend: str, overrides: list[str]) -> tuple[float, float, float]:
    """One run's (env steps per second, share with no rollout running, share the trainer waited),
    its first iteration left out."""
    with tempfile.TemporaryDirectory() as run_dir:
        command = [sys.executable, "-m", "hgpo_train", "--backend", backend, "--config", CONFIGS[backend]]
        command += [*overrides, f"train.output_dir={run_dir}"]
        path = os.pathsep.join(filter(None, [str(REPO), str(BENCHMARKS), os.environ.get("PYTHONPATH")]))
        done = subprocess.run(
            command,
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": path},
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
        lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    return run_shares([r for r in map(json.loads, lines) if "rollout/step_samples" in r][1:])


def run_shares(records: list[dict[str, float]]) -> tuple[float, float, float]:
    """Over these iterations' records: env steps per second, the share of the wall time with no
    rollout running, and the share the trainer waited (for a rollout, or a sync for one)."""
    wall = sum(r["time/iteration_s"] for r in records)
    steps = sum(r["rollout/step_samples"] for r in records)
    rolling = sum(r["time/rollout_s"] for r in records)
    waiting = sum(r["time/rollout_wait_s"] + r["time/sync_s"] for r in records)
    return steps / wall, max(0.0, 1 - rolling / wall), waiting / wall


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--backend", choices=sorted(CONFIGS), default="local")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=4, help="per run, the first one a warm-up")
    parser.add_argument("--step-ms", type=float, default=20.0, help="the wait before each step of env (b)")
    parser.add_argument("overrides", nargs="*", help="section.field=value, on top of the config")
    args = parser.parse_args(argv)
    envs = compared_envs(args.step_ms)
    envs[f"rooms + {args.step_ms:g} ms wait"].append("env.num_workers=8")  # sleeping steps cost no CPU
    common = [
        "generation.agent_loop=per_episode",
        f"train.iterations={args.iterations}",
        "train.eval_every=0",
        "train.save_every=0",
        "logging.progress_bar=false",
        "logging.tensorboard=false",
    ]
    if args.backend == "local":
        common.append("generation.batch_size=32")  # half the demo's envs per call
    print(
        f"{args.backend} backend, config {CONFIGS[args.backend]} {' '.join(args.overrides)}; "
        f"{args.rounds} paired rounds of {args.iterations} iterations"
    )
    for label, env_overrides in envs.items():
        results: dict[str, list[tuple[float, float, float]]] = {mode: [] for mode in MODES}
        for _ in range(args.rounds):
            for mode, staleness in MODES.items():
                overrides = [*common, *env_overrides, *args.overrides, f"train.async_staleness={staleness}"]
                results[mode].append(measure(args.backend, overrides))
        print(f"\n({label})")
        report(results, ["no rollout running", "trainer waiting"], baseline="sync", candidate="async")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
