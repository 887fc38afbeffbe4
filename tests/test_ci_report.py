"""The test budget's table (scripts/ci_report.py): what scripts/test.sh records, read back."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

from ci_report import BUDGET_S, Step, busy_share, line_busy, read_steps, report

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="3">
<testcase classname="tests.test_a" name="test_fast" time="0.5"/>
<testcase classname="tests.test_a" name="test_slow" time="90.0"><failure message="boom"/></testcase>
<testcase classname="tests.test_b" name="test_skipped" time="0.0"><skipped message="no data"/></testcase>
</testsuite></testsuites>
"""


def timeline(folder: Path, rows: list[tuple]) -> None:
    with (folder / "timeline.tsv").open("w") as out:
        for line, step, start, end, status, first, last in rows:
            out.write(
                f"{line}\t{step}\t{start}\t{end}\t{status}\t{first[0]} {first[1]}\t{last[0]} {last[1]}\n"
            )


def test_each_lines_idle_time_and_the_verdict(tmp_path: Path) -> None:
    timeline(
        tmp_path,
        [
            ("main", "main: environment", 1000.0, 1120.0, 0, (0, 0), (180, 60)),
            ("main", "main: suite", 1120.0, 2920.0, 0, (180, 60), (3300, 660)),
            ("second", "verl: environment", 1000.0, 1600.0, 0, (0, 0), (900, 300)),
        ],
    )
    steps = read_steps(tmp_path / "timeline.tsv")
    assert [s.wall for s in steps] == [120.0, 1800.0, 600.0]
    assert busy_share(steps[1].ticks_start, steps[1].ticks_end) == pytest.approx(3120 / 3720)
    assert line_busy([s for s in steps if s.line == "second"]) == 600.0
    text = report(tmp_path)
    assert text.splitlines()[0] == "== test budget: 32:00 wall, OVER the 30:00 budget; the CPUs 83% busy =="
    assert "line main: busy 32:00, idle 0:00 of 32:00" in text
    assert "line second: busy 10:00, idle 22:00 of 32:00" in text


def test_overlapping_steps_of_a_line_count_once() -> None:
    steps = [Step("a", "step", start, end, 0, (0, 0), (0, 0)) for start, end in [(0, 10), (5, 20), (30, 40)]]
    assert line_busy(steps) == 30.0


def test_each_suites_slowest_tests_failures_and_skips(tmp_path: Path) -> None:
    (tmp_path / "main.xml").write_text(JUNIT)
    text = report(tmp_path)
    assert "-- main: 3 tests, 1 failed, 1 skipped; the 3 slowest:" in text
    slowest = [line.split("s  ")[1] for line in text.splitlines() if line.startswith("   ")]
    assert slowest == ["tests.test_a::test_slow", "tests.test_a::test_fast", "tests.test_b::test_skipped"]


def test_a_run_that_recorded_nothing_says_so(tmp_path: Path) -> None:
    assert report(tmp_path) == f"no timings in {tmp_path}"
    assert BUDGET_S == 30 * 60  # docs/development.md states this budget
