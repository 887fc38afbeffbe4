"""The test run's budget: each step's wall time on each line, each line's idle time, and each
suite's slowest tests, so whoever adds a test sees what it costs.

    python scripts/ci_report.py REPORT_DIR

``REPORT_DIR`` is what ``scripts/test.sh`` fills: ``timeline.tsv`` (one step a row: line, step,
start, end, exit status and the machine's CPU ticks, busy and idle, at its start and end, as
``timed`` in test.sh writes them) and a JUnit XML file per pytest
suite (``<suite>.xml``; pytest's ``--junitxml``, each test's setup, call and teardown together, so
a module's shared run counts in its first test). Standard library only: it runs in any
environment, after any failure.
"""

from __future__ import annotations

import argparse
import csv
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

BUDGET_S = 30 * 60
"""What the whole run may take on CI's 2-core machine (docs/development.md, "The test budget")."""
SLOWEST = 10


@dataclass
class Step:
    line: str
    name: str
    start: float
    end: float
    status: int
    ticks_start: tuple[int, int]
    """The machine's busy and idle CPU ticks (all cores) when the step started."""
    ticks_end: tuple[int, int]

    @property
    def wall(self) -> float:
        return self.end - self.start


def busy_share(start: tuple[int, int], end: tuple[int, int]) -> float:
    """The share of the machine's CPU time (all cores) that was busy between two readings."""
    busy, idle = end[0] - start[0], end[1] - start[1]
    return busy / max(1, busy + idle)


def ticks(field: str) -> tuple[int, int]:
    busy, idle = field.split()
    return int(busy), int(idle)


@dataclass
class Suite:
    name: str
    tests: int
    failed: int
    skipped: int
    slowest: list[tuple[float, str]]


def minutes(seconds: float) -> str:
    return f"{int(seconds // 60)}:{int(seconds % 60):02d}"


def read_steps(path: Path) -> list[Step]:
    if not path.is_file():
        return []
    with path.open() as rows:
        return [
            Step(line, name, float(start), float(end), int(status), ticks(first), ticks(last))
            for line, name, start, end, status, first, last in csv.reader(rows, delimiter="\t")
        ]


def read_suite(path: Path) -> Suite:
    cases = list(ET.parse(path).getroot().iter("testcase"))
    timed = sorted(
        ((float(c.get("time", 0)), f"{c.get('classname', '')}::{c.get('name', '')}") for c in cases),
        reverse=True,
    )
    failed = sum(1 for c in cases if c.find("failure") is not None or c.find("error") is not None)
    skipped = sum(1 for c in cases if c.find("skipped") is not None)
    return Suite(path.stem, len(cases), failed, skipped, timed[:SLOWEST])


def line_busy(steps: list[Step]) -> float:
    """Seconds in which at least one of ``steps`` ran (a line's steps do not overlap, but be safe)."""
    busy, reach = 0.0, float("-inf")
    for step in sorted(steps, key=lambda s: s.start):
        busy += max(0.0, step.end - max(step.start, reach))
        reach = max(reach, step.end)
    return busy


def report(folder: Path) -> str:
    steps = read_steps(folder / "timeline.tsv")
    out = []
    if steps:
        first, last = min(steps, key=lambda s: s.start), max(steps, key=lambda s: s.end)
        begin, total = first.start, last.end - first.start
        verdict = "within" if total <= BUDGET_S else "OVER"
        cpu = busy_share(first.ticks_start, last.ticks_end)
        out.append(
            f"== test budget: {minutes(total)} wall, {verdict} the {minutes(BUDGET_S)} budget; "
            f"the CPUs {cpu:.0%} busy =="
        )
        out.append(f"{'line':<8} {'step':<52} {'start':>6} {'wall':>6} {'CPUs busy':>9}  status")
        for s in sorted(steps, key=lambda s: s.start):
            status = "ok" if s.status == 0 else f"exit {s.status}"
            share = busy_share(s.ticks_start, s.ticks_end)
            out.append(
                f"{s.line:<8} {s.name:<52} {minutes(s.start - begin):>6} {minutes(s.wall):>6} "
                f"{share:>9.0%}  {status}"
            )
        for line in sorted({s.line for s in steps}):
            busy = line_busy([s for s in steps if s.line == line])
            out.append(f"line {line}: busy {minutes(busy)}, idle {minutes(total - busy)} of {minutes(total)}")
    for path in sorted(folder.glob("*.xml")):
        suite = read_suite(path)
        out.append(
            f"-- {suite.name}: {suite.tests} tests, {suite.failed} failed, {suite.skipped} skipped; "
            f"the {len(suite.slowest)} slowest:"
        )
        out.extend(f"   {seconds:7.1f} s  {name}" for seconds, name in suite.slowest)
    return "\n".join(out) if out else f"no timings in {folder}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python scripts/ci_report.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="the run's report folder (HGPO_CI_REPORT)")
    print(report(parser.parse_args(argv).folder))
    return 0


if __name__ == "__main__":
    sys.exit(main())
