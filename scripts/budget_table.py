"""A budget-matched table: GRPO, GiGPO, HGPO, GraphGPO, G2PO and CRBC (and its K = 0 member) on three
envs, and MVPO against GiGPO, HGPO and CRBC where every rollout fails early; 3 training seeds each, on CPU.

    python scripts/budget_table.py                  # every run, then docs/budget_table.json
    python scripts/budget_table.py --summary-only   # the table from the runs already finished
    python scripts/budget_table.py --methods grpo crbc --settings rooms-hidden --out crbc.json  # a part
    python scripts/budget_table.py --settings rooms-locked --out docs/budget_table_mvpo.json  # MVPO's

Within one env every method gets the same budget: the same iterations of the same groups x
rollouts (so the same episodes and the same number of updates, one per iteration with the same
mini-batch size), the same seeds, the same model, prompt (K = 2) and decoding. Only
``advantage.estimator`` differs (GraphGPO with its graph returns' base 0.1, as in the estimator
study; ``crbc-k0`` is CRBC at depth 0). Env steps are not fixed (episodes end when won), so each method's mean is reported.

* ``rooms-shown``: Rooms from configs/rooms_demo.yaml with ``show_carried``: observations show what
  the agent carries (the study's control; what lies in other rooms stays hidden).
* ``rooms-hidden``: the same Rooms as it is, where what the agent carries is not shown (the
  study's hidden-state setting).
* ``twx-coin``: TextWorld-Express's coin game (real game text, 5 locations with doors) from
  configs/textworld_express_coin_demo.yaml, 4 groups x 8 rollouts per iteration (its prompts are
  4-5 times Rooms', so half the groups keeps a run near a Rooms run's time).
* ``rooms-locked``: the shown Rooms with a locked door in every house and 15 steps, 30 iterations x
  4 groups x 8 rollouts, where about three task groups in four fail on every rollout at the start
  (random play wins 4 % of episodes):
  MVPO, GiGPO, HGPO and CRBC, against GiGPO (the estimator MVPO changes only where a group's
  returns are all equal).

Every row also reports the zero-credit share (the steps whose advantage is exactly 0, and the task
groups whose rollouts all failed, over the first five iterations and over the run) and, per seed,
the first iteration at which the training success rate, averaged over five iterations, reached
:data:`REACH`.

Every run is evaluated once, after its last update, on its env's panel (the first 64 tasks of the
eval split, a manifest written to ``runs/budget/<env>.panel.json`` and checked by every
evaluation) with 4 samples per task at temperature 1: pass@1 (the success rate), pass@2, pass@4.
The table is :mod:`hgpo_train.evaluation.compare` over those results files: mean ± sd over seeds and the
paired difference against GRPO with a 95 % bootstrap interval. Runs live in
``runs/budget/<env>_<method>_seed<s>``; a finished run is not redone, a killed one resumes.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from demo_curves import ROOT, train

from hgpo_env.tools.panel import build_panel
from hgpo_train.config import load_config
from hgpo_train.evaluation.compare import comparison_table, labels, load_result, markdown

METHODS = {  # method: its advantage.estimator and the overrides besides
    "grpo": ("grpo", []),
    "gigpo": ("gigpo", []),
    "hgpo": ("hgpo", []),
    "graphgpo": ("graphgpo", ["advantage.gamma=0.1"]),
    "g2po": ("g2po", []),  # its released code's settings
    "crbc": ("crbc", []),  # its paper's defaults: the closure, beta 0.98, w_S 5
    "crbc-k0": ("crbc", ["advantage.crbc.depth=0"]),  # its finite-depth member at K = 0
    "mvpo": ("mvpo", []),  # its paper's ALFWorld settings (omega 0.5, kappa_min 0.05)
}
BASE_METHODS = ("grpo", "gigpo", "hgpo", "graphgpo", "g2po", "crbc", "crbc-k0")
REACH = 0.25
"""The training success rate (a five-iteration mean) whose first iteration each run reports."""
WINDOW = 5
PANEL_TASKS = 64
SAMPLES_PER_TASK = 4


@dataclass(frozen=True)
class Setting:
    name: str
    config: str
    iterations: int
    overrides: tuple[str, ...] = ()
    methods: tuple[str, ...] = BASE_METHODS
    baseline: str = "grpo"


SETTINGS = [
    Setting("rooms-shown", "configs/rooms_demo.yaml", 40, ("env.kwargs={show_carried: true}",)),
    Setting("rooms-hidden", "configs/rooms_demo.yaml", 40),
    Setting(
        "twx-coin",
        "configs/textworld_express_coin_demo.yaml",
        12,
        (
            "env.kwargs={game_params: 'numLocations=5,includeDoors=1,numDistractorItems=0'}",
            "env.num_groups=4",  # its prompts are 4-5x Rooms': half the groups keeps a run near Rooms' time
        ),
    ),
    Setting(
        "rooms-locked",
        "configs/rooms_demo.yaml",
        30,
        (
            "env.kwargs.show_carried=true",
            "env.kwargs.lock_probability=1.0",
            "env.max_steps=15",
            "env.num_groups=4",  # its episodes run 1.5x Rooms' steps: half the groups keeps a run near Rooms' time
        ),
        methods=("gigpo", "hgpo", "crbc", "mvpo"),
        baseline="gigpo",
    ),
]


def panel_file(setting: Setting) -> Path:
    """Write the setting's panel manifest (deterministic: the same file on every machine)."""
    config = load_config(ROOT / setting.config, list(setting.overrides))
    kwargs = {**config.env.kwargs, **config.eval.env_kwargs}
    split = kwargs.pop("split", None)
    panel = build_panel(config.env.env_id, split, range(PANEL_TASKS), kwargs)
    path = ROOT / "runs" / "budget" / f"{setting.name}.panel.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(panel.to_json(), indent=1))
    return path


