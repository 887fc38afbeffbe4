"""Where an iteration's time goes on CPU: the OpenRLHF backend beside the local trainer, same config.

    bash scripts/setup_openrlhf_cpu.sh            # once: vLLM's CPU build, DeepSpeed, Ray, OpenRLHF
    .venv-openrlhf/bin/python benchmarks/openrlhf_cpu.py [--iterations 5] [--config FILE] [key=value ...]
    .venv-openrlhf/bin/python benchmarks/openrlhf_cpu.py --config configs/openrlhf_rooms_demo.yaml

Runs a config (default ``configs/openrlhf_rooms_cpu.yaml``; the learning demo is
``configs/openrlhf_rooms_demo.yaml``) three ways, one after the other, each a fresh process
with its own run folder: the OpenRLHF backend (Ray, a vLLM engine, DeepSpeed ZeRO-2 policy and
reference, gloo weight sync), and the local trainer with Hugging Face generation and with vLLM
generation (which ignore the ``openrlhf:`` section). Per iteration it reports seconds in generation,
the envs, experience making (OpenRLHF: policy and reference log-probs; local: advantages, the
log-probs are part of its update), the update, the weight sync and the engine-policy gap's
probes, the mean over iterations after the first (which warms up), and each run's start-up (wall
time less its iterations).
Ratios are against the local trainer with HF generation, measured in the same run.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from a checkout

from hgpo_train.run.tracking import read_metrics

CONFIG = REPO / "configs" / "openrlhf_rooms_cpu.yaml"
PARTS = {  # column: (OpenRLHF backend's metric, local trainer's metric)
    "generate": ("time/generate_s", "time/generate_s"),
    "env": ("time/env_s", "time/env_s"),
    "experience": ("time/make_experience_s", "time/advantage_s"),
    "update": ("time/ppo_train_s", "time/update_s"),
    "sync": ("time/broadcast_s", "time/sync_s"),
    "gap": ("time/engine_gap_s", "time/engine_gap_s"),  # the engine-policy gap's probes (backend only)
    "iteration": ("time/iteration_s", "time/iteration_s"),
}
RUNS = {  # name: extra command-line arguments
    "local, HF generate": ["generation.backend=hf"],
    "local, vLLM generate": ["generation.backend=vllm"],
    "OpenRLHF backend": ["--backend", "openrlhf"],
}


def run(name: str, config: Path, out: Path, iterations: int, overrides: list[str]) -> dict[str, float]:
    """One training run as the user starts it; its mean seconds per part and its start-up."""
    argv = [
        sys.executable,
        "-m",
        "hgpo_train",
        "--config",
        str(config),
        *RUNS[name],
        f"train.output_dir={out}",
        f"train.iterations={iterations}",
        "train.eval_every=0",
        "train.save_every=0",
        "logging.tensorboard=false",
        *overrides,
    ]
    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    if proc.returncode:
        sys.exit(f"{name} failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}")
    records = [r for r in read_metrics(out / "metrics.jsonl") if "time/iteration_s" in r]
    later = records[1:] or records
    column = 1 if "local" in name else 0
    means = {part: sum(r.get(keys[column], 0.0) for r in later) / len(later) for part, keys in PARTS.items()}
    means["startup"] = wall - sum(r["time/iteration_s"] for r in records)
    means["steps"] = sum(r.get("rollout/step_samples", 0.0) for r in later) / len(later)
    return means


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--config", type=Path, default=CONFIG)
    parser.add_argument("overrides", nargs="*", help="section.field=value, for all three runs")
    args = parser.parse_args(argv)
    if args.iterations < 2:
        sys.exit("--iterations must be at least 2 (the first one is left out of the means)")
    with tempfile.TemporaryDirectory() as tmp:
        results = {}
        for name in RUNS:
            print(f"running {name} ...", file=sys.stderr, flush=True)
            out = Path(tmp) / name.replace(" ", "_")
            results[name] = run(name, args.config, out, args.iterations, args.overrides)
    base = results["local, HF generate"]["iteration"]
    header = (
        f"{'run':22s} {'steps':>6s} "
        + " ".join(f"{p:>10s}" for p in PARTS)
        + f" {'vs HF':>6s} {'start-up':>9s}"
    )
    print(f"seconds per iteration (mean of iterations 2..{args.iterations}), {args.config.name}")
    print(header)
    for name, means in results.items():
        parts = " ".join(f"{means[p]:10.2f}" for p in PARTS)
        ratio = means["iteration"] / base
        print(f"{name:22s} {means['steps']:6.0f} {parts} {ratio:5.2f}x {means['startup']:8.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
