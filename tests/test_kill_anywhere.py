"""A run SIGKILLed anywhere keeps its record: the command killed (its whole process group, as an
OOM killer or a lost node does) at moments spread over its life, each time run again verbatim,
ends with every iteration in ``metrics.jsonl`` once and the weights of an uninterrupted run.

The moments are not hooks in the trainer: the test watches the run folder as any observer could
(the metrics record, the staged metrics, a checkpoint being written) and kills the run a chosen
delay after what it sees, so kills land in start-up, rollouts, updates, saves, evaluations and
the final save. Each killed run folder is checked for half-written files before the next run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from safetensors.torch import load_file

from hgpo_train.config import load_config
from hgpo_train.local.train import Trainer
from hgpo_train.run.tracking import STAGED, read_metrics

REPO_DIR = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_train_e2e import ROOMS  # the tiny Rooms config of the end-to-end tests
from test_train_faults import comparable, train_command  # comparable: every metric but the timings

ITERATIONS = 6
RUN = [
    *ROOMS,
    f"train.iterations={ITERATIONS}",
    "train.eval_every=2",
    "eval.tasks=[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]",
    "eval.seeds=[0]",
]
RUN_TIMEOUT_S = 300
"""Generous: a killed or finishing run on a loaded 2-core machine takes 10-20 s."""


@dataclass(frozen=True)
class Moment:
    """Kill ``delay`` seconds after ``event`` is first seen in this run of the command: ``start``
    (the process started), ``line N`` (the record gains iteration N or a later one), ``staged N``
    (the metrics of iteration N or a later one are staged: its checkpoint and evaluation start),
    ``saving`` (a checkpoint's temporary folder appears). A run resumes before the iteration of
    the last kill, so each moment in :data:`MOMENTS` comes in the run after the one before."""

    event: str
    delay: float

    def seen(self, run: RunWatch) -> bool:
        kind, _, number = self.event.partition(" ")
        if kind == "start":
            return True
        if kind == "line":
            return max(run.new_lines, default=-1) >= int(number)
        if kind == "staged":
            return run.new_staged is not None and run.new_staged >= int(number)
        return run.saw_saving


MOMENTS = [
    Moment("start", 0.3),  # start-up: the interpreter, nothing written yet
    Moment("start", 3.0),  # start-up: imports, the run folder being set up
    Moment("start", 6.0),  # start-up: the model, the env pool, the evaluator
    Moment("line 0", 0.0),  # a rollout: the first, after the opening evaluation's line
    Moment("staged 1", 0.0),  # a checkpoint starts (its metrics staged, not yet in the record)
    Moment("saving", 0.0),  # a checkpoint half-written (its temporary folder)
    Moment("line 1", 0.25),  # a resumed run's rollout and update, past the line it resumed after
    Moment("staged 2", 0.0),  # a checkpoint that an evaluation follows
    Moment("staged 2", 0.15),  # an evaluation
    Moment("staged 6", 0.0),  # the final save and evaluation start
    Moment("staged 6", 0.3),  # the final evaluation
    Moment("line 6", 0.0),  # the end: the last line written, the run closing
]
"""One kill in each phase of a run, each from a state the others do not reach (iterations 3-5
repeat 1-2's phases, so they are not killed in again)."""
LANDED_AT_LEAST = 10


class RunWatch:
    """What one run of the command has done to the run folder since it started, by polling."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self._reads: dict[Path, tuple[tuple[int, int, int], Any]] = {}
        self.lines_before = self._lines()
        self.staged_before = self._staged()
        self.new_lines: set[int] = set()
        self.new_staged: int | None = None
        self.saw_saving = False

    def poll(self) -> None:
        lines = self._lines()
        self.new_lines |= lines - self.lines_before
        self.lines_before &= lines  # a line dropped by the resume and logged again is new
        staged = self._staged()
        if staged is not None and staged != self.staged_before:
            self.new_staged = staged[0]
        checkpoints = self.run_dir / "checkpoints"
        self.saw_saving |= checkpoints.is_dir() and any(
            p.name.startswith(".tmp-") for p in checkpoints.iterdir()
        )

    def _read(self, name: str, parse: Callable[[Path], Any]) -> Any:
        """``parse`` of the run folder's file ``name``, parsed again only when the file changed:
        the poll runs every 2 ms beside the run it watches and must not take its CPU."""
        path = self.run_dir / name
        stat = path.stat()
        version = (stat.st_ino, stat.st_size, stat.st_mtime_ns)  # a file replaced is a new inode
        if self._reads.get(path, (None,))[0] != version:
            self._reads[path] = (version, (parse(path), stat.st_mtime_ns))
        return self._reads[path][1]

    def _lines(self) -> set[int]:
        try:
            records, _ = self._read("metrics.jsonl", read_metrics)
        except (FileNotFoundError, json.JSONDecodeError):
            return set()
        return {record["iteration"] for record in records}

    def _staged(self) -> tuple[int, int] | None:
        try:
            staged, written = self._read(STAGED, lambda path: json.loads(path.read_text()))
        except (FileNotFoundError, json.JSONDecodeError):
            return None
        return staged["iteration"], written


def run_and_kill(command: list[str], run_dir: Path, moment: Moment | None, log: Path) -> bool:
    """Run the command; with ``moment``, SIGKILL its process group then. Whether the kill landed
    (False: the run ended first)."""
    run_dir.mkdir(exist_ok=True)
    watch = RunWatch(run_dir)
    with open(log, "a") as out:
        out.write(f"--- {moment}\n")
        out.flush()
        process = subprocess.Popen(
            command, cwd=REPO_DIR, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline, started = time.monotonic() + RUN_TIMEOUT_S, time.monotonic()
        while moment is not None and process.poll() is None:
            watch.poll()
            if moment.seen(watch):
                time.sleep(max(0.0, moment.delay - (time.monotonic() - started) * (moment.event == "start")))
                if process.poll() is not None:
                    break
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=60)
                return True
            assert time.monotonic() < deadline, f"{moment} never came: {log.read_text()[-3000:]}"
            time.sleep(0.002)
        assert process.wait(timeout=RUN_TIMEOUT_S) == 0, log.read_text()[-3000:]
        return False
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def assert_whole(run_dir: Path) -> None:
    """No file of the run folder is half-written (those a run wrote so far), and the record holds
    each iteration once."""
    if (run_dir / "metrics.jsonl").is_file():
        iterations = [record["iteration"] for record in read_metrics(run_dir / "metrics.jsonl")]
        assert iterations == sorted(set(iterations)), iterations
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
        assert len(lines) == len(iterations), "a line of the record is cut"
    if (run_dir / "config.yaml").is_file():
        assert yaml.safe_load((run_dir / "config.yaml").read_text())["train"]["iterations"] == ITERATIONS
    if (run_dir / "run_info.jsonl").is_file():
        for line in (run_dir / "run_info.jsonl").read_text().splitlines():
            assert json.loads(line)["backend"] == "local"
    for result in run_dir.glob("evals/*.json"):
        assert json.loads(result.read_text())["episodes"], result
    for checkpoint in run_dir.glob("checkpoints/iter_*"):
        assert json.loads((checkpoint / "state.json").read_text())["iteration"] == int(checkpoint.name[5:])
        load_file(checkpoint / "model" / "model.safetensors")


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """An uninterrupted run, and the overrides that repeat it (its tiny model, built once)."""
    run_dir = tmp_path_factory.mktemp("straight")
    trainer = Trainer(load_config(env="rooms", overrides=[*RUN, f"train.output_dir={run_dir}"]))
    try:
        trainer.fit()
    finally:
        trainer.close()
    return run_dir, [*RUN, f"model.name_or_path={run_dir / 'tiny_model'}"]


def final_weights(run_dir: Path) -> dict:
    return load_file(run_dir / "checkpoints" / f"iter_{ITERATIONS:06d}" / "model" / "model.safetensors")


def test_killed_anywhere_and_run_again_the_record_is_whole_and_the_weights_exact(straight, tmp_path):
    straight_dir, overrides = straight
    run_dir = tmp_path / "run"
    command = train_command(overrides, run_dir)
    log = tmp_path / "runs.log"
    landed = []
    for moment in MOMENTS:
        if run_and_kill(command, run_dir, moment, log):  # False: the run ended before the moment
            landed.append(moment)
            assert_whole(run_dir)
    assert len(landed) >= LANDED_AT_LEAST, f"only {landed} landed: the moments no longer cover the run"
    run_and_kill(command, run_dir, None, log)  # the verbatim re-run, to the end
    assert_whole(run_dir)
    assert [r["iteration"] for r in read_metrics(run_dir / "metrics.jsonl")] == list(range(ITERATIONS + 1))
    assert comparable(run_dir) == comparable(straight_dir)
    expected = final_weights(straight_dir)
    for name, tensor in final_weights(run_dir).items():
        assert tensor.equal(expected[name]), name  # bit for bit
