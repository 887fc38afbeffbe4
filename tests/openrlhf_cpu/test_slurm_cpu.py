"""The shipped Slurm template, submitted with ``sbatch`` to a real Slurm, trains, stops and resumes.

The module starts a one-machine Slurm (``tests/slurm_cluster.py``: munged, slurmctld and slurmd on
127.0.0.1, its node announcing 8 CPUs and 2 stand-in GPUs) and submits
``scripts/launch/slurm_openrlhf.sbatch`` unchanged, with only what its header documents set for a
CPU run: sbatch's ``--cpus-per-task``/``--gpus-per-node``/``--time``, the CPU config with overrides,
``PYTHON`` and ``RAY_HEAD_IP=127.0.0.1``. One job lives through two stops, each followed by the
template's requeue and a resume:

1. ``scancel --signal=TERM`` (Slurm signals the job's steps; the template's watcher step passes it on),
2. the time limit (``--signal=B:TERM@...``: the script itself, as ``scancel --batch`` signals it),

then a plain ``scancel`` ends it, leaving no process behind. Slurm's fixed 2-minute wait before a requeued job may start
again is skipped (``scontrol update StartTime=now``), and the time limit is set per phase
(``scontrol update TimeLimit``: in the second, once its driver trains, so that the TERM comes soon
and finds it however slowly a loaded machine started it); nothing else is changed. Only what cannot
run here is replaced (``hgpo_train.openrlhf.cpu``: CUDA calls, NCCL -> gloo).
"""

from __future__ import annotations

import itertools
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import CPU_CONFIG, REPO

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' shared helpers

from slurm_cluster import SlurmCluster, missing_commands

from hgpo_train.run.tracking import read_metrics

TEMPLATE = REPO / "scripts" / "launch" / "slurm_openrlhf.sbatch"
TIME_LIMIT_MIN = 30
"""The job's time limit, but in the time-limit phase."""
SIGNAL_BEFORE_S = 75
"""The time-limit phase's SIGTERM comes this long before the limit (or up to a minute earlier: Slurm
checks time limits every few tens of seconds), and the driver has that long to stop."""
STOP_LINE = re.compile(r"stopped on request after iteration (\d+), checkpointed \(global_step(\d+)\)")
GAVE_UP_LINE = re.compile(
    r"no safe point within openrlhf.stop_grace_s=\S+ s: stopping now; re-running the same command resumes from global_step(\d+)"
)
"""A stop that came before the run's first safe point (its engines still starting)."""


@dataclass
class Phase:
    """One start of the job: the iteration it resumed from (0: a fresh start) and where it stopped."""

    resumed_from: int
    stopped_at: int | None


@pytest.fixture(scope="module")
def slurm() -> Iterator[SlurmCluster]:
    missing = missing_commands()
    if missing:
        pytest.fail(f"Slurm is not installed ({', '.join(missing)}): apt-get install slurm-wlm munge")
    root = Path(tempfile.mkdtemp(prefix="slurm", dir="/tmp"))  # short: Ray's socket paths
    cluster = None
    try:
        cluster = SlurmCluster(root)
        yield cluster
    finally:
        if cluster is not None:
            cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


class Job:
    """The submitted job, its log, and the run folder's metrics."""

    def __init__(self, slurm: SlurmCluster, job_id: str, log: Path, run: Path) -> None:
        self.slurm, self.id, self.log, self.run = slurm, job_id, log, run

    def text(self) -> str:
        return self.log.read_text() if self.log.is_file() else ""

    def iterations(self) -> list[int]:
        metrics = self.run / "metrics.jsonl"
        return [r["iteration"] for r in read_metrics(metrics)] if metrics.is_file() else []

    def wait_for(self, what: str, done: Callable[[], bool], timeout: float = 420) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            job = self.slurm.job(self.id)
            if done():  # the state may change between the two looks
                return
            # SIGNALING: the time limit's --signal=B:TERM@300 is on its way to the batch script
            alive = ("PENDING", "RUNNING", "SIGNALING", "REQUEUED", "COMPLETING")
            assert job["JobState"] in alive, self.report(what, job)
            assert time.monotonic() < deadline, self.report(f"no {what} within {timeout:g} s", job)
            time.sleep(0.5)

    def report(self, what: str, job: dict[str, str]) -> str:
        state = {k: job.get(k) for k in ("JobState", "Reason", "ExitCode", "Restarts")}
        return f"{what}: {state}\n{self.text()[-3000:]}\n{self.slurm.logs()[-3000:]}"

    def stops(self) -> list[re.Match[str]]:
        """Each stop's line: at a safe point, or without one (``GAVE_UP_LINE``), in order."""
        text = self.text()
        return sorted([*STOP_LINE.finditer(text), *GAVE_UP_LINE.finditer(text)], key=lambda m: m.start())

    def requeued_and_restarted(self, stops: int) -> None:
        """Wait for the stop line number ``stops`` and the requeue, then let the job start again."""
        self.wait_for(f"stop {stops}", lambda: len(self.stops()) >= stops)
        self.wait_for("the requeue", lambda: self.slurm.job(self.id)["JobState"] == "PENDING", timeout=120)
        # Slurm holds a requeued job for its credential's lifetime (120 s); this skips most of it,
        # but not the second of the requeue: a job restarted within it finds its new credential
        # revoked along with the old one and fails ("Job credential revoked")
        self.slurm.run(
            "scontrol", "update", f"JobId={self.id}", f"TimeLimit={TIME_LIMIT_MIN}", "StartTime=now+2"
        )
        self.wait_for("the restart", lambda: self.slurm.job(self.id)["JobState"] == "RUNNING", timeout=120)

    def time_limit_soon(self) -> None:
        """Once the resumed driver has logged an iteration (its SIGTERM handler is set), a time limit
        whose TERM comes now or within a minute."""
        logged = len(self.iterations())
        self.wait_for("the resumed run's first iteration", lambda: len(self.iterations()) > logged)
        ran = seconds(self.slurm.job(self.id)["RunTime"])
        minutes = math.ceil((ran + SIGNAL_BEFORE_S + 5) / 60)
        self.slurm.run("scontrol", "update", f"JobId={self.id}", f"TimeLimit={minutes}")


