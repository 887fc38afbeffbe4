"""The trainer under faults: a worker killed between rollouts, a pool that raises, Ctrl-C and
SIGTERM then a re-run, a changed config, leftovers of a killed save, and a full disk. Each run is
compared with one uninterrupted run of the same config (tiny model, Rooms, CPU)."""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
import yaml

from hgpo_env.vector import GroupMismatchError, PoolError
from hgpo_train.cli import main
from hgpo_train.config import ConfigError, load_config
from hgpo_train.local.train import Trainer
from hgpo_train.run.checkpoint import (
    CheckpointError,
    kept_iterations,
    list_checkpoints,
    load_training_state,
    save_checkpoint,
)
from hgpo_train.run.provenance import RUN_INFO, config_hash
from hgpo_train.run.stopping import StopRequested, request_stop
from hgpo_train.run.tracking import read_metrics

REPO_DIR = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_train_e2e import ROOMS  # the tiny Rooms config of the end-to-end tests

ITERATIONS = 3


def comparable(run_dir: Path) -> list[dict]:
    """Every logged iteration's metrics but the timings."""
    return [
        {k: v for k, v in record.items() if not k.startswith(("time/", "throughput/"))}
        for record in read_metrics(run_dir / "metrics.jsonl")
    ]


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """An uninterrupted run, and the overrides that repeat it (its tiny model, built once)."""
    run_dir = tmp_path_factory.mktemp("straight")
    trainer = Trainer(
        load_config(
            env="rooms", overrides=[*ROOMS, f"train.iterations={ITERATIONS}", f"train.output_dir={run_dir}"]
        )
    )
    try:
        trainer.fit()
    finally:
        trainer.close()
    overrides = [*ROOMS, f"train.iterations={ITERATIONS}", f"model.name_or_path={run_dir / 'tiny_model'}"]
    return run_dir, overrides


def train_command(overrides: list[str], run_dir: Path) -> list[str]:
    """The command line of a run of these overrides in ``run_dir``."""
    return [sys.executable, "-m", "hgpo_train", "--env", "rooms", *overrides, f"train.output_dir={run_dir}"]


def trainer_for(run_dir: Path, overrides: list[str], **kwargs) -> Trainer:
    return Trainer(load_config(env="rooms", overrides=[*overrides, f"train.output_dir={run_dir}"]), **kwargs)


def test_worker_killed_between_rollouts_and_a_failing_reset_change_nothing(straight, tmp_path, monkeypatch):
    run_dir, overrides = straight
    killed = trainer_for(tmp_path / "killed", overrides)
    try:
        run_iteration = killed.run_iteration

        def kill_then_run(iteration: int):
            if iteration == 1:  # the worker dies while idle between two rollouts
                os.kill(killed.pool.worker_pids()[0], signal.SIGKILL)
                time.sleep(0.5)
            return run_iteration(iteration)

        monkeypatch.setattr(killed, "run_iteration", kill_then_run)
        killed.fit()
        assert killed.pool.num_restarts == 1
    finally:
        killed.close()
    assert comparable(tmp_path / "killed") == comparable(run_dir)

    # A pool whose reset raises (standing in for a fault the pool could not heal) is retried.
    flaky = trainer_for(tmp_path / "flaky", overrides)
    try:
        reset, calls = flaky.pool.reset, []

        def failing_once(**kwargs):
            calls.append(1)
            if len(calls) == 2:
                raise PoolError("reset failed for 1 env(s)")
            return reset(**kwargs)

        monkeypatch.setattr(flaky.pool, "reset", failing_once)
        flaky.fit()
        assert len(calls) == ITERATIONS + 1
    finally:
        flaky.close()
    assert comparable(tmp_path / "flaky") == comparable(run_dir)


