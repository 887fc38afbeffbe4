"""The OpenRLHF backend on a real two-node Ray cluster, on CPU, as a cluster user launches it.

The module starts its own cluster on this machine: a head (3 CPUs, 1 logical GPU, the dashboard
and its job server) and a second node (2 CPUs, 1 logical GPU), each a ``ray start --block`` in a
session and temp dir of its own, stopped by pid. On it:

* a node without the shared storage (a third node in a mount namespace of its own, where the run
  folder's parent is an empty tmpfs) is named in one line before anything trains;
* ``ray job submit -- python -m hgpo_train --backend openrlhf ...`` trains with 2 DeepSpeed ranks
  and 2 vLLM engines spread over both nodes, until a job stop (SIGTERM, as a preemption; Ray's
  job SDK, as ``ray job stop``) stops it with a checkpoint;
* the same command run as a driver with ``RAY_ADDRESS`` and 1 rank resumes that 2-rank checkpoint
  (converted to DeepSpeed's universal checkpoint) and finishes the run.

Only what cannot run here is replaced (``hgpo_train.openrlhf.cpu``: CUDA calls, NCCL -> gloo).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import CPU_CONFIG

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' shared helpers

from ray_cluster import RAY_CLI, RayNode, wait_for_head, wait_for_nodes
from serve_helpers import free_port

from hgpo_train.run.provenance import RUN_INFO
from hgpo_train.run.tracking import read_metrics

LOGPROB_TOLERANCE = 0.02  # as in test_backend_cpu: synced engines stay far below it


@dataclass
class Cluster:
    address: str
    dashboard: str
    tmp: Path
    nodes: list[RayNode]


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    tmp = Path(tempfile.mkdtemp(prefix="hgpo-ray-"))  # short: Ray's socket paths are limited
    port, dashboard = free_port(), free_port()
    address = f"127.0.0.1:{port}"
    # ray job stop's SIGTERM is followed by SIGKILL after this many seconds (Ray's default: 3)
    stop_wait = {"RAY_JOB_STOP_WAIT_TIME_S": "60"}
    nodes = [RayNode(tmp, "head", 3, num_gpus=1, head_port=port, dashboard_port=dashboard, env=stop_wait)]
    try:
        wait_for_head(address)
        nodes.append(RayNode(tmp, "second", 2, num_gpus=1, join=address))
        wait_for_nodes(f"http://127.0.0.1:{dashboard}", 2, starting=nodes)
        yield Cluster(address, f"http://127.0.0.1:{dashboard}", tmp, nodes)
    finally:
        for node in nodes:
            node.kill()
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def shared(cluster: Cluster) -> Path:
    """The cluster's shared storage: a folder every node but the hidden one sees."""
    path = cluster.tmp / "shared"
    path.mkdir()
    return path


def command(warm_model: str, run: Path, *overrides: str) -> list[str]:
    """The backend's command on the CPU config, with the warm model and a run folder on shared storage."""
    return [
        sys.executable,
        "-m",
        "hgpo_train",
        "--backend",
        "openrlhf",
        "--config",
        str(CPU_CONFIG),
        f"model.name_or_path={warm_model}",
        f"train.output_dir={run}",
        "generation.constrained=false",  # the warm model's free responses: steps with advantages
        "update.lr=1e-3",
        "logging.tensorboard=false",
        *overrides,
    ]


REFUSAL_LIMIT_S = 600
"""How long a refused driver may run: its start (imports, the cluster's totals) takes a minute or
two on a busy 2-core machine; the placement wait it must not do is set far above this."""


def refused(cluster: Cluster, driver: list[str]) -> str:
    """Run a driver on the cluster that must stop with exit 2 without waiting for placement (its
    wait is set to 3 x REFUSAL_LIMIT_S, so a driver that waited times out here): its last line."""
    done = subprocess.run(
        [*driver, f"openrlhf.placement_timeout_s={3 * REFUSAL_LIMIT_S}"],
        env={**os.environ, "RAY_ADDRESS": cluster.address},
        capture_output=True,
        text=True,
        timeout=REFUSAL_LIMIT_S,
        check=False,
    )
    assert done.returncode == 2, done.stderr[-3000:]
    return done.stderr.strip().splitlines()[-1]


def test_a_node_without_the_shared_storage_is_named_before_training(
    cluster: Cluster, shared: Path, warm_model: str
) -> None:
    hidden = RayNode(cluster.tmp, "no-storage", 1, join=cluster.address, hide=shared)
    try:
        wait_for_nodes(cluster.dashboard, 3, starting=[hidden])
        last = refused(cluster, command(warm_model, shared / "unseen"))
    finally:
        hidden.kill()
    named = re.findall(r"node [\d.]+:\d+ ", last)
    assert last.startswith(f"error: {named[0]}cannot see the driver's run folder {shared / 'unseen'} "), last
    assert len(named) == 1, "only the node without the storage is named"
    assert "storage every node of the Ray cluster mounts" in last
    assert not (shared / "unseen" / "checkpoints").exists()