def seconds(run_time: str) -> int:
    """Slurm's ``[D-]HH:MM:SS`` as seconds."""
    days, _, clock = run_time.rpartition("-")
    hours, minutes, secs = (int(part) for part in clock.split(":"))
    return int(days or 0) * 86400 + hours * 3600 + minutes * 60 + secs


@pytest.fixture(scope="module")
def job(slurm: SlurmCluster, warm_model: str) -> Iterator[Job]:
    """The job through its three stops and restarts, then cancelled for good."""
    run = slurm.root / "run"
    log = slurm.root / "slurm-job.log"
    env = {
        **slurm.env,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "PYTHON": sys.executable,
        "RAY_HEAD_IP": "127.0.0.1",
        "TMPDIR": str(slurm.root),  # where the template puts the job's Ray temp dir
    }
    command = [
        "sbatch",
        "--parsable",
        "--cpus-per-task=4",
        "--gpus-per-node=1",  # the CPU config's one logical GPU
        f"--time={TIME_LIMIT_MIN}",
        f"--signal=B:TERM@{SIGNAL_BEFORE_S}",
        f"--output={log}",
        str(TEMPLATE),
        str(CPU_CONFIG),
        f"model.name_or_path={warm_model}",
        f"train.output_dir={run}",
        "train.iterations=400",  # more than the job lives: only the stops end its runs
        "train.eval_every=0",
        "generation.constrained=false",
        "logging.tensorboard=false",
        "advantage.estimator=crbc",  # the estimator matters not to the stops: CRBC through this backend too
    ]
    submitted = subprocess.run(command, env=env, capture_output=True, text=True, check=False, cwd=REPO)
    assert submitted.returncode == 0, submitted.stderr
    job = Job(slurm, submitted.stdout.strip().split(";")[0], log, run)
    try:
        job.wait_for("2 iterations", lambda: len(job.iterations()) >= 2)
        slurm.run("scancel", "--signal=TERM", job.id)  # 1: the steps
        job.requeued_and_restarted(1)
        job.time_limit_soon()  # 2: the time limit
        job.requeued_and_restarted(2)
        job.wait_for("the second resume", lambda: job.text().count("resuming from ") == 2)
        slurm.run("scancel", job.id)
        job.wait_for("the cancel", lambda: job.slurm.job(job.id)["JobState"] not in ("RUNNING", "COMPLETING"))
        yield job
    finally:
        subprocess.run(["scancel", job.id], env=slurm.env, check=False)


def phases(job: Job) -> list[Phase]:
    """Each start's resume point and stop, read from the job's log in order."""
    text = job.text()
    resumed = [int(m[1]) for m in re.finditer(r"resuming from \S+ \(iteration (\d+)\)", text)]
    stops = [int(m[m.lastindex]) for m in job.stops()]  # the checkpoint a re-run resumes from
    assert len(resumed) == 2 and len(stops) == 2, text[-4000:]
    return [Phase(r, s) for r, s in zip([0, *resumed], [*stops, None])]


def test_each_stop_checkpoints_and_the_requeued_job_resumes_there(job: Job) -> None:
    runs = phases(job)
    assert runs[0].stopped_at >= 2  # the first stop came after 2 logged iterations
    for earlier, later in itertools.pairwise(runs):
        assert later.resumed_from == earlier.stopped_at  # nothing completed was lost
    first = job.stops()[0]
    assert first.re is STOP_LINE and first[1] == first[2]  # checkpointed at its safe point
    assert job.text().count("SIGTERM (within openrlhf.stop_grace_s=") == 2  # each stop reached the driver
    assert job.text().count("stopped on SIGTERM: requeueing job") == 2  # not after the final scancel
    final = job.slurm.job(job.id)
    assert (final["JobState"], final["Restarts"]) == ("CANCELLED", "2")


def test_the_metrics_hold_every_iteration_once(job: Job) -> None:
    logged = job.iterations()
    assert logged == list(range(1, len(logged) + 1)), logged  # no gap, no duplicate
    assert len(logged) >= phases(job)[-1].resumed_from
    for row in read_metrics(job.run / "metrics.jsonl"):  # CRBC's figures and the keys' in every one
        assert 0.0 <= row["crbc/nonzero_step_credit_share"] <= 1.0 and "keys/level0/aliased_share" in row


def test_the_job_has_a_ray_temp_dir_of_its_own_and_leaves_no_process(job: Job) -> None:
    assert (job.slurm.root / f"ray-{job.id}").is_dir()
    deadline = time.monotonic() + 30  # Slurm's KillWait
    while (
        left := [p for p in job.slurm.job_processes() if p.name() != "slurmstepd"]
    ) and time.monotonic() < deadline:
        time.sleep(1)
    assert not left, [" ".join(p.cmdline())[:100] for p in left]