@pytest.mark.parametrize(
    ("failure", "failures", "tries"),
    [
        (PoolError("reset failed"), 2, 3),
        (PoolError("reset failed"), 3, 3),
        (GroupMismatchError("differs"), 1, 1),
    ],
    ids=["healed-on-the-third", "three-failures-raise", "nondeterministic-env-not-retried"],
)
def test_both_backends_give_a_failed_rollout_the_same_retries(monkeypatch, caplog, failure, failures, tries):
    """``collect_with_retries``, which the local and the OpenRLHF trainer both call: a pool fault is
    given the rollout again (reseeded) up to three times; an env that is not deterministic is not."""
    from hgpo_train.rollout import collect as rollout

    calls: list[dict] = []

    def collect(pool, generator, **options):
        calls.append(options)
        if len(calls) <= failures:
            raise failure
        return "batch"

    monkeypatch.setattr(rollout, "collect_rollouts", collect)
    reseeded: list[int] = []
    attempt = functools.partial(
        rollout.collect_with_retries,
        None,
        None,
        label="iteration 7",
        before_attempt=lambda: reseeded.append(1),
    )
    if failures < tries:  # healed
        assert attempt(seeds=[3]) == "batch"
    else:
        with pytest.raises(type(failure)):
            attempt(seeds=[3])
    assert calls == [{"seeds": [3]}] * tries and len(reseeded) == tries
    warned = [r.getMessage() for r in caplog.records if "rollout attempt" in r.getMessage()]
    assert warned == [
        f"iteration 7: the env pool failed (reset failed); rollout attempt {i} of 3"
        for i in range(2, tries + 1)
    ]


