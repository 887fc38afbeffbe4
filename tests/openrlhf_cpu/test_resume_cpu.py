"""The README's CPU command, run verbatim, killed after a checkpoint and run again, resumes.

The command is read from the README (``.venv-openrlhf/bin/python`` is this interpreter) and run
in a scratch working directory whose ``configs`` is the repository's, so its run folder
(``runs/openrlhf_rooms_cpu``, the tiny model built into it) lands there. Its process group is
SIGKILLed during start-up; then the driver alone once DeepSpeed has written the checkpoint of
iteration 1: everything it started (its Ray cluster, the actors, vLLM's engine core and workers)
must be gone within seconds, without anyone else stopping it; then the next run's whole process
group a few seconds after its first checkpoint. The same command then says it resumes, trains the
remaining iterations, and ``metrics.jsonl`` has each iteration once, evaluations included.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import yaml
from conftest import CPU_CONFIG, REPO

from hgpo_train.run.provenance import RUN_INFO, config_hash
from hgpo_train.run.tracking import read_metrics

ITERATIONS = yaml.safe_load(CPU_CONFIG.read_text())["train"]["iterations"]
LONG_GRACE_S = 300
"""``openrlhf.stop_grace_s`` of a run that must be let finish its update however busy the machine."""
OUTLIVE_S = 10.0
"""How long what the driver started may outlive it (the watchdog's poll and grace periods)."""


def readme_command() -> list[str]:
    """The README's command for the CPU backend, with this interpreter for ``.venv-openrlhf/bin/python``."""
    text = (REPO / "README.md").read_text()
    found = re.search(r"`(\.venv-openrlhf/bin/python -m hgpo_train --backend openrlhf --config [^`]+)`", text)
    assert found, "the README no longer documents the CPU backend's command"
    assert found.group(1).endswith(str(CPU_CONFIG.relative_to(REPO))), found.group(1)  # the first: validation
    words = shlex.split(found.group(1))
    return [sys.executable, *words[1:]]


def wait_for_checkpoint(latest: Path, proc: subprocess.Popen, timeout: float = 420) -> None:
    deadline = time.monotonic() + timeout
    while not (latest.is_file() and latest.read_text().strip()):
        assert proc.poll() is None, f"the run ended (rc {proc.returncode}) before its first checkpoint"
        assert time.monotonic() < deadline, "no checkpoint within the timeout"
        time.sleep(0.2)


def command_line(process: psutil.Process) -> str:
    try:
        return " ".join(process.cmdline()) or process.name()
    except psutil.NoSuchProcess:
        return ""


def test_readme_command_killed_and_run_again_resumes(ray_tmp: str, tmp_path: Path) -> None:
    """Killed three times, then run to the end: its whole process group while Ray and the actors
    start, the driver alone once the first checkpoint is written (what it started must go too),
    then the whole process group a few seconds after the next run's first checkpoint. The last run
    resumes and every iteration is in the record once."""
    (tmp_path / "configs").symlink_to(REPO / "configs")
    out = tmp_path / yaml.safe_load(CPU_CONFIG.read_text())["train"]["output_dir"]
    env = {**os.environ, "RAY_TMPDIR": ray_tmp}
    latest = out / "checkpoints" / "openrlhf" / "_actor" / "latest"
    # start-up: the console is set up (driver.log), then Ray, the engines and the actors start
    assert kill_group_after(
        readme_command(), tmp_path, env, tmp_path / "startup.log", out / "driver.log", 5.0
    )
    with open(tmp_path / "first.log", "w") as log:
        first = subprocess.Popen(
            readme_command(), cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT
        )
        try:
            wait_for_checkpoint(latest, first)
            started = psutil.Process(first.pid).children(recursive=True)
            commands = [command_line(p) for p in started]
        finally:
            first.send_signal(signal.SIGKILL)
            first.wait()
    assert any("raylet" in c for c in commands), commands  # the run started its own Ray head
    _, alive = psutil.wait_procs(started, timeout=OUTLIVE_S)
    alive = [p for p in alive if p.is_running()]
    assert not alive, f"outlived the driver by {OUTLIVE_S} s: {[(p.pid, p.name()) for p in alive]}"

    # the whole process group (as an OOM killer or a lost node), a few seconds after this run's
    # first checkpoint: in an evaluation or the next update (issue 64 lost that iteration's line)
    assert kill_group_after(readme_command(), tmp_path, env, tmp_path / "second.log", latest, 3.0)
    saved = int(latest.read_text().strip().removeprefix("global_step"))
    assert 2 <= saved < ITERATIONS, "killed before the run ended"
    again = subprocess.run(
        readme_command(), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=540, check=False
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"(iteration {saved})" in again.stderr and "resuming from " in again.stderr
    shown = again.stdout + again.stderr  # the trainer actor's progress, relayed by Ray
    assert f"iteration {saved + 1}: update on " in shown and f"iteration {ITERATIONS}/{ITERATIONS}, " in shown
    # a quiet console: the libraries' output (the model's repr, OpenRLHF's arguments) only in the log
    log = (out / "driver.log").read_text()
    for dump in ("PolicyModelActor", "Qwen2ForCausalLM(", "namespace("):
        assert dump in log and dump not in shown, dump
    assert len(shown.splitlines()) < 15 * ITERATIONS, shown[-3000:]
    records = read_metrics(out / "metrics.jsonl")
    assert [r["iteration"] for r in records] == list(range(ITERATIONS + 1)), records  # no gap, no duplicate
    assert all("eval/success_rate" in r for r in records if r["iteration"] % 2 == 0)  # eval_every: 2
    assert (out / "final_model" / "config.json").is_file() and not (out / "final_model.partial").exists()
    # provenance hashes the config as given (a relative run folder), as config.yaml holds it
    info = [json.loads(line) for line in (out / RUN_INFO).read_text().splitlines()]
    assert {i["config_sha256"] for i in info} == {
        config_hash(yaml.safe_load((out / "config.yaml").read_text()))
    }


def fingerprint(path: Path) -> tuple[int, str] | None:
    """A file's modification time and text, None while it does not exist."""
    try:
        return path.stat().st_mtime_ns, path.read_text()
    except FileNotFoundError:
        return None


def kill_group_after(
    command: list[str], cwd: Path, env: dict[str, str], log_path: Path, watched: Path, delay: float
) -> bool:
    """Run ``command`` and SIGKILL its whole process group (as an OOM killer or a lost node does)
    ``delay`` seconds after ``watched`` changes; False when the run ended first. Waits until what
    the run started has stopped (its watchdog's work)."""
    before = fingerprint(watched)
    with open(log_path, "a") as log:
        process = subprocess.Popen(
            command, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    deadline = time.monotonic() + 540
    try:
        while fingerprint(watched) == before:
            if process.poll() is not None:
                assert process.returncode == 0, log_path.read_text()[-3000:]
                return False
            assert time.monotonic() < deadline, f"{watched} never changed"
            time.sleep(0.05)
        time.sleep(delay)
        if process.poll() is not None:
            return False
        started = psutil.Process(process.pid).children(recursive=True)
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=60)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    _, alive = psutil.wait_procs(started, timeout=OUTLIVE_S)
    assert not [p for p in alive if p.is_running()], "the killed run left processes behind"
    return True


@dataclass
class Signalled:
    """A run sent SIGTERM: its exit code, output, seconds from the signal to the exit, and the
    processes it had started."""

    returncode: int
    said: str
    took: float
    started: list[psutil.Process]


def start_and_signal(command: list[str], cwd: Path, log_path: Path, when: str) -> Signalled:
    """Start ``command`` and SIGTERM it once its output shows ``when``; it must exit within
    :data:`LONG_GRACE_S` and a minute."""
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, cwd=cwd, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 420
        while when not in log_path.read_text():
            assert process.poll() is None and time.monotonic() < deadline, f"no {when!r}"
            time.sleep(0.05)
        started = psutil.Process(process.pid).children(recursive=True)
        process.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        process.wait(timeout=LONG_GRACE_S + 60)
    return Signalled(process.returncode, log_path.read_text(), time.monotonic() - signalled, started)


def test_sigterm_in_a_rollout_or_an_update_loses_no_completed_iteration(ray_tmp: str, tmp_path: Path) -> None:
    """Preemption (Slurm, Kubernetes): SIGTERM to the driver, with periodic checkpoints off.

    Asynchronous, in iteration 2's rollout, which runs during update 1: the rollout is abandoned
    at once, the update finishes within the grace period and is checkpointed, and the run stops
    there. Then, resumed synchronously, in iteration 3's update with no grace at all
    (``openrlhf.stop_grace_s=0``, as an update longer than the grace): the driver exits at once,
    and iteration 2 is kept (every iteration is checkpointed). A third run finishes,
    asynchronously (``train.async_staleness=1``) with the off-policy correction.
    """
    (tmp_path / "configs").symlink_to(REPO / "configs")
    out = tmp_path / "run"
    command = [*readme_command(), f"train.output_dir={out}", "train.save_every=0", "train.eval_every=0"]
    # episodes of up to 48 turns: iteration 2's rollout starts with update 1, which is long (500+
    # steps), so the signal, sent when the relayed progress line shows that rollout's first turn,
    # lands in both; the grace covers the update on a busy CPU
    first = start_and_signal(
        [*command, "env.max_steps=48", "train.async_staleness=1", f"openrlhf.stop_grace_s={LONG_GRACE_S}"],
        tmp_path,
        tmp_path / "first.log",
        "iteration 2 rollout: turn",
    )
    assert first.returncode == 130, first.said[-3000:]
    assert "no safe point" not in first.said and "iteration 1: update on " in first.said
    assert (
        "stopped on request after iteration 1, checkpointed (global_step1); re-run the same command "
        "to resume" in first.said
    ), first.said[-3000:]
    assert "iteration 2: update" not in first.said  # the abandoned rollout was never trained on
    latest = out / "checkpoints" / "openrlhf" / "_actor" / "latest"
    assert latest.read_text().strip() == "global_step1"
    _, alive = psutil.wait_procs(first.started, timeout=OUTLIVE_S)
    assert not [p for p in alive if p.is_running()], "the stopped run left processes behind"

    # back to the config's short episodes (whose update still takes seconds): a resume that asks
    second = start_and_signal(
        [*command, "openrlhf.stop_grace_s=0", "--allow-config-change"],
        tmp_path,
        tmp_path / "second.log",
        "iteration 3: update on ",
    )
    said = second.said
    assert second.returncode == 143 and "(iteration 1)" in said, said[-3000:]
    found = re.search(
        r"no safe point within openrlhf.stop_grace_s=0 s: stopping now; re-running the same command "
        r"resumes from global_step(\d)",
        said,
    )
    assert found and int(found[1]) >= 2, said[-3000:]  # 3 only if a loaded machine was slow to exit
    kept = sorted(p.name for p in latest.parent.glob("global_step*"))
    assert kept == [f"global_step{found[1]}"], kept  # save_every=0 keeps only the newest

    # the rest asynchronously (OpenRLHF's async mode: the engine apart from the policy, the sync
    # over the broadcast group): the first rollout fresh, then each sampled during the update
    # before it, one version behind; OpenRLHF's correction weighs the stale tokens by the
    # engine's log-probs of them, which on the fresh rollout are the policy's
    asynchronous = [
        *command,
        "train.async_staleness=1",
        "update.off_policy_correction=tis",
        "--allow-config-change",
    ]
    third = subprocess.run(
        asynchronous, cwd=tmp_path, capture_output=True, text=True, timeout=540, check=False
    )
    assert third.returncode == 0, third.stderr[-3000:]
    assert f"(iteration {found[1]})" in third.stderr and "(asynchronous)" in third.stderr
    records = read_metrics(out / "metrics.jsonl")
    assert [r["iteration"] for r in records] == list(range(1, ITERATIONS + 1))  # no gap, no duplicate
    resumed = [r for r in records if r["iteration"] > int(found[1])]
    assert [r["rollout/staleness_max"] for r in resumed] == [0] + [1] * (len(resumed) - 1), resumed
    assert all(r["engine_gap/mean"] < 1e-3 for r in resumed)  # the engine follows every sync
    # constrained, at the run's temperature: the engine's recorded log-probs are the ones DeepSpeed scores
    assert abs(resumed[0]["update/behaviour_kl"]) < 1e-3, resumed[0]
    assert all(0 <= r["update/off_policy_filtered"] <= 1 for r in resumed)


def test_sigterm_before_the_run_started_is_one_line(ray_tmp: str, tmp_path: Path) -> None:
    """SIGTERM while the driver connects to Ray and starts the actors (a job stopped early)."""
    out = tmp_path / "run"
    command = [*readme_command(), f"train.output_dir={out}"]
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (out / "driver.log").is_file():  # the run's console is set up: Ray starts next
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()
        time.sleep(0.05)
    started = psutil.Process(process.pid).children(recursive=True)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr[-3000:]
    assert "Traceback" not in stderr
    assert "stopped; re-run the same command to start" in stderr.strip().splitlines()[-3:], stderr[-3000:]
    _, alive = psutil.wait_procs(started, timeout=OUTLIVE_S)
    assert not [p for p in alive if p.is_running()], "the stopped run left processes behind"
