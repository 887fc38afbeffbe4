"""The cluster launchers in scripts/launch stay true to the configs they launch.

What can be checked without a GPU or Kubernetes: each launcher's driver command resolves, with
OpenRLHF's own parser (``--dry-run``, GPU packages stubbed), the GPUs the launcher requests are
the GPUs the config places, and the KubeRay manifest routes a pod's stop to the driver with its
grace periods in order. The Slurm template runs under a real Slurm in
tests/openrlhf_cpu/test_slurm_cpu.py; nodes joining, the driver on the head, ``ray job submit``
and SIGTERM on a real 2-node CPU cluster in tests/openrlhf_cpu/test_cluster_cpu.py.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
import yaml
from openrlhf_runs import load_run

from hgpo_train.cli import main
from hgpo_train.openrlhf.backend import required_gpus

REPO = Path(__file__).resolve().parents[1]
LAUNCH = REPO / "scripts" / "launch"
IMAGE_CHECKOUT = "/workspace/hgpo"
"""Where the manifest's image has the project."""
SBATCH = LAUNCH / "slurm_openrlhf.sbatch"
RAYJOB = LAUNCH / "kuberay_rayjob.yaml"


def dry_run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--backend", "openrlhf", *argv, "--dry-run"]) == 0, capsys.readouterr().err
    assert "openrlhf_command" in capsys.readouterr().out


def sbatch_examples() -> list[tuple[int, str]]:
    """(GPUs per node, config) of each single-node example in the script's header."""
    text = SBATCH.read_text()
    default_gpus = int(re.search(r"#SBATCH --gpus-per-node=(\d+)", text).group(1))
    default_config = re.search(r"CONFIG=\$\{1:-([^}]+)\}", text).group(1)
    examples = [(default_gpus, default_config)]
    for gpus, config in re.findall(r"--gpus-per-node=(\d+) scripts/launch/\S+ \\\n#\s+(configs/\S+)", text):
        examples.append((int(gpus), config))
    return examples


def test_the_slurm_script_parses_and_requests_the_configs_gpus(capsys: pytest.CaptureFixture[str]) -> None:
    subprocess.run(["bash", "-n", str(SBATCH)], check=True)
    examples = sbatch_examples()
    assert [gpus for gpus, _ in examples] == [2, 4]
    for gpus, config in examples:
        assert required_gpus(*load_run(config)) == gpus, config
        dry_run(["--config", config], capsys)


def rayjob() -> tuple[dict, list[str]]:
    """The manifest, and its entrypoint's arguments after ``--backend openrlhf``, with the config
    path as the image has it (/workspace/hgpo) read from this checkout."""
    job = yaml.safe_load(RAYJOB.read_text())
    words = shlex.split(job["spec"]["entrypoint"])
    assert words[:5] == ["python", "-m", "hgpo_train", "--backend", "openrlhf"]
    return job, [w.replace(IMAGE_CHECKOUT, str(REPO)) for w in words[5:]]


