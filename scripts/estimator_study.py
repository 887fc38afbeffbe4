"""Does HGPO learn better where contexts disagree? GRPO, GiGPO, HGPO, GraphGPO and G2PO on Rooms, same seeds.

    python scripts/estimator_study.py                      # every run, then the table and plot
    python scripts/estimator_study.py --seeds 0 1 2 3      # fewer seeds (the summary says how many)
    python scripts/estimator_study.py --summary-only       # only summarise the runs already done

Everything below was fixed before any run; every other hyper-parameter is configs/rooms_demo.yaml's
(tiny model from scratch, constrained decoding, small houses) and the same for every condition.

* ``hidden`` (Rooms as it is: what the agent carries is not shown, so equal observations follow
  different histories): K = 2 with GRPO, GiGPO, HGPO, GraphGPO and HGPO with graph returns
  (``hgpo_graph``; both graph estimators with gamma 0.1, added after the first five) and G2PO
  (added after those); K = 4 with GiGPO and HGPO. The prompt
  shows the last K steps for every estimator of that K.
* ``shown`` (control: room descriptions end with what the agent carries, so the observation
  reveals the state that history otherwise hides): K = 2 with GiGPO, HGPO, GraphGPO and G2PO
  (whose state graph and state values are built on observations, so it is the setting where their
  states are real states).

HGPO runs once per K: with constrained decoding every command is admissible, and Rooms echoes each
command in the next observation ("You take the red box."), so observation-only keys (the released
HGPO grouping) cluster steps exactly as observation-and-action keys do; the script checks this
on 300 random episodes before it trains (:func:`fingerprint_modes_agree`).

Each run trains 50 iterations of 8 groups x 8 rollouts (3,200 episodes, the same for every
estimator; the env steps they take are reported) and evaluates on 64 held-out tasks every 10
iterations. Reported per condition, over seeds: final held-out success, the area under the eval
curve (mean success over the 6 evaluations), both with 95% percentile-bootstrap intervals, the
same for the paired per-seed difference against GiGPO of the same setting and K, and the share of
batch steps whose level-k cluster mixes different prompt contexts (``context_mixed_share``).

Runs live in ``runs/study/<setting>_k<K>_<condition>_seed<s>``; a killed one resumes from its
last checkpoint. Each finished run's summary is added to ``docs/estimator_study.json`` at once, and
a run already there is never redone, so the study resumes from the committed file too. Seeds run
one after another across all conditions, so a study cut short is still balanced. Writes
``docs/estimator_study.json`` and ``docs/estimator_study.png``.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from demo_curves import ROOT, train

from hgpo_env.envs.rooms import HELD_OUT_TASKS as HELD_OUT
from hgpo_train.config import load_config
from hgpo_train.run.tracking import read_metrics

CONFIG = "configs/rooms_demo.yaml"
ITERATIONS = 50
EVAL_EVERY = 10
EVAL_TASKS = 64
BOOTSTRAP = 10_000
COLOURS = {
    "grpo": "tab:blue",
    "gigpo": "tab:orange",
    "hgpo": "tab:green",
    "graphgpo": "tab:red",
    "hgpo_graph": "tab:purple",
    "g2po": "tab:brown",
}
GRAPH_RETURNS = ["advantage.gamma=0.1"]
"""Graph returns' base, as GraphGPO's recipe sets it for ALFWorld."""
ESTIMATORS = {  # condition name: (advantage.estimator, its other overrides)
    "grpo": ("grpo", []),
    "gigpo": ("gigpo", []),
    "hgpo": ("hgpo", []),
    "graphgpo": ("graphgpo", GRAPH_RETURNS),
    "hgpo_graph": ("hgpo", ["advantage.step_return=graph", *GRAPH_RETURNS]),
    "g2po": ("g2po", []),
}
COMMON = [
    f"train.eval_every={EVAL_EVERY}",
    f"train.save_every={EVAL_EVERY}",
    f"eval.tasks={list(range(EVAL_TASKS))}",
    "eval.seeds=[0]",
    "logging.progress_bar=false",
    "logging.tensorboard=false",
]


@dataclass(frozen=True)
class Condition:
    setting: str
    k: int
    name: str

    @property
    def label(self) -> str:
        return f"{self.setting}_k{self.k}_{self.name}"

    @property
    def baseline(self) -> Condition:
        return Condition(self.setting, self.k, "gigpo")

    @property
    def estimator(self) -> str:
        return ESTIMATORS[self.name][0]

    def overrides(self, iterations: int) -> list[str]:
        out = [
            *COMMON,
            f"train.iterations={iterations}",
            f"env.history_length={self.k}",
            *ESTIMATORS[self.name][1],
        ]
        if self.setting == "shown":
            out.append("env.kwargs={show_carried: true}")
        return out


CONDITIONS = [
    *(Condition("hidden", 2, name) for name in ("grpo", "gigpo", "hgpo", "graphgpo", "hgpo_graph", "g2po")),
    *(Condition("hidden", 4, name) for name in ("gigpo", "hgpo")),
    *(Condition("shown", 2, name) for name in ("gigpo", "hgpo", "graphgpo", "g2po")),
]


def fingerprint_modes_agree(k: int = 4, episodes: int = 300) -> bool:
    """Whether both fingerprint modes partition admissible-only Rooms steps alike at every level."""
    import random

    import gymnasium as gym

    import hgpo_env  # noqa: F401

    config = load_config(ROOT / CONFIG)
    keys: dict[str, list[tuple[int, ...]]] = {}
    for mode in ("observations_actions", "observations"):
        env = gym.make(
            "HGPO-Rooms-v0",
            history_length=k,
            fingerprint_mode=mode,
            max_steps=config.env.max_steps,
            **config.env.kwargs,
        )
        rng, keys[mode] = random.Random(0), []
        for episode in range(episodes):
            _, info = env.reset(options={"task_id": HELD_OUT + episode})
            done = False
            while not done:
                keys[mode].append(tuple(info["fingerprints"]))
                _, _, terminated, truncated, info = env.step(rng.choice(info["admissible_actions"]))
                done = terminated or truncated
    for level in range(k + 1):
        first, second = {}, {}
        for a, b in zip(keys["observations_actions"], keys["observations"]):
            if first.setdefault(a[: level + 1], b[: level + 1]) != b[: level + 1]:
                return False
            if second.setdefault(b[: level + 1], a[: level + 1]) != a[: level + 1]:
                return False
    return True


def run_dir(condition: Condition, seed: int, iterations: int) -> Path:
    study = "study" if iterations == ITERATIONS else f"study_{iterations}it"
    return ROOT / "runs" / study / f"{condition.label}_seed{seed}"


def finished(path: Path, iterations: int) -> list[dict] | None:
    """The run's metrics when it reached its last iteration, else None."""
    metrics = path / "metrics.jsonl"
    if not metrics.is_file():
        return None
    records = read_metrics(metrics)
    last = max((r["iteration"] for r in records if "eval/success_rate" in r), default=-1)
    return records if last >= iterations else None


