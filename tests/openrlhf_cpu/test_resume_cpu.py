"""The documented CPU command, killed after a checkpoint and run again, resumes where it stopped.

The driver (``python -m hgpo_train --backend openrlhf``) is SIGKILLed once DeepSpeed has written
the checkpoint of iteration 1; the processes it started (its Ray cluster, the actors, vLLM's
engine core) are then killed by pid, as a crashed node would lose them. The same command then
says it resumes, trains the remaining iterations, and ``metrics.jsonl`` has each iteration once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
from conftest import CPU_CONFIG, REPO

from hgpo_train.tracking import read_metrics

ITERATIONS = 3


def command(model: str, out: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "hgpo_train",
        "--backend",
        "openrlhf",
        "--config",
        str(CPU_CONFIG),
        f"model.name_or_path={model}",
        f"train.output_dir={out}",
        f"train.iterations={ITERATIONS}",
        "train.eval_every=0",
        "logging.tensorboard=false",
    ]


def wait_for_checkpoint(latest: Path, proc: subprocess.Popen, timeout: float = 420) -> None:
    deadline = time.monotonic() + timeout
    while not (latest.is_file() and latest.read_text().strip()):
        assert proc.poll() is None, f"the run ended (rc {proc.returncode}) before its first checkpoint"
        assert time.monotonic() < deadline, "no checkpoint within the timeout"
        time.sleep(0.2)


def kill_with_descendants(pid: int) -> None:
    """SIGKILL ``pid`` and every process it started (by pid: nothing else on the machine)."""
    root = psutil.Process(pid)
    family = [root, *root.children(recursive=True)]
    for proc in family:
        try:
            proc.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(family, timeout=30)
    assert not alive, f"still running: {alive}"


def test_killed_driver_resumes_from_its_checkpoint(warm_model: str, ray_tmp: str, tmp_path: Path) -> None:
    out = tmp_path / "run"
    env = {**os.environ, "RAY_TMPDIR": ray_tmp}
    latest = out / "checkpoints" / "openrlhf" / "_actor" / "latest"
    with open(tmp_path / "first.log", "w") as log:
        first = subprocess.Popen(
            command(warm_model, out), cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT
        )
        try:
            wait_for_checkpoint(latest, first)
        finally:
            kill_with_descendants(first.pid)
            first.wait()
    saved = int(latest.read_text().strip().removeprefix("global_step"))
    assert 1 <= saved < ITERATIONS, "killed before the run ended"
    again = subprocess.run(
        command(warm_model, out), cwd=REPO, env=env, capture_output=True, text=True, timeout=540, check=False
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"resuming from {latest.parent / f'global_step{saved}'} (iteration {saved})" in again.stderr
    shown = again.stdout + again.stderr  # the trainer actor's progress, relayed by Ray
    assert (
        f"iteration {saved + 1} rollout: turn 1, " in shown and f"iteration {saved + 1}: update on " in shown
    )
    logged = [r["iteration"] for r in read_metrics(out / "metrics.jsonl")]
    assert logged == list(range(1, ITERATIONS + 1)), logged  # no gap, no duplicate
    assert (out / "final_model" / "config.json").is_file()
