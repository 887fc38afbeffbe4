"""The memory study: window, compaction and notes on HGPO-Corridor-v0, where the window forgets,
compaction with its summary turns left out of the update (CompactionRL's ablation), and a window
long enough to show the whole episode (the control: the fact in the prompt, no memory to learn);
3 training seeds each, on CPU.

    python scripts/memory_study.py                  # every run, then docs/memory_study.json
    python scripts/memory_study.py --summary-only   # the table from the runs already finished
    python scripts/memory_study.py --iterations 100 --out longer.json   # the runs continued

Every arm gets the same budget (configs/corridor_memory.yaml): the same iterations of the same
groups x rollouts, the same seeds, model, K and decoding (choice-constrained: a summary turn
keeps one fact it was shown, a notes reply one note with its command). Only the memory differs.
Each run is evaluated every 50 iterations (the table: after its last update, ``--iterations``)
with 32 samples of each task at temperature 1; a longer budget continues the same runs. The table is :mod:`hgpo_train.evaluation.compare` over those results files: mean ± sd over seeds and the
paired difference against the window with a 95 % bootstrap interval. Runs live in
``runs/memory_study/<arm>_seed<s>``; a finished run is not redone, a killed one resumes.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from demo_curves import ROOT, train

from hgpo_train.evaluation.compare import comparison_table, labels, load_result, markdown

CONFIG = "configs/corridor_memory.yaml"
EVAL_EVERY, SAVE_EVERY = 50, 25
ARMS = {  # arm: its overrides of the config (the window's)
    "window": [],
    "whole-window": ["env.history_length=3"],  # every step of an episode that reaches the vault
    "compaction": ["env.memory=compaction", "env.compact_every=2"],
    "compaction-masked": ["env.memory=compaction", "env.compact_every=2", "update.train_summaries=false"],
    "notes": ["env.memory=notes"],
}


def results_file(arm: str, seed: int, iterations: int) -> Path:
    return ROOT / "runs" / "memory_study" / f"{arm}_seed{seed}" / "evals" / f"iter_{iterations:06d}.json"


def run(arm: str, seed: int, iterations: int) -> None:
    overrides = [
        *ARMS[arm],
        f"train.iterations={iterations}",
        f"train.eval_every={EVAL_EVERY}",
        f"train.save_every={SAVE_EVERY}",
        f"train.seed={seed}",
        "logging.progress_bar=false",
        "logging.tensorboard=false",
    ]
    train(CONFIG, "hgpo", str(results_file(arm, seed, iterations).parents[1]), overrides)


def table(seeds: list[int], iterations: int) -> dict:
    """The comparison of the finished runs, with each row's training success and memory metrics
    over its last iterations."""
    files = [results_file(arm, seed, iterations) for seed in seeds for arm in ARMS]
    files = [f for f in files if f.is_file()]
    results = [load_result(f) for f in files]
    compared = comparison_table(results, baseline=labels(results)[0])
    by_row: dict[str, list[Path]] = {}
    for result, row_name in zip(results, labels(results)):
        by_row.setdefault(row_name, []).append(result.path.parents[1])
    for row_name, row in compared["methods"].items():
        row["training"] = [_last_iterations(folder, iterations) for folder in by_row[row_name]]
    return compared


def _last_iterations(folder: Path, iterations: int, window: int = 5) -> dict[str, float]:
    """A run's training success and memory metrics, mean over its ``window`` iterations up to
    ``iterations``."""
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    last = {row["iteration"]: row for row in rows if "rollout/success_rate" in row}
    tail = [last[i] for i in sorted(last) if i <= iterations][-window:]
    names = {name for row in tail for name in row if name.startswith(("rollout/success", "memory/"))}
    return {name: sum(row.get(name, 0.0) for row in tail) / len(tail) for name in sorted(names)}


def probe(arm: str, seed: int, iterations: int, samples: int = 64) -> dict[str, float]:
    """Whether a compaction run's last policy writes and reads its memory: over both tasks, the
    share of its summaries (sampled at the first summary turn) that keep the sign, and the share
    of right keys at the vault when its summary is the sign."""
    import gymnasium as gym
    import torch

    from hgpo_train.config import load_config
    from hgpo_train.rollout.constrained import reply_choices
    from hgpo_train.update.policy import build_generator, load_run_policy

    folder = results_file(arm, seed, iterations).parents[1]
    config = load_config(folder / "config.yaml")
    checkpoint = folder / "checkpoints" / f"iter_{iterations:06d}"
    policy = load_run_policy(config, folder, torch.device("cpu"), checkpoint)
    generator = build_generator(config, policy, training=False)
    env_kwargs = {**config.env.memory_kwargs, **config.env.kwargs}
    kept = right = 0
    for task in (0, 1):
        env = gym.make(config.env.env_id, response_format="plain", history_length=1, **env_kwargs)
        prompt, info = env.reset(options={"task_id": task})
        while info["turn"] != "summary":
            prompt, *_, info = env.step("go east")
        sign = next(fact for fact in info["admissible_actions"] if "sign" in fact)
        torch.manual_seed(seed)
        summaries = generator.generate([prompt] * samples, [reply_choices(info, "plain")] * samples, 1.0)
        kept += sum(g.text == sign for g in summaries)
        prompt, *_, info = env.step(sign)
        while "vault door" not in info["state_text"]:
            prompt, *_, info = env.step("go east")
        uses = generator.generate([prompt] * samples, [reply_choices(info, "plain")] * samples, 1.0)
        right += sum(g.text == f"use {('red', 'blue')[task]} key" for g in uses)
    return {"sign_kept": kept / (2 * samples), "right_key_given_the_sign": right / (2 * samples)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--iterations", type=int, default=50, help="a multiple of 50")
    parser.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS))
    parser.add_argument("--summary-only", action="store_true", help="only tabulate the finished runs")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "memory_study.json")
    args = parser.parse_args(argv)
    if args.iterations % EVAL_EVERY:
        parser.error(
            f"--iterations must be a multiple of {EVAL_EVERY} (the runs evaluate every {EVAL_EVERY})"
        )
    if not args.summary_only:
        for seed in args.seeds:  # seed by seed, so a table cut short is still paired
            for arm in args.arms:
                if not results_file(arm, seed, args.iterations).is_file():
                    run(arm, seed, args.iterations)
    compared = table(args.seeds, args.iterations)
    for arm in ("compaction", "compaction-masked"):
        probes = [probe(arm, seed, args.iterations) for seed in args.seeds]
        compared["probes"] = {**compared.get("probes", {}), arm: probes}
        print(f"{arm}: per seed {probes}")
    args.out.write_text(json.dumps(compared, indent=1))
    print(f"\n### HGPO-Corridor-v0 ({args.iterations} iterations)\n\n{markdown(compared)}")
    for row_name, row in compared["methods"].items():
        print(f"{row_name}: last 5 iterations per seed {row['training']}")
    print(f"\ntable: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