def results_file(setting: Setting, method: str, seed: int) -> Path:
    return (
        ROOT
        / "runs"
        / "budget"
        / f"{setting.name}_{method}_seed{seed}"
        / "evals"
        / f"iter_{setting.iterations:06d}.json"
    )


def run(setting: Setting, method: str, seed: int, panel: Path) -> None:
    folder = results_file(setting, method, seed).parents[1]
    estimator, method_overrides = METHODS[method]
    overrides = [
        *setting.overrides,
        *method_overrides,
        f"train.iterations={setting.iterations}",
        f"train.eval_every={setting.iterations}",
        f"train.save_every={setting.iterations // 2}",
        f"train.seed={seed}",
        f"eval.tasks={list(range(PANEL_TASKS))}",
        "eval.seeds=[0]",
        f"eval.samples_per_task={SAMPLES_PER_TASK}",
        "eval.temperature=1.0",
        f"eval.panel={panel}",
        "logging.progress_bar=false",
        "logging.tensorboard=false",
    ]
    train(setting.config, estimator, str(folder), overrides)


def table(seeds: list[int]) -> dict:
    """Per setting, the comparison of the finished runs (plus each method's mean env steps)."""
    out = {}
    for setting in SETTINGS:
        files = [results_file(setting, m, s) for s in seeds for m in setting.methods]
        files = [f for f in files if f.is_file()]
        if not files:
            continue
        results = [load_result(f) for f in files]
        compared = comparison_table(results, baseline=setting.baseline)
        by_row: dict[str, list[Path]] = {}  # a row is named by compare (crbc-k0: "crbc (depth=0)")
        for result, row_name in zip(results, labels(results)):
            by_row.setdefault(row_name, []).append(result.path)
        for row_name, row in compared["methods"].items():
            runs = by_row[row_name]
            row["env_steps"] = sum(_env_steps(f.parents[1]) for f in runs) / len(runs)
            row["run_seconds"] = [round(_wall_seconds(f)) for f in runs]
            row.update(_zero_credit(f.parents[1] for f in runs))
        out[setting.name] = {"iterations": setting.iterations, **compared}
    return out


