"""The shared run schedule (``hgpo_train.run.loop.run_iterations``) and its record, with a backend that
only counts what it is asked to do: each iteration's metrics are on disk before its checkpoint
starts, and a resume writes the line a kill or a stop kept out of ``metrics.jsonl``, evaluating
again when one was due. The whole trainer killed for real is ``test_kill_anywhere.py``."""

from __future__ import annotations

from pathlib import Path

import pytest

from hgpo_train.config import LoggingConfig
from hgpo_train.run.loop import run_iterations
from hgpo_train.run.stopping import StopRequested
from hgpo_train.run.tracking import MetricsLogger, read_metrics

ITERATIONS, EVAL_EVERY = 4, 2


class Killed(BaseException):
    """Stands in for SIGKILL: nothing of the schedule runs after it."""


class CountingBackend:
    """Records what the schedule asks; ``kill_in`` names an evaluation to die in, ``stop`` a
    standing stop request."""

    def __init__(self, logger: MetricsLogger, kill_in: int | None = None, stop: bool = False) -> None:
        self.logger, self.kill_in, self.stop = logger, kill_in, stop
        self.saved: list[int] = []
        self.evaluated: list[int] = []

    def train_iteration(self, iteration: int) -> dict[str, float]:
        return {"update/loss": float(iteration)}

    def start_save(self, iteration: int) -> None:
        assert self.logger.staged(iteration) is not None, "a checkpoint before its metrics are on disk"
        self.saved.append(iteration)

    def wait_for_save(self) -> None:
        pass

    def evaluate(self, iteration: int) -> dict[str, float]:
        if iteration == self.kill_in:
            raise Killed
        self.evaluated.append(iteration)
        return {"eval/success_rate": iteration / 10}

    def stop_requested(self) -> bool:
        return self.stop


def run(run_dir: Path, start: int, **backend_options) -> CountingBackend:
    logger = MetricsLogger(run_dir, LoggingConfig(tensorboard=False), start_iteration=start)
    backend = CountingBackend(logger, **backend_options)
    try:
        run_iterations(backend, start=start, iterations=ITERATIONS, eval_every=EVAL_EVERY, logger=logger)
    finally:
        logger.close()
    return backend


def record(run_dir: Path) -> list[tuple[int, float | None, float | None]]:
    return [
        (r["iteration"], r.get("update/loss"), r.get("eval/success_rate"))
        for r in read_metrics(run_dir / "metrics.jsonl")
    ]


STRAIGHT = [(0, None, 0.0), (1, 0.0, None), (2, 1.0, 0.2), (3, 2.0, None), (4, 3.0, 0.4)]


def test_a_straight_run_stages_every_iteration_before_its_checkpoint(tmp_path):
    backend = run(tmp_path, 0)
    assert backend.saved == [1, 2, 3, 4] and backend.evaluated == [0, 2, 4]
    assert record(tmp_path) == STRAIGHT


def test_a_kill_during_an_evaluation_is_made_good_on_resume(tmp_path):
    """Iteration 2 is checkpointed, then the kill lands in its evaluation: its line is missing
    (before, the resume started after it and it was never logged). The resume from checkpoint 2
    writes it from the staged metrics, evaluating again, and goes on."""
    with pytest.raises(Killed):
        run(tmp_path, 0, kill_in=2)
    assert [r[0] for r in record(tmp_path)] == [0, 1]
    resumed = run(tmp_path, 2)
    assert resumed.evaluated == [2, 4] and resumed.saved == [3, 4]
    assert record(tmp_path) == STRAIGHT


def test_a_fresh_start_keeps_the_first_evaluation_it_logged(tmp_path):
    """Killed after iteration 0's evaluation and before the first checkpoint: the re-run starts
    at 0 again, and neither logs nor evaluates iteration 0 twice."""
    with pytest.raises(Killed):
        run(tmp_path, 0, kill_in=2)
    again = run(tmp_path, 0)
    assert again.evaluated == [2, 4]
    assert record(tmp_path) == STRAIGHT


def test_a_stop_at_a_due_evaluation_leaves_the_line_to_the_resume(tmp_path):
    """A stop request (SIGTERM) skips a due evaluation; the stopped run's record then holds only
    complete iterations, and the resume evaluates and writes the line, also when the stop is
    still standing as it starts (it stops again once the line is safe)."""
    with pytest.raises(Killed):
        run(tmp_path, 0, kill_in=2)  # lines 0 and 1; checkpoint 1
    with pytest.raises(StopRequested) as stopped:
        run(tmp_path, 1, stop=True)  # iteration 2 trains and is checkpointed, its evaluation skipped
    assert stopped.value.iteration == 2 and [r[0] for r in record(tmp_path)] == [0, 1]
    with pytest.raises(StopRequested) as again:
        run(tmp_path, 2, stop=True)
    assert again.value.iteration == 2 and [r[0] for r in record(tmp_path)] == [0, 1]
    assert run(tmp_path, 2).evaluated == [2, 4]
    assert record(tmp_path) == STRAIGHT


def test_a_checkpoint_without_staged_metrics_gets_a_line_that_says_so(tmp_path, caplog):
    """A run folder written before metrics were staged (or a checkpoint saved by hand)."""
    resumed = run(tmp_path, 3)
    assert resumed.evaluated == [4]
    assert record(tmp_path) == [(3, None, None), (4, 3.0, 0.4)]
    assert read_metrics(tmp_path / "metrics.jsonl")[0]["record/lost"] == 1.0
    assert "iteration 3 was checkpointed but its metrics were not kept" in caplog.text
