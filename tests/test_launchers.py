"""The cluster launchers in scripts/launch stay true to the configs they launch.

What can be checked without Slurm or Kubernetes: each launcher's driver command resolves, with
OpenRLHF's own parser (``--dry-run``, GPU packages stubbed), and the GPUs the launcher requests
are the GPUs the config places. The launch sequence itself (nodes joining, the driver on the
head, ``ray job submit``, SIGTERM) runs on a real 2-node CPU cluster in
tests/openrlhf_cpu/test_cluster_cpu.py.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from hgpo_train.__main__ import main
from hgpo_train.openrlhf.cli import required_gpus
from hgpo_train.openrlhf.settings import load_run

LAUNCH = Path(__file__).resolve().parents[1] / "scripts" / "launch"
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


def test_the_rayjob_manifest_requests_the_configs_gpus(capsys: pytest.CaptureFixture[str]) -> None:
    job = yaml.safe_load(RAYJOB.read_text())
    assert (job["apiVersion"], job["kind"]) == ("ray.io/v1", "RayJob")
    words = shlex.split(job["spec"]["entrypoint"])
    assert words[:4] == ["python", "-m", "hgpo_train", "--backend"]
    argv = words[5:]  # after "--backend openrlhf"
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
