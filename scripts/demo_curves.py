"""Run the CPU demo once per estimator, backend and seed, and plot the learning curves in one figure.

    python scripts/demo_curves.py [--config configs/rooms_demo.yaml] [--estimators hgpo gigpo grpo]
                                  [--seeds 0 1 2] [--out docs/rooms_demo_curves.png] [key=value ...]
    .venv-openrlhf/bin/python scripts/demo_curves.py --config configs/openrlhf_rooms_demo.yaml \
        --estimators hgpo --backends local openrlhf --out docs/openrlhf_demo_curves.png

Every run uses the same seeds (``train.seed``: model initialisation, tasks, sampling), in
``<train.output_dir>_<estimator>_seed<seed>`` (``..._<backend>_seed<seed>`` for the OpenRLHF
backend); a finished run is resumed (so not redone), a killed one continues. The figure shows,
per estimator and backend, the mean over seeds and the min-max band of the training success rate
per iteration and of the success rate on the fixed evaluation tasks; a JSON summary is written
next to it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout

from hgpo_train.config import load_config
from hgpo_train.run.tracking import read_metrics


def train(config: str, estimator: str, output_dir: str, overrides: list[str], backend: str = "local") -> Path:
    """One demo run through the public command line (exactly what a user would type)."""
    command = [
        sys.executable,
        "-m",
        "hgpo_train",
        "--backend",
        backend,
        "--config",
        config,
        *overrides,
        f"advantage.estimator={estimator}",
        f"train.output_dir={output_dir}",
    ]
    print("$", " ".join(command[1:]), flush=True)
    subprocess.run(command, check=True, cwd=ROOT)
    return Path(output_dir) / "metrics.jsonl"


def _band(runs: list[list[dict]], key: str) -> tuple[list[int], np.ndarray]:
    """Iterations where every run logged ``key``, and the (runs, iterations) values there."""
    per_run = [{r["iteration"]: r[key] for r in records if key in r} for records in runs]
    iterations = sorted(set.intersection(*(set(p) for p in per_run)))
    return iterations, np.array([[p[i] for i in iterations] for p in per_run])


def plot(curves: dict[str, list[list[dict]]], out: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for estimator, runs in curves.items():
        for ax, key, marker in ((left, "rollout/success_rate", None), (right, "eval/success_rate", "o")):
            iterations, values = _band(runs, key)
            line = ax.plot(iterations, values.mean(axis=0), marker=marker, label=f"{estimator} (mean)")[0]
            ax.fill_between(
                iterations, values.min(axis=0), values.max(axis=0), color=line.get_color(), alpha=0.2
            )
    left.set(title="training episodes", xlabel="iteration", ylabel="success rate")
    right.set(title="fixed eval tasks (held out)", xlabel="iteration", ylabel="success rate")
    for ax in (left, right):
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("\n".join(textwrap.wrap(title, 140)), fontsize=9)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)


def summarise(runs: dict[int, list[dict]]) -> dict:
    """Eval success per seed and iteration, and the final one's mean and spread over seeds."""
    evals = {
        seed: {r["iteration"]: r["eval/success_rate"] for r in records if "eval/success_rate" in r}
        for seed, records in runs.items()
    }
    final = np.array([e[max(e)] for e in evals.values()])
    return {
        "eval_success_after": {
            "mean": float(final.mean()),
            "min": float(final.min()),
            "max": float(final.max()),
        },
        "eval": evals,
        "seconds": {
            seed: sum(r.get("time/iteration_s", 0.0) for r in records) for seed, records in runs.items()
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", default="configs/rooms_demo.yaml")
    parser.add_argument("--estimators", nargs="+", default=["hgpo", "gigpo", "grpo"])
    parser.add_argument("--backends", nargs="+", choices=["local", "openrlhf"], default=["local"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "rooms_demo_curves.png")
    parser.add_argument("overrides", nargs="*", help="section.field=value, applied to every run")
    args = parser.parse_args(argv)

    base = load_config(ROOT / args.config, args.overrides)
    labels = {
        (e, b): e if args.backends == ["local"] else f"{e}, {b}"
        for e in args.estimators
        for b in args.backends
    }
    runs: dict[str, dict[int, list[dict]]] = {label: {} for label in labels.values()}
    for seed in args.seeds:  # seed by seed: a run cut short still leaves every curve comparable
        for (estimator, backend), label in labels.items():
            suffix = "" if backend == "local" else f"_{backend}"
            output_dir = f"{base.train.output_dir}_{estimator}{suffix}_seed{seed}"
            overrides = [*args.overrides, f"train.seed={seed}"]
            runs[label][seed] = read_metrics(train(args.config, estimator, output_dir, overrides, backend))
    command = "python scripts/demo_curves.py --config " + args.config
    command += " --estimators " + " ".join(args.estimators)
    if args.backends != ["local"]:
        command += " --backends " + " ".join(args.backends)
    command += " --seeds " + " ".join(map(str, args.seeds)) + "".join(f" {o}" for o in args.overrides)
    seeds = ", ".join(map(str, args.seeds))
    plot(
        {e: list(r.values()) for e, r in runs.items()},
        args.out,
        f"Rooms CPU demo, tiny model from scratch, seeds {seeds}: {command}",
    )
    summary = {label: summarise(r) for label, r in runs.items()}
    args.out.with_suffix(".json").write_text(json.dumps({"command": command, "runs": summary}, indent=2))
    print(json.dumps(summary, indent=2))
    print(f"plot: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