@contextlib.contextmanager
def _ctrl_c_as_in_a_terminal() -> Iterator[None]:
    """Start the run with SIGINT's default action, however pytest was started: a shell without job
    control starts background commands (``pytest &``) with SIGINT ignored, which a child inherits,
    and Python then never raises KeyboardInterrupt. A handled signal is reset to its default in a
    child, so handling SIGINT here while the run starts is enough."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_stop_prints_one_line_and_a_rerun_resumes_exactly(straight, tmp_path, stop):
    run_dir, overrides = straight
    command = train_command(overrides, tmp_path)
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    with _ctrl_c_as_in_a_terminal():
        process = subprocess.Popen(
            command, cwd=REPO_DIR, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
    try:
        deadline = time.monotonic() + 240
        while not (tmp_path / "checkpoints" / "iter_000001").is_dir():  # one iteration done and saved
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "the first iteration did not finish"
            time.sleep(0.1)
        children = [p.pid for p in psutil.Process(process.pid).children(recursive=True)]
        process.send_signal(stop)
        _, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr
    [line] = [line for line in stderr.splitlines() if line.startswith("stopped")]
    if stop == signal.SIGINT:  # at once; every completed iteration is checkpointed
        said = r"stopped at iteration (\d); last checkpoint iter_00000(\d); re-run the same command to resume"
    else:  # at the next safe point, checkpointed there
        said = r"stopped on request after iteration (\d), checkpointed \(iter_00000(\d)\); "
        said += r"(iteration \d's rollout was abandoned; )?re-run the same command to resume"
    match = re.fullmatch(said, line)
    assert match and int(match[1]) == int(match[2]) >= 1, line
    deadline = time.monotonic() + 10
    while any(psutil.pid_exists(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in children if psutil.pid_exists(pid)], "workers outlived the run"

    rerun = subprocess.run(
        command, cwd=REPO_DIR, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert rerun.returncode == 0, rerun.stderr
    assert re.search(r"resuming from \S+iter_00000\d \(iteration \d\)", rerun.stderr)
    assert comparable(tmp_path) == comparable(run_dir)


def interrupted_in_update(
    run: Path,
    overrides: list[str],
    monkeypatch: pytest.MonkeyPatch,
    interrupt: Callable[[Trainer], None],
    on_disk: list[str],
) -> None:
    """Run with checkpoints kept only every 10 iterations, calling ``interrupt`` inside iteration
    2's update; ``on_disk`` gets the checkpoints there at that moment."""
    trainer = trainer_for(run, [*overrides, "train.save_every=10"])
    update, calls = trainer.updater.update, []

    def update_then_interrupt(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            on_disk.extend(p.name for p in list_checkpoints(run))
            interrupt(trainer)
        return update(*args, **kwargs)

    monkeypatch.setattr(trainer.updater, "update", update_then_interrupt)
    try:
        trainer.fit()
    finally:
        trainer.close()


def resume_to_the_end(run: Path, overrides: list[str], start: int) -> None:
    resumed = trainer_for(run, [*overrides, "train.save_every=10"])
    try:
        assert resumed.start_iteration == start
        resumed.fit()
    finally:
        resumed.close()


class Killed(BaseException):
    """Stands in for SIGKILL: nothing of the trainer runs after it but the interpreter's exit."""


def test_a_kill_during_an_update_loses_only_that_iteration(straight, tmp_path, monkeypatch):
    """Every completed iteration is on disk before the next update starts, whatever save_every says."""
    run_dir, overrides = straight

    def kill(trainer: Trainer) -> None:
        raise Killed

    on_disk: list[str] = []
    with pytest.raises(Killed):
        interrupted_in_update(tmp_path, overrides, monkeypatch, kill, on_disk)
    assert on_disk == ["iter_000001"]
    resume_to_the_end(tmp_path, overrides, start=1)
    assert comparable(tmp_path) == comparable(run_dir)


def test_sigterm_during_an_update_finishes_and_checkpoints_it(straight, tmp_path, monkeypatch):
    """A stop request (what SIGTERM makes) during iteration 2's update: the update finishes, is
    checkpointed, and the run stops there; re-running goes on as if nothing happened."""
    run_dir, overrides = straight

    def sigterm(trainer: Trainer) -> None:
        request_stop(trainer.run_dir, "SIGTERM")

    on_disk: list[str] = []
    with pytest.raises(StopRequested) as stopped:
        interrupted_in_update(tmp_path, overrides, monkeypatch, sigterm, on_disk)
    assert stopped.value.iteration == 2 and on_disk == ["iter_000001"]
    assert [p.name for p in list_checkpoints(tmp_path)] == ["iter_000002"]  # save_every=10 keeps no other
    assert [r["iteration"] for r in comparable(tmp_path)] == [1, 2]
    resume_to_the_end(tmp_path, overrides, start=2)
    assert comparable(tmp_path) == comparable(run_dir)


def test_the_stop_command_returns_once_the_run_has_stopped(straight, tmp_path):
    """``python -m hgpo_train stop RUN_DIR --wait S``, the KubeRay manifest's preStop hook."""
    _, overrides = straight
    # far more iterations than run before the stop lands: a fast machine must not finish the run first
    train = train_command([*overrides, "train.iterations=200"], tmp_path)
    stop = [sys.executable, "-m", "hgpo_train", "stop", str(tmp_path), "--wait", "120"]
    process = subprocess.Popen(train, cwd=REPO_DIR, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while not (tmp_path / "checkpoints" / "iter_000001").is_dir():
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "the first iteration did not finish"
            time.sleep(0.1)
        stopped = subprocess.run(stop, capture_output=True, text=True, timeout=180, check=False)
        assert process.wait(timeout=30) == 130  # the run had stopped: its process is only exiting
        _, said = process.communicate(timeout=10)
    finally:
        process.kill()
    assert stopped.returncode == 0 and stopped.stderr.strip().endswith(f"the run in {tmp_path} stopped")
    match = re.search(r"stopped on request after iteration (\d+), checkpointed \(iter_0*(\d+)\)", said)
    assert match and match[1] == match[2] and int(match[1]) < 200, said
    again = subprocess.run(stop, capture_output=True, text=True, timeout=60, check=False)
    assert again.returncode == 0 and again.stderr.strip() == f"no run is training in {tmp_path}"


def test_a_changed_config_is_refused_unless_asked(straight, tmp_path, capsys):
    run_dir, _ = straight
    overrides = [*ROOMS, f"train.iterations={ITERATIONS}"]  # as the run was started
    shutil.copytree(run_dir, tmp_path / "run")
    run = tmp_path / "run"
    changed = [*overrides, "advantage.estimator=gigpo", "update.lr=0.002"]
    with pytest.raises(ConfigError) as refused:
        trainer_for(run, changed)
    message = str(refused.value)
    assert "advantage.estimator: 'hgpo' -> 'gigpo'" in message and "update.lr: 0.001 -> 0.002" in message
    assert "--allow-config-change" in message and "--overwrite" in message
    assert "train.iterations" not in message

    argv = ["--env", "rooms", *changed, f"train.output_dir={run}"]
    assert main(argv) == 2
    assert "advantage.estimator: 'hgpo' -> 'gigpo'" in capsys.readouterr().err

    longer = trainer_for(run, [*overrides, f"train.iterations={ITERATIONS + 1}"])  # more iterations: fine
    try:
        assert longer.start_iteration == ITERATIONS and longer.resumed_from.name == f"iter_00000{ITERATIONS}"
    finally:
        longer.close()
    resumed = trainer_for(run, changed, allow_config_change=True)
    try:
        assert resumed.start_iteration == ITERATIONS
        assert "estimator: gigpo" in (run / "config.yaml").read_text()
    finally:
        resumed.close()
    starts = [json.loads(line) for line in (run / RUN_INFO).read_text().splitlines()]
    assert len(starts) >= 2 and {start["backend"] for start in starts} == {"local"}  # one per start
    for stale in ("driver.log", "openrlhf.yaml", "final_model"):  # what the other backend writes
        (run / stale).touch()
    fresh = trainer_for(run, changed, overwrite=True)
    try:
        assert fresh.start_iteration == 0 and fresh.resumed_from is None
        assert list_checkpoints(run) == [] and not (run / "metrics.jsonl").read_text()
        assert not any((run / stale).exists() for stale in ("driver.log", "openrlhf.yaml", "final_model"))
        (start,) = [json.loads(line) for line in (run / RUN_INFO).read_text().splitlines()]
        assert start["config_sha256"] == config_hash(yaml.safe_load((run / "config.yaml").read_text()))
    finally:
        fresh.close()


def test_the_newest_checkpoint_and_the_newest_save_every_ones_are_kept():
    assert kept_iterations(range(1, 24), keep=2, save_every=10) == {10, 20, 23}
    assert kept_iterations([10, 20, 30], keep=2, save_every=10) == {20, 30}
    assert kept_iterations([1, 2, 3], keep=2, save_every=0) == {3}
    assert kept_iterations([1, 2, 3], keep=5, save_every=1) == {1, 2, 3}
    assert kept_iterations([], keep=2, save_every=10) == set()


def test_a_restart_sweeps_what_a_killed_save_left(straight, tmp_path):
    run_dir, _ = straight
    overrides = [*ROOMS, f"train.iterations={ITERATIONS}"]
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    checkpoints = run / "checkpoints"
    assert [p.name for p in list_checkpoints(run)] == ["iter_000002", "iter_000003"]
    shutil.copytree(checkpoints / "iter_000002", checkpoints / "iter_000001")  # a kill after the rename
    (checkpoints / ".tmp-x1y2").mkdir()  # a kill during a write
    (checkpoints / ".tmp-x1y2" / "optimizer.pt").write_bytes(b"\0" * 1000)
    trainer = trainer_for(run, overrides)
    try:
        assert sorted(p.name for p in checkpoints.iterdir()) == ["iter_000002", "iter_000003"]
    finally:
        trainer.close()


@pytest.fixture
def small_disk(tmp_path: Path):
    """A real full disk: a 1 MiB tmpfs (this machine and CI run as root). Where mounting is not
    allowed the test fails saying why, rather than pass untested."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True, check=False
    )
    if done.returncode != 0:
        pytest.fail(f"cannot mount a small tmpfs for the full-disk test: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "--lazy", str(mount)], check=True)


def test_a_full_disk_says_so_and_keeps_the_last_checkpoint(straight, small_disk):
    run_dir, _ = straight
    trainer = trainer_for(run_dir, [*ROOMS, f"train.iterations={ITERATIONS}"])  # a model and an optimizer
    try:
        config = trainer.config.to_yaml()
        first = save_checkpoint(small_disk, 1, trainer.model, trainer.optimizer, config, keep=2, save_every=1)
        size = sum(f.stat().st_size for f in first.rglob("*") if f.is_file())
        free = shutil.disk_usage(small_disk).free
        assert size < free, "the 1 MiB disk must hold one checkpoint for this test"
        (small_disk / "filler").write_bytes(b"\0" * (free - size // 2))  # room for half a checkpoint
        with pytest.raises(CheckpointError) as full:
            save_checkpoint(small_disk, 2, trainer.model, trainer.optimizer, config, keep=2, save_every=1)
        assert full.value.errno == errno.ENOSPC
        assert str(full.value.strerror) == (
            f"no space left on device writing checkpoint iter_000002 in {small_disk / 'checkpoints'}; "
            "the last good checkpoint, iter_000001, is kept"
        )
        assert [p.name for p in (small_disk / "checkpoints").iterdir()] == ["iter_000001"]
        assert load_training_state(first, trainer.optimizer) == 1  # still loadable
    finally:
        trainer.close()


def test_a_full_disk_ends_the_command_with_one_line(straight, small_disk, capsys):
    run_dir, overrides = straight
    checkpoint = sum(
        f.stat().st_size for f in (run_dir / "checkpoints" / "iter_000003").rglob("*") if f.is_file()
    )
    free = shutil.disk_usage(small_disk).free
    (small_disk / "filler").write_bytes(b"\0" * (free - checkpoint * 3 // 2))  # room for one checkpoint
    argv = [
        "--env",
        "rooms",
        *overrides,
        f"train.output_dir={small_disk / 'run'}",
        "logging.tensorboard=false",
    ]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    [line] = [line for line in err.splitlines() if line.startswith("error:")]
    assert line.startswith("error: no space left on device writing checkpoint iter_000002")
    assert line.endswith("the last good checkpoint, iter_000001, is kept")
    assert not [p for p in (small_disk / "run" / "checkpoints").iterdir() if p.name.startswith(".tmp-")]
