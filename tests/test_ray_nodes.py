"""GroupedEnvPool on a two-node Ray cluster that loses a node mid-step.

The test starts its own Ray nodes on this machine (``ray start --block``, each in its own session
with its own temp dir, bound to 127.0.0.1) and kills only the processes it started.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

TESTS_DIR = str(Path(__file__).resolve().parent)
REPO_DIR = str(Path(__file__).resolve().parents[1])
if TESTS_DIR not in sys.path:
    sys.path.insert(0, TESTS_DIR)

from ray._private.state import available_resources_per_node  # as the pool itself reads it
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from ray_cluster import RayNode, wait_for_head
from serve_helpers import free_port

from hgpo_env.vector import GroupedEnvPool, PoolError

PROBE = "pool_test_envs:Probe-v0"


def wait_for_new_node(known: set[str], joining: RayNode, timeout: float = 300.0) -> str:
    """The id of a live node not in ``known``, once Ray lists one: long on a busy machine, at
    once (with its log) if ``joining`` exits first."""
    deadline = time.monotonic() + timeout
    while True:
        new = [n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeID"] not in known]
        if new:
            return new[0]
        assert joining.process.poll() is None, f"the new Ray node exited:\n{joining.log_tail()}"
        assert time.monotonic() < deadline, (
            f"the new Ray node did not join: {ray.nodes()}\n{joining.log_tail()}"
        )
        time.sleep(0.5)


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[list[RayNode], str, Path]]:
    # A short folder: Ray's unix sockets live under it, and their paths are limited to 107 bytes.
    tmp = Path(tempfile.mkdtemp(prefix="hgpo-ray-"))
    port = free_port()
    address = f"127.0.0.1:{port}"
    nodes = [RayNode(tmp, "head", 3, head_port=port)]
    try:
        wait_for_head(address)
        nodes.append(RayNode(tmp, "second", 2, join=address))
        job = ray.job_config.JobConfig(code_search_path=[TESTS_DIR, REPO_DIR])
        ray.init(address=address, job_config=job)
        wait_for_new_node({ray.get_runtime_context().get_node_id()}, nodes[1])
        yield nodes, address, tmp
    finally:
        ray.shutdown()
        for node in nodes:
            node.kill()
        shutil.rmtree(tmp, ignore_errors=True)


@ray.remote(num_cpus=1)
class Placeholder:
    """Holds one CPU of the node it is pinned to."""

    def ready(self) -> bool:
        return True


def head_free_cpus(head: str) -> float:
    return available_resources_per_node().get(head, {}).get("CPU", 0.0)


def pool_split_over(second: RayNode) -> tuple[GroupedEnvPool, set[int]]:
    """4 workers, 2 on the head (3 CPUs) and 2 on ``second`` (2 CPUs), env i on worker i % 4; and
    the workers on ``second``. Ray's SPREAD is best effort (on a busy machine it put 1 of 4, or
    none, on the second node), so while the pool starts a placeholder holds one head CPU: 4 workers
    then fit only as 2 and 2. The placeholder's CPU is the head's room for one replacement later."""
    head = next(n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("CPU") == 3.0)
    on_head = NodeAffinitySchedulingStrategy(node_id=head, soft=False)
    placeholder = Placeholder.options(scheduling_strategy=on_head).remote()
    ray.get(placeholder.ready.remote(), timeout=120)
    pool = GroupedEnvPool(PROBE, 4, 2, num_workers=4, backend="ray", step_timeout=30, reset_timeout=300)
    pool.reset()
    on_second = {w for w, pid in enumerate(pool.worker_pids()) if pid in second.pids()}
    assert len(on_second) == 2, pool.worker_pids()
    ray.kill(placeholder)
    deadline = time.monotonic() + 60
    while head_free_cpus(head) < 1.0:
        assert time.monotonic() < deadline, "the placeholder's CPU did not come back"
        time.sleep(0.25)
    return pool, on_second


def test_lost_node_ends_only_its_episodes(cluster: tuple[list[RayNode], str, Path]) -> None:
    nodes, address, tmp = cluster
    second = nodes[1]
    pool, on_second = pool_split_over(second)
    with pool:
        pool.step({i: "tick" for i in range(8)})
        second_pids = second.pids()

        second.kill()
        started = time.monotonic()
        results = pool.step({i: "tick" for i in range(8)})
        assert time.monotonic() - started < 30
        for result in results:
            if pool.worker_of(result.env_index) in on_second:
                assert result.truncated and "worker" in result.info["env_error"]
            else:  # the live node's episodes go on
                assert not result.truncated and result.info["state_text"] == "Count 2."
        # The head had room for one replacement; the other is down and says what is missing.
        assert sum(pid == -1 for pid in pool.worker_pids()) == 1
        assert not second_pids & set(pool.worker_pids())

        started = time.monotonic()
        with pytest.raises(PoolError, match=r"no live Ray node has \{'CPU': 1.0\} free"):
            pool.reset()
        assert time.monotonic() - started < 60  # not a start timeout per env

        known = {n["NodeID"] for n in ray.nodes()}
        nodes.append(RayNode(tmp, "third", 1, join=address))  # capacity comes back
        wait_for_new_node(known, nodes[-1])
        pool.reset()
        assert -1 not in pool.worker_pids()
        assert [r.info["state_text"] for r in pool.step({i: "tick" for i in range(8)})] == ["Count 1."] * 8
