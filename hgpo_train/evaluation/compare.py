"""The table papers print, from evaluation results: methods over training runs, on one panel.

    python -m hgpo_train compare results/*.json [--baseline grpo] [--markdown]

Each file is the output of ``python -m hgpo_train eval --output`` for one trained run. Runs are
grouped by method: the run's ``advantage.estimator``, and where runs of one estimator differ in
its settings or K, those settings too (``hgpo (history_length=2)`` and ``hgpo
(history_length=4)`` are two rows). Per method the table gives the success rate
(pass@1), the score and the success per task type as mean ± sd over its runs. Methods whose runs
share training seeds with the baseline's also get the paired difference (per seed, method minus
baseline) with a 95 % percentile-bootstrap interval. Results made on different panels (other
tasks) or with other sampling settings are refused: their numbers do not compare.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

BOOTSTRAP = 10_000
"""Resamples of a bootstrap interval."""


class CompareError(ValueError):
    """Results that do not compare: other panels, other settings, missing fields."""


def bootstrap_interval(values: Sequence[float], seed: int = 0) -> tuple[float, float, float]:
    """Mean and 95 % percentile-bootstrap interval of the mean of ``values``."""
    data = np.asarray(values, dtype=float)
    means = np.random.default_rng(seed).choice(data, size=(BOOTSTRAP, len(data))).mean(axis=1)
    low, high = np.percentile(means, [2.5, 97.5])
    return float(data.mean()), float(low), float(high)


@dataclass(frozen=True)
class RunResult:
    """One trained run's evaluation; ``method_settings``: K and the estimator's settings (none in
    files written before they were recorded)."""

    path: Path
    method: str
    seed: int
    metrics: dict[str, float]
    panel: str
    settings: dict[str, Any]
    method_settings: dict[str, Any] = field(default_factory=dict)


def load_result(path: Path) -> RunResult:
    try:
        data = json.loads(path.read_text())
        run = data["run"]
        return RunResult(
            path,
            run["method"],
            int(run["train_seed"]),
            data["metrics"],
            data["panel"]["sha256"],
            data["settings"],
            dict(run.get("method_settings", {})),
        )
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise CompareError(
            f"{path}: not an evaluation result of python -m hgpo_train eval ({error!r})"
        ) from None


def labels(results: Sequence[RunResult]) -> list[str]:
    """Each result's row: its method, with the settings in which that method's runs differ."""
    varying: dict[str, list[str]] = {}
    for method in {r.method for r in results}:
        runs = [r.method_settings for r in results if r.method == method]
        keys = sorted({key for settings in runs for key in settings})
        varying[method] = [k for k in keys if len({json.dumps(s.get(k)) for s in runs}) > 1]
    return [
        r.method
        if not varying[r.method]
        else f"{r.method} ({', '.join(f'{k}={r.method_settings.get(k)}' for k in varying[r.method])})"
        for r in results
    ]


def check_comparable(results: Sequence[RunResult], rows: Sequence[str]) -> None:
    """One panel and one set of sampling settings for all, and one result per (row, seed)."""
    first = results[0]
    for result in results[1:]:
        if result.panel != first.panel:
            raise CompareError(
                f"{result.path} was evaluated on another panel than {first.path} "
                f"({result.panel[:12]} vs {first.panel[:12]}): other tasks"
            )
        if result.settings != first.settings:
            raise CompareError(
                f"{result.path} was sampled with other settings than {first.path}: "
                f"{result.settings} vs {first.settings}"
            )
    seen: dict[tuple[str, int], Path] = {}
    for result, row in zip(results, rows):
        key = (row, result.seed)
        if key in seen:
            raise CompareError(f"{seen[key]} and {result.path} are both {row} seed {result.seed}")
        seen[key] = result.path


def comparison_table(results: Sequence[RunResult], baseline: str | None = None) -> dict[str, Any]:
    """Per method (row): runs, mean and sd of every metric over runs, and the paired difference of
    the success rate against ``baseline`` (a row, or a method with one row; default: the first)
    over shared seeds."""
    if not results:
        raise CompareError("no results to compare")
    rows = labels(results)
    check_comparable(results, rows)
    by_method: dict[str, dict[int, dict[str, float]]] = defaultdict(dict)
    for result, row in zip(results, rows):
        by_method[row][result.seed] = result.metrics
    baseline = baseline or next(iter(by_method))
    if baseline not in by_method:
        named = sorted({row for result, row in zip(results, rows) if result.method == baseline})
        if not named:
            raise CompareError(f"baseline {baseline!r} has no results; methods: {sorted(by_method)}")
        if len(named) > 1:
            raise CompareError(f"baseline {baseline!r} is {len(named)} rows: name one of {named}")
        baseline = named[0]
    table: dict[str, Any] = {"panel": results[0].panel, "baseline": baseline, "methods": {}}
    for method, runs in by_method.items():
        names = sorted(set.intersection(*(set(m) for m in runs.values())))
        row: dict[str, Any] = {"runs": len(runs), "seeds": sorted(runs)}
        for name in names:
            values = [runs[s][name] for s in sorted(runs)]
            row[name] = {
                "mean": float(np.mean(values)),
                "sd": float(np.std(values, ddof=1)) if len(values) > 1 else 0.0,
            }
        shared = sorted(set(runs) & set(by_method[baseline]))
        if method != baseline and shared:
            differences = [runs[s]["success_rate"] - by_method[baseline][s]["success_rate"] for s in shared]
            mean, low, high = bootstrap_interval(differences)
            row["paired_difference"] = {"mean": mean, "low": low, "high": high, "seeds": shared}
        table["methods"][method] = row
    return table


def markdown(table: dict[str, Any]) -> str:
    """The table as Markdown: success, pass@k and score per method, the paired difference, then per type."""
    baseline = table["baseline"]
    names = {name for row in table["methods"].values() for name in row}
    types = sorted(name for name in names if name.startswith("success_rate/"))
    passes = sorted((name for name in names if name.startswith("pass@")), key=lambda n: int(n[5:]))
    lines = [
        f"| method | runs | success | {' | '.join(passes + [''])}score | success − {baseline} (95 % CI) |",
        "|---|---|---|" + "---|" * len(passes) + "---|---|",
    ]
    for method, row in table["methods"].items():
        paired = row.get("paired_difference")
        difference = f"{paired['mean']:+.3f} [{paired['low']:+.3f}, {paired['high']:+.3f}]" if paired else "–"
        at_k = "".join(f"{_mean_sd(row, name)} | " for name in passes)
        lines.append(
            f"| {method} | {row['runs']} | {_mean_sd(row, 'success_rate')} | {at_k}{_mean_sd(row, 'score')} "
            f"| {difference} |"
        )
    if types:
        lines += ["", "| method | " + " | ".join(t.split("/", 1)[1] for t in types) + " |"]
        lines.append("|---|" + "---|" * len(types))
        for method, row in table["methods"].items():
            lines.append(f"| {method} | " + " | ".join(_mean_sd(row, t) for t in types) + " |")
    return "\n".join(lines)


def _mean_sd(row: dict[str, Any], name: str) -> str:
    value = row.get(name)
    return f"{value['mean']:.3f} ± {value['sd']:.3f}" if value else "–"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hgpo_train compare",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("results", nargs="+", type=Path, help="results files of python -m hgpo_train eval")
    parser.add_argument(
        "--baseline",
        help="the method (or row) paired differences are taken against (default: the first)",
    )
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown, not JSON")
    args = parser.parse_args(argv)
    try:
        table = comparison_table([load_result(path) for path in args.results], args.baseline)
    except CompareError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(markdown(table) if args.markdown else json.dumps(table, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