def test_a_run_no_node_has_room_for_is_refused_in_one_line(
    cluster: Cluster, shared: Path, warm_model: str
) -> None:
    """The cluster's 5 CPUs hold the run's 4.5 in sum, but no node has 2.5 left for the env worker
    once the controller and the policy bundle are placed, even with the cluster idle: Ray would
    wait for ever, the run refuses at once (not after openrlhf.placement_timeout_s)."""
    wait_for_nodes(cluster.dashboard, 2)  # the storage test's third node is gone
    last = refused(
        cluster,
        command(warm_model, shared / "unplaceable", "env.num_workers=1", "openrlhf.env_actor_cpus=2.5"),
    )
    assert last.startswith(
        "error: the run needs 4.5 CPU and 1 GPU, and env worker 0 fits no node of the Ray cluster even "
        "when it is idle: its 2 nodes have 5 CPU and 2 GPU in all ("
    ), last
    assert last.count(" CPU, ") == 2  # each node's resources


def test_a_run_bigger_than_the_cluster_is_refused_in_seconds(
    cluster: Cluster, shared: Path, warm_model: str
) -> None:
    """4 ranks on 2 nodes of 1 logical GPU each: no wait can place it, so there is none (the
    placement timeout is not waited for)."""
    wait_for_nodes(cluster.dashboard, 2)
    last = refused(
        cluster,
        command(
            warm_model,
            shared / "too-big",
            "openrlhf.num_nodes=2",
            "openrlhf.gpus_per_node=2",
            "openrlhf.vllm_num_engines=4",
        ),
    )
    assert last.startswith("error: the run needs ") and "4 GPU" in last, last
    assert "its 2 nodes have 5 CPU and 2 GPU in all" in last, last


ITERATIONS = 6  # the stop lands in iteration 3: margin for a fast machine
JOB = "hgpo-two-nodes"
JOB_START_S = 1500
"""How long the job may take to log 2 iterations: minutes on an idle 2-core machine (two vLLM
engines and two ranks starting), several times that on a busy one."""