def test_the_rayjob_manifest_requests_the_configs_gpus(capsys: pytest.CaptureFixture[str]) -> None:
    job, argv = rayjob()
    assert (job["apiVersion"], job["kind"]) == ("ray.io/v1", "RayJob")
    config, cluster = load_run(argv[argv.index("--config") + 1], [w for w in argv if "=" in w])
    spec = job["spec"]["rayClusterSpec"]
    assert spec["headGroupSpec"]["rayStartParams"]["num-gpus"] == "0"
    workers = spec["workerGroupSpecs"]
    started = sum(w["replicas"] * int(w["rayStartParams"]["num-gpus"]) for w in workers)
    assert started == required_gpus(config, cluster)
    for group in [spec["headGroupSpec"], *workers]:  # every pod mounts the run folder's volume
        pod = group["template"]["spec"]
        mounts = [m["mountPath"] for c in pod["containers"] for m in c["volumeMounts"]]
        assert any(config.train.output_dir.startswith(m + "/") for m in mounts)
        assert pod["terminationGracePeriodSeconds"] > cluster.stop_grace_s  # room to checkpoint
    for w in workers:
        limit = w["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]
        assert limit == int(w["rayStartParams"]["num-gpus"])
    dry_run(argv, capsys)


def pods(job: dict) -> list[dict]:
    spec = job["spec"]["rayClusterSpec"]
    return [group["template"]["spec"] for group in [spec["headGroupSpec"], *spec["workerGroupSpecs"]]]


def test_the_rayjob_manifest_stops_the_driver_before_its_pods_go() -> None:
    """A preempted pod's SIGTERM reaches ``ray start``, not the driver: each pod's preStop hook asks
    the run to stop and waits for it, inside the grace period; Ray's job-stop wait exceeds the
    trainer's SIGTERM grace; a stopped run is retried, and resumes from the run folder."""
    job, argv = rayjob()
    config, cluster = load_run(argv[argv.index("--config") + 1], [w for w in argv if "=" in w])
    run_dir = config.train.output_dir
    assert Path(run_dir).is_absolute() and argv[argv.index("--config") + 1].startswith(str(REPO))
    assert "working_dir" not in job["spec"].get(
        "runtimeEnvYAML", ""
    )  # it would upload the submitter's folder
    assert job["spec"]["backoffLimit"] >= 1
    for pod in pods(job):
        for container in pod["containers"]:
            hook = container["lifecycle"]["preStop"]["exec"]["command"]
            assert hook[:5] == ["python", "-m", "hgpo_train", "stop", run_dir], hook
            assert hook[5] == "--wait" and 0 < float(hook[6]) < pod["terminationGracePeriodSeconds"]
    head = pods(job)[0]["containers"][0]
    env = {e["name"]: e["value"] for e in head["env"]}
    stop_wait = float(env["RAY_JOB_STOP_WAIT_TIME_S"])  # SIGTERM -> SIGKILL of `ray job stop`
    assert cluster.stop_grace_s < stop_wait < pods(job)[0]["terminationGracePeriodSeconds"]


def test_the_rayjob_gpu_workers_have_a_memory_backed_shm() -> None:
    job, _ = rayjob()
    workers = [
        p for p in pods(job)[1:] if any("nvidia.com/gpu" in c["resources"]["limits"] for c in p["containers"])
    ]
    assert workers
    for pod in workers:
        memory = {v["name"] for v in pod["volumes"] if v.get("emptyDir", {}).get("medium") == "Memory"}
        for container in pod["containers"]:
            assert any(
                m["mountPath"] == "/dev/shm" and m["name"] in memory for m in container["volumeMounts"]
            )


def forwarding_step(tmp_path: Path) -> tuple[subprocess.Popen, psutil.Process, Path]:
    """The template's watcher step (its ``FORWARD_TERM``, run as its ``srun`` runs it) under a
    stand-in for the batch script that records the SIGTERM it is passed."""
    line = re.search(r"^FORWARD_TERM=.*$", SBATCH.read_text(), re.MULTILINE)
    assert line, "the template no longer defines its watcher step as FORWARD_TERM"
    received = tmp_path / "received"
    batch = f"""trap 'echo TERM > {shlex.quote(str(received))}; exit 0' TERM
{line[0]}
bash -c "$FORWARD_TERM" &
while :; do sleep 0.05; done"""
    script = subprocess.Popen(["bash", "-c", batch], start_new_session=True)
    deadline = time.monotonic() + 30
    while not (steps := bash_children(script.pid)) or not steps[0].children():  # the step, its sleep
        assert script.poll() is None and time.monotonic() < deadline, "the watcher step did not start"
        time.sleep(0.02)
    return script, steps[0], received


def bash_children(pid: int) -> list[psutil.Process]:
    """The bash processes among ``pid``'s children (its short sleeps may end while looked at)."""
    found = []
    for child in psutil.Process(pid).children():
        with contextlib.suppress(psutil.NoSuchProcess):
            if child.name() == "bash":
                found.append(child)
    return found


def in_group(pgid: int) -> list[str]:
    """The processes still in process group ``pgid``."""
    left = []
    for process in psutil.process_iter(["name"]):
        with contextlib.suppress(ProcessLookupError, psutil.NoSuchProcess):
            if os.getpgid(process.pid) == pgid and process.status() != psutil.STATUS_ZOMBIE:
                left.append(process.info["name"])
    return left


@pytest.mark.parametrize("order", ["its sleep first", "the step first"])
def test_the_slurm_watcher_step_passes_sigterm_on_whoever_slurm_signals_first(
    tmp_path: Path, order: str
) -> None:
    """``scancel --signal=TERM`` signals every process of the step, children first (Slurm's
    proctrack/linuxproc walks the tree leaves first), and on a busy node the step's own signal may
    come much later. A watcher that ended with its sleep was gone by then: the TERM was lost, the
    driver trained on, and the time limit killed it without a checkpoint at its safe point."""
    script, step, received = forwarding_step(tmp_path)
    try:
        sleep = step.children()[0]
        first, then = (sleep, step) if order == "its sleep first" else (step, sleep)
        first.send_signal(signal.SIGTERM)
        time.sleep(0.5)  # the moment that lost it: the step's TERM half a second after its sleep's
        with contextlib.suppress(psutil.NoSuchProcess):
            then.send_signal(signal.SIGTERM)
        assert script.wait(timeout=10) == 0 and received.read_text() == "TERM\n"
        deadline = time.monotonic() + 10
        while (left := in_group(script.pid)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not left, f"the watcher step or its sleeps outlived the stop: {left}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(script.pid, signal.SIGKILL)
        script.wait()