def run_summary(records: list[dict], k: int) -> dict:
    evals = {r["iteration"]: r["eval/success_rate"] for r in records if "eval/success_rate" in r}
    mixed = {
        level: float(
            np.mean(
                [r[f"grouping/level{level}/context_mixed_share"] for r in records if "grouping/rows" in r]
            )
        )
        for level in range(k + 1)
    }
    return {
        "final": evals[max(evals)],
        "auc": float(np.mean(list(evals.values()))),
        "eval": evals,
        "context_mixed_share": mixed,
        "env_steps": int(sum(r.get("rollout/step_samples", 0) for r in records)),
        "seconds": float(sum(r.get("time/iteration_s", 0.0) for r in records)),
    }


def interval(values: list[float], rng: np.random.Generator) -> dict:
    """Mean and 95% percentile-bootstrap interval over seeds."""
    data = np.asarray(values, dtype=float)
    means = rng.choice(data, size=(BOOTSTRAP, len(data))).mean(axis=1)
    low, high = np.percentile(means, [2.5, 97.5])
    return {"mean": float(data.mean()), "low": float(low), "high": float(high), "n": len(data)}


def summarise(runs: dict[str, dict[int, dict]]) -> dict:
    rng = np.random.default_rng(0)
    table = {}
    for condition in CONDITIONS:
        done = runs.get(condition.label, {})
        if not done:
            continue
        row = {metric: interval([r[metric] for r in done.values()], rng) for metric in ("final", "auc")}
        row["context_mixed_share"] = {
            level: float(np.mean([r["context_mixed_share"][level] for r in done.values()]))
            for level in range(condition.k + 1)
        }
        row["env_steps"] = float(np.mean([r["env_steps"] for r in done.values()]))
        base = runs.get(condition.baseline.label, {})
        paired = sorted(set(done) & set(base))
        if condition.name != "gigpo" and paired:
            row["vs_gigpo"] = {
                metric: interval([done[s][metric] - base[s][metric] for s in paired], rng)
                for metric in ("final", "auc")
            }
        table[condition.label] = row
    return table