@pytest.fixture(scope="module")
def job(cluster: Cluster, shared: Path, warm_model: str) -> tuple[Path, str]:
    """``ray job submit`` of a run with 2 ranks and 2 engines, stopped by a job stop (SIGTERM, as a
    preempted job) as soon as 2 iterations are logged; (run folder, job logs)."""
    # Ray's job SDK for status, stop and logs: what ``ray job ...`` calls, without a CLI start
    # (seconds on a busy 2-core machine) between seeing iteration 2 and stopping
    from ray.job_submission import JobStatus, JobSubmissionClient

    wait_for_nodes(cluster.dashboard, 2)  # the storage test's third node is gone
    run = shared / "run"
    entrypoint = command(
        warm_model,
        run,
        f"train.iterations={ITERATIONS}",
        "train.eval_every=0",
        "openrlhf.num_nodes=2",
        "openrlhf.vllm_num_engines=2",
    )
    submitted = subprocess.run(
        [*RAY_CLI, "job", "submit", f"--address={cluster.dashboard}", f"--submission-id={JOB}", "--no-wait"]
        + ["--", *entrypoint],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert submitted.returncode == 0, submitted.stderr[-3000:]
    client = JobSubmissionClient(cluster.dashboard)
    deadline = time.monotonic() + JOB_START_S
    while len(read_metrics(run / "metrics.jsonl") if (run / "metrics.jsonl").is_file() else []) < 2:
        status = client.get_job_status(JOB)
        assert status in (JobStatus.PENDING, JobStatus.RUNNING), client.get_job_logs(JOB)[-4000:]
        assert time.monotonic() < deadline, (
            f"the job logged no 2 iterations in {JOB_START_S} s:\n{client.get_job_logs(JOB)[-4000:]}"
        )
        time.sleep(0.2)
    assert client.stop_job(JOB)  # lands in iteration 3 (of ITERATIONS, several seconds each)
    while not (status := client.get_job_status(JOB)).is_terminal():
        assert time.monotonic() < deadline + 120, "the stopped job did not end"
        time.sleep(0.5)
    assert status == JobStatus.STOPPED
    return run, client.get_job_logs(JOB)


def actor_nodes(cluster: Cluster, class_name: str) -> set[str]:
    """The nodes the actors of ``class_name`` ran on (Ray's state API keeps dead actors; a class
    made inside a function is listed under its qualified name)."""
    from ray.util.state import list_actors

    actors = list_actors(address=cluster.dashboard, limit=10000)
    return {a.node_id for a in actors if a.class_name.split(".")[-1] == class_name}


@pytest.mark.timeout(JOB_START_S + 900)  # the job fixture's start is this test's setup
def test_ray_job_submit_trains_with_two_ranks_and_two_engines_on_two_nodes(
    cluster: Cluster, job: tuple[Path, str]
) -> None:
    run, logs = job
    assert len(actor_nodes(cluster, "PolicyModelActor")) == 2
    assert len(actor_nodes(cluster, "HGPORolloutActor")) == 2  # the engines
    metrics = [r for r in read_metrics(run / "metrics.jsonl") if r["iteration"] > 0]
    assert [r["iteration"] for r in metrics][:2] == [1, 2]
    for record in metrics:  # every engine holds the policy's weights after each sync
        assert record["engine_gap/mean_engine0"] < LOGPROB_TOLERANCE
        assert record["engine_gap/mean_engine1"] < LOGPROB_TOLERANCE
        assert record["rollout/step_samples"] > 0 and abs(record["update/pg_loss"]) > 0
    actor_dir = run / "checkpoints" / "openrlhf" / "_actor"
    step = actor_dir / (actor_dir / "latest").read_text().strip()
    assert sorted(p.name for p in step.glob("*optim_states.pt")) == [
        "zero_pp_rank_0_mp_rank_00_optim_states.pt",  # fp32 (the CPU config): no bf16_ prefix
        "zero_pp_rank_1_mp_rank_00_optim_states.pt",
    ]
    for line in (f"iteration 1/{ITERATIONS}, success ", f"iteration 2/{ITERATIONS}, success "):
        assert logs.count(line) == 1, (line, logs[-3000:])  # progress appears once, not once per node


def test_ray_job_stop_checkpoints_and_stops_the_job(job: tuple[Path, str]) -> None:
    """``ray job stop`` sends SIGTERM (then SIGKILL after the head's RAY_JOB_STOP_WAIT_TIME_S)."""
    run, logs = job
    found = re.search(r"stopped on request after iteration (\d+),", logs)
    assert found, logs[-4000:]
    stopped = int(found.group(1))
    assert 2 <= stopped < ITERATIONS and "re-run the same command to resume" in logs
    latest = run / "checkpoints" / "openrlhf" / "_actor" / "latest"
    assert latest.read_text().strip() == f"global_step{stopped}"
    logged = [r["iteration"] for r in read_metrics(run / "metrics.jsonl") if r["iteration"] > 0]
    assert logged == list(range(1, stopped + 1))
    info = json.loads((run / RUN_INFO).read_text().splitlines()[-1])
    assert info["policy_ranks"] == 2 and len(info["nodes"]) == 2
    assert info["packages"]["openrlhf"] == "0.11.2" and len(info["config_sha256"]) == 64


def test_a_one_rank_driver_resumes_the_two_rank_checkpoint(
    cluster: Cluster, job: tuple[Path, str], warm_model: str
) -> None:
    """Another shape after preemption: DeepSpeed alone refuses 2 shards on 1 rank (after starting
    everything); the backend converts the checkpoint to the universal format and resumes."""
    run, _ = job
    before = {r["iteration"]: r for r in read_metrics(run / "metrics.jsonl")}
    stopped = max(before)
    done = subprocess.run(
        command(warm_model, run, f"train.iterations={ITERATIONS}", "train.eval_every=0"),
        env={**os.environ, "RAY_ADDRESS": cluster.address},  # Ray's own convention, as --ray-address
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    actor_dir = run / "checkpoints" / "openrlhf" / "_actor"
    saved = sorted(str(p.relative_to(actor_dir)) for p in actor_dir.rglob("*"))
    resumed = [line for line in done.stderr.splitlines() if "resuming" in line or "converting" in line]
    assert done.returncode == 0, (saved, resumed, done.stderr[-3000:])
    assert "saved by 2 policy ranks and this run has 1: converting it" in done.stderr
    assert f"global_step{stopped}_universal (iteration {stopped})" in done.stderr
    shown = done.stdout + done.stderr
    assert shown.count(f"iteration {ITERATIONS}/{ITERATIONS}, success ") == 1, shown[-3000:]
    metrics = read_metrics(run / "metrics.jsonl")
    assert [r["iteration"] for r in metrics] == list(range(1, ITERATIONS + 1))  # no gap, no duplicate
    # the resumed policy is the trained one, not the base model: it starts further from the reference
    assert metrics[stopped]["update/kl_ref"] > before[1]["update/kl_ref"]
    step = actor_dir / f"global_step{ITERATIONS}"
    assert [p.name for p in step.glob("*optim_states.pt")] == ["zero_pp_rank_0_mp_rank_00_optim_states.pt"]
    info = [json.loads(line) for line in (run / RUN_INFO).read_text().splitlines()]
    assert [i["policy_ranks"] for i in info] == [2, 1]
