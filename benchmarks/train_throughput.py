"""Trainer throughput on the CPU with the tiny model: rollout speed, update time, where time goes.

    python benchmarks/train_throughput.py [--config configs/rooms_demo.yaml] [--iterations 3] [key=value ...]

Runs full training iterations (rollout, advantages, PPO update) of the given config in a
temporary run folder and reports, per iteration: rollout steps/s and tokens/s (prompt + response
tokens through generation), update seconds, and the share of the iteration spent in the envs,
in generation, in the advantage estimator and in the update. The first iteration is reported
but left out of the means (it warms up allocators and worker processes).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from hgpo_train.config import load_config
from hgpo_train.local.train import Trainer

PARTS = ("time/env_s", "time/generate_s", "time/advantage_s", "time/update_s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--config", default=str(Path(__file__).resolve().parents[1] / "configs" / "rooms_demo.yaml")
    )
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("overrides", nargs="*", help="section.field=value")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as run_dir:
        overrides = [
            *args.overrides,
            f"train.output_dir={run_dir}",
            "logging.progress_bar=false",
            "logging.tensorboard=false",
            "train.eval_every=0",
        ]
        config = load_config(args.config, overrides)
        trainer = Trainer(config)
        rows = []
        try:
            for iteration in range(args.iterations):
                start = time.perf_counter()
                result = trainer.run_iteration(iteration)
                batch, metrics = result.batch, result.metrics
                total = time.perf_counter() - start
                rows.append(
                    {
                        "steps": len(batch),
                        "tokens": int(batch.prompt_lengths.sum() + batch.response_lengths.sum()),
                        "total_s": total,
                        **{part: metrics[part] for part in PARTS},
                        "steps_per_s": metrics["throughput/steps_per_s"],
                        "tokens_per_s": metrics["throughput/tokens_per_s"],
                    }
                )
        finally:
            trainer.close()

    print(f"config {args.config} {' '.join(args.overrides)}")
    print(
        f"{config.env.num_groups} groups x {config.env.group_size} rollouts, "
        f"model {config.model.name_or_path}, constrained={config.generation.constrained}"
    )
    header = (
        f"{'iter':>4} {'steps':>6} {'tokens':>8} {'total s':>8} {'steps/s':>8} {'tok/s':>8} {'update s':>9}  "
        + "  ".join(f"{p.split('/')[1][:-2]:>9}" for p in PARTS)
    )
    print(header)
    for i, row in enumerate(rows):
        shares = "  ".join(f"{100 * row[p] / row['total_s']:8.1f}%" for p in PARTS)
        print(
            f"{i:>4} {row['steps']:>6} {row['tokens']:>8} {row['total_s']:>8.1f} {row['steps_per_s']:>8.1f} "
            f"{row['tokens_per_s']:>8.0f} {row['time/update_s']:>9.1f}  {shares}"
        )
    measured = rows[1:] or rows
    mean = {key: float(np.mean([r[key] for r in measured])) for key in measured[0]}
    shares = "  ".join(f"{100 * mean[p] / mean['total_s']:8.1f}%" for p in PARTS)
    print(
        f"mean {mean['steps']:>6.0f} {mean['tokens']:>8.0f} {mean['total_s']:>8.1f} "
        f"{mean['steps_per_s']:>8.1f} {mean['tokens_per_s']:>8.0f} {mean['time/update_s']:>9.1f}  {shares}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