def plot(runs: dict[str, dict[int, dict]], out: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = sorted({(c.setting, c.k) for c in CONDITIONS}, key=lambda p: (p[0] != "hidden", p[1]))
    fig, axes = plt.subplots(1, len(panels), figsize=(15, 4.2), sharey=True)
    rng = np.random.default_rng(0)
    for ax, (setting, k) in zip(axes, panels):
        for condition in (c for c in CONDITIONS if (c.setting, c.k) == (setting, k)):
            done = runs.get(condition.label, {})
            if not done:
                continue
            iterations = sorted(set.intersection(*(set(r["eval"]) for r in done.values())))
            values = np.array([[r["eval"][i] for i in iterations] for r in done.values()])
            bands = [interval(list(column), rng) for column in values.T]
            mean = values.mean(axis=0)
            colour = COLOURS[condition.name]
            ax.plot(iterations, mean, marker="o", color=colour, label=f"{condition.name} (n={len(done)})")
            ax.fill_between(
                iterations,
                [b["low"] for b in bands],
                [b["high"] for b in bands],
                color=colour,
                alpha=0.15,
            )
        ax.set(title=f"{setting}, K = {k}", xlabel="iteration", ylim=(0, 1))
        ax.grid(alpha=0.3)
        ax.legend()
    axes[0].set_ylabel("held-out success (mean, 95% bootstrap band)")
    fig.suptitle("\n".join(textwrap.wrap(title, 160)), fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", nargs="+", type=int, default=list(range(8)))
    parser.add_argument("--summary-only", action="store_true", help="summarise the finished runs only")
    parser.add_argument("--iterations", type=int, default=ITERATIONS, help="a smaller number is a smoke run")
    parser.add_argument("--markdown", action="store_true", help="also print the table as Markdown")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "estimator_study.png")
    args = parser.parse_args(argv)
    summary_file = args.out.with_suffix(".json")
    if not args.summary_only and not fingerprint_modes_agree():
        raise SystemExit("the two fingerprint modes group Rooms steps differently: add an hgpo-obs condition")
    runs = recorded_runs(summary_file, args.iterations)
    for seed in args.seeds:
        for condition in CONDITIONS:
            if seed in runs.get(condition.label, {}):
                continue
            path = run_dir(condition, seed, args.iterations)
            records = finished(path, args.iterations)
            if records is None and not args.summary_only:
                overrides = [*condition.overrides(args.iterations), f"train.seed={seed}"]
                train(CONFIG, condition.estimator, str(path), overrides)
                records = finished(path, args.iterations)
            if records is not None:
                runs.setdefault(condition.label, {})[seed] = run_summary(records, condition.k)
                write_summary(summary_file, runs, args.iterations)
    table = write_summary(summary_file, runs, args.iterations)
    seeds = sorted({s for done in runs.values() for s in done})
    title = f"Rooms, tiny model from scratch, {args.iterations} iterations x 64 episodes, seeds {seeds}"
    plot(runs, args.out, f"{title}: python scripts/estimator_study.py")
    print(markdown(table) if args.markdown else json.dumps(table, indent=1))
    print(f"table: {summary_file}\nplot: {args.out}")
    return 0


def markdown(table: dict) -> str:
    """The table as the docs show it: intervals in brackets, differences against GiGPO."""

    def cell(stat: dict | None, signed: bool = False) -> str:
        if stat is None:
            return "—"
        sign = "+" if signed else ""
        return f"{stat['mean']:{sign}.3f} [{stat['low']:{sign}.3f}, {stat['high']:{sign}.3f}]"

    lines = [
        "| setting | K | estimator | seeds | final success | AUC | final − GiGPO | AUC − GiGPO | mixed contexts, level 0..K | env steps |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for condition in CONDITIONS:
        row = table.get(condition.label)
        if row is None:
            continue
        paired = row.get("vs_gigpo", {})
        mixed = " / ".join(f"{row['context_mixed_share'][k]:.2f}" for k in sorted(row["context_mixed_share"]))
        lines.append(
            f"| {condition.setting} | {condition.k} | {condition.name} | {row['final']['n']} | {cell(row['final'])} "
            f"| {cell(row['auc'])} | {cell(paired.get('final'), True)} | {cell(paired.get('auc'), True)} "
            f"| {mixed} | {row['env_steps']:.0f} |"
        )
    return "\n".join(lines)


def recorded_runs(path: Path, iterations: int) -> dict[str, dict[int, dict]]:
    """Run summaries already in the study file (for the same number of iterations)."""
    if not path.is_file():
        return {}
    recorded = json.loads(path.read_text())
    if recorded.get("iterations") != iterations:
        return {}
    return {
        label: {int(seed): _int_keys(run) for seed, run in done.items()}
        for label, done in recorded["runs"].items()
    }


def _int_keys(run: dict) -> dict:
    """A run summary read back from JSON, its iteration and level keys ints again."""
    return {
        **run,
        "eval": {int(i): v for i, v in run["eval"].items()},
        "context_mixed_share": {int(k): v for k, v in run["context_mixed_share"].items()},
    }


def write_summary(path: Path, runs: dict[str, dict[int, dict]], iterations: int) -> dict:
    """Write the table and every run's summary (atomically: a kill never leaves half a file)."""
    table = summarise(runs)
    seeds = sorted({s for done in runs.values() for s in done})
    result = {"iterations": iterations, "seeds": seeds, "table": table, "runs": runs}
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_suffix(".json.tmp")
    staging.write_text(json.dumps(result, indent=1))
    staging.replace(path)
    return table


if __name__ == "__main__":
    sys.exit(main())