def _env_steps(folder: Path) -> int:
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    last = {row["iteration"]: row for row in rows}  # a resumed iteration counts once
    return int(sum(row.get("rollout/step_samples", 0) for row in last.values()))


def _records(folder: Path) -> list[dict]:
    """A run's training iterations in order, each once (a resumed iteration's last line)."""
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    last = {row["iteration"]: row for row in rows if "rollout/success_rate" in row}
    return [last[i] for i in sorted(last)]


def _zero_credit(folders: Iterable[Path]) -> dict[str, object]:
    """The share of steps with exactly zero advantage and of all-fail task groups (over the first
    :data:`WINDOW` iterations and the whole run, mean over runs), and each run's first iteration
    whose training success, averaged over :data:`WINDOW` iterations, reached :data:`REACH`."""
    runs = [_records(folder) for folder in folders]
    out: dict[str, object] = {}
    for name in ("advantage/exact_zero_share", "rollout/all_fail_groups"):
        label = name.split("/")[1]
        out[f"{label}_start"] = float(np.mean([[r[name] for r in run[:WINDOW]] for run in runs]))
        out[f"{label}_run"] = float(np.mean([np.mean([r[name] for r in run]) for run in runs]))
    reached = []
    for run in runs:
        success = np.convolve([r["rollout/success_rate"] for r in run], np.ones(WINDOW) / WINDOW, "valid")
        hits = np.flatnonzero(success >= REACH)
        reached.append(int(run[hits[0] + WINDOW - 1]["iteration"]) if len(hits) else None)
    out["iteration_reaching"] = reached
    return out


def _wall_seconds(results: Path) -> float:
    """A run's wall time: from its tiny model (built first) to its results file (written last)."""
    return results.stat().st_mtime - (results.parents[1] / "tiny_model").stat().st_mtime


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--methods", nargs="+", choices=list(METHODS), default=list(METHODS))
    parser.add_argument(
        "--settings", nargs="+", choices=[s.name for s in SETTINGS], default=[s.name for s in SETTINGS]
    )
    parser.add_argument("--summary-only", action="store_true", help="only tabulate the finished runs")
    parser.add_argument(
        "--out", type=Path, default=ROOT / "docs" / "budget_table.json", help="the table's file"
    )
    args = parser.parse_args(argv)
    if not args.summary_only:
        panels = {setting.name: panel_file(setting) for setting in SETTINGS if setting.name in args.settings}
        for seed in args.seeds:  # seed by seed, so a table cut short is still balanced
            for setting in (s for s in SETTINGS if s.name in args.settings):
                for method in (m for m in args.methods if m in setting.methods):
                    if not results_file(setting, method, seed).is_file():
                        run(setting, method, seed, panels[setting.name])
    settings = table(args.seeds)
    seconds = sum(sum(row["run_seconds"]) for done in settings.values() for row in done["methods"].values())
    out = args.out
    out.write_text(json.dumps({"run_seconds_total": seconds, "settings": settings}, indent=1))
    for name, compared in settings.items():
        print(f"\n### {name} ({compared['iterations']} iterations)\n\n{markdown(compared)}")
        steps = ", ".join(f"{m} {row['env_steps']:.0f}" for m, row in compared["methods"].items())
        print(f"\nmean env steps per run: {steps}")
        for method, row in compared["methods"].items():
            print(
                f"{method}: exact-zero steps {row['exact_zero_share_start']:.2f} (first {WINDOW} iterations), "
                f"{row['exact_zero_share_run']:.2f} (run); all-fail groups {row['all_fail_groups_start']:.2f}, "
                f"{row['all_fail_groups_run']:.2f}; success {REACH} reached at {row['iteration_reaching']}"
            )
    print(f"\ntable: {out} ({seconds / 60:.0f} min of runs, one after another)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
