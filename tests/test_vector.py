"""GroupedEnvPool: task groups, partial stepping, equality with in-process envs, contained faults
and clean shutdown, for the process backend and the Ray backend (one local cluster per module)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import psutil
import pytest

TESTS_DIR = str(Path(__file__).resolve().parent)
REPO_DIR = str(Path(__file__).resolve().parents[1])
if TESTS_DIR not in sys.path:  # workers import the probe env by module name and inherit sys.path
    sys.path.insert(0, TESTS_DIR)

from pool_test_envs import make_probe

import hgpo_env  # noqa: F401  -- registers HGPO-Rooms-v0 for the in-process reference
from hgpo_env.vector import GroupedEnvPool, GroupMismatchError, PoolError

PROBE = "pool_test_envs:Probe-v0"


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")
    # Actors must import hgpo_env and the probe env; a search path keeps Ray's prestarted workers
    # usable (a runtime_env would start a fresh worker, seconds, for every actor).
    job = ray.job_config.JobConfig(code_search_path=[TESTS_DIR, REPO_DIR])
    ray.init(num_cpus=2, include_dashboard=False, job_config=job)
    yield
    ray.shutdown()


@pytest.fixture(params=["process", "ray"])
def backend(request: pytest.FixtureRequest) -> str:
    if request.param == "ray":
        request.getfixturevalue("ray_cluster")
    return request.param


def probe_pool(backend: str, num_groups: int = 2, group_size: int = 2, **kwargs) -> GroupedEnvPool:
    """Env i lives on worker i % 2."""
    return GroupedEnvPool(PROBE, num_groups, group_size, num_workers=2, backend=backend, **kwargs)


def assert_gone(pids: list[int], timeout: float = 10.0) -> None:
    """Every pid has exited (and been reaped) within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [pid for pid in alive if psutil.pid_exists(pid)]
    assert not alive, f"processes still alive: {alive}"


def response(command: str) -> str:
    return f"<think>deciding</think><action>{command}</action>"


# --------------------------------------------------------------------- behaviour, both backends
def test_group_members_share_task_and_initial_fingerprint(backend: str) -> None:
    with GroupedEnvPool("HGPO-Rooms-v0", 3, 4, num_workers=2, seed=1, backend=backend) as pool:
        assert (pool.num_envs, pool.num_groups, pool.group_size, pool.num_workers) == (12, 3, 4, 2)
        results = pool.reset()
        assert [r.env_index for r in results] == list(range(12))
        tasks = []
        for group in range(3):
            members = [results[i] for i in pool.members(group)]
            assert [(r.group, r.member) for r in members] == [(group, m) for m in range(4)]
            assert len({r.info["initial_fingerprint"] for r in members}) == 1
            assert len({r.obs for r in members}) == 1
            assert {pool.worker_of(r.env_index) for r in members} == {0, 1}  # each group spans both workers
            tasks.append(members[0].info["task"])
        assert len(set(tasks)) == 3  # drawn seeds give each group its own task
        results = pool.reset(task_ids=[5, 5, 7], seeds=[0, 1, 2])
        fingerprints = [results[pool.members(g)[0]].info["initial_fingerprint"] for g in range(3)]
        assert fingerprints[0] == fingerprints[1] != fingerprints[2]
        assert pool.running == list(range(12))


def test_partial_steps_equal_in_process_envs(backend: str) -> None:
    """Same seeds, same actions, random subsets of envs each call: identical results."""
    kwargs = {"history_length": 2, "max_steps": 12}
    seeds, task_ids = [11, 12, 13], [3, 10_001, 42]
    reference = [gym.make("HGPO-Rooms-v0", **kwargs) for _ in range(12)]
    rng = np.random.default_rng(0)
    with GroupedEnvPool("HGPO-Rooms-v0", 3, 4, num_workers=2, backend=backend, **kwargs) as pool:
        for result in pool.reset(seeds=seeds, task_ids=task_ids):
            group = result.group
            expected = reference[result.env_index].reset(
                seed=seeds[group], options={"task_id": task_ids[group]}
            )
            assert (result.obs, result.info) == expected
        calls = 0
        while pool.running:
            chosen = [int(i) for i in rng.permutation(pool.running) if rng.random() < 0.6] or pool.running[:1]
            actions = {}
            for index in chosen:
                env = reference[index].unwrapped
                draw = rng.random()
                if draw < 0.5:
                    actions[index] = response(env.expert_action())
                elif draw < 0.9:
                    actions[index] = response(str(rng.choice(env.admissible_actions)))
                else:
                    actions[index] = "no tags at all"
            results = pool.step(actions)
            assert [r.env_index for r in results] == chosen
            for result in results:
                expected = reference[result.env_index].step(actions[result.env_index])
                assert (
                    result.obs,
                    result.reward,
                    result.terminated,
                    result.truncated,
                    result.info,
                ) == expected
            calls += 1
        assert calls > 12  # the random subsets made the episodes advance unevenly
        with pytest.raises(RuntimeError, match=r"env 0 \(group 0, member 0\) finished its episode"):
            pool.step({0: response("look")})


def test_killed_worker_truncates_only_its_episodes(backend: str) -> None:
    with probe_pool(backend, 2, 4) as pool:  # worker 1 hosts envs 1, 3, 5, 7
        pool.reset()
        pool.step({i: "tick" for i in range(8)})
        victim = pool.worker_pids()[1]
        os.kill(victim, signal.SIGKILL)
        results = pool.step({i: "tick" for i in range(6)})
        for result in results:
            if pool.worker_of(result.env_index) == 1:
                assert result.truncated and not result.terminated and result.reward == 0.0
                assert "Current observation: Count 1." in result.obs  # the last prompt, unchanged
                assert result.info["state_text"] == "Count 1."
                assert "worker 1" in result.info["env_error"]
                if backend == "process":
                    assert "SIGKILL" in result.info["env_error"]
            else:
                assert not result.truncated and "env_error" not in result.info
                assert result.info["state_text"] == "Count 2."
        assert pool.num_restarts == 1
        assert victim not in pool.worker_pids() and -1 not in pool.worker_pids()
        [lost] = pool.step({7: "tick"})  # hosted by the dead worker but not stepped then: lost as well
        assert lost.truncated and "worker 1" in lost.info["env_error"]
        [kept] = pool.step({6: "tick"})
        assert not kept.truncated and kept.info["state_text"] == "Count 2."
        assert pool.running == [0, 2, 4, 6]
        pool.reset()
        assert [r.info["state_text"] for r in pool.step({i: "tick" for i in range(8)})] == ["Count 1."] * 8


def test_env_exception_is_contained(backend: str) -> None:
    with probe_pool(backend) as pool:
        pool.reset()
        raised, neighbour, other = pool.step({0: "raise", 2: "tick", 1: "tick"})
        assert raised.truncated and not raised.terminated
        assert "RuntimeError: the probe env was asked to raise" in raised.info["env_error"]
        assert [neighbour.info["state_text"], other.info["state_text"]] == ["Count 1.", "Count 1."]
        assert pool.num_restarts == 0
        with pytest.raises(RuntimeError, match="finished its episode"):
            pool.step({0: "tick"})
        [neighbour] = pool.step({2: "tick"})  # same worker as env 0: its episode goes on
        assert neighbour.info["state_text"] == "Count 2."


def test_crashing_env_restarts_its_worker(backend: str) -> None:
    with probe_pool(backend) as pool:
        pool.reset()
        crashed, fine = pool.step({1: "crash", 0: "tick"})
        assert crashed.truncated and "worker 1" in crashed.info["env_error"]
        if backend == "process":
            assert "SIGSEGV" in crashed.info["env_error"]
        assert fine.info["state_text"] == "Count 1." and not fine.truncated
        assert pool.num_restarts == 1
        pool.reset()
        assert len(pool.step({1: "tick", 3: "tick"})) == 2


def test_hanging_step_times_out(backend: str) -> None:
    with probe_pool(backend, step_timeout=1.0) as pool:
        pool.reset()
        started = time.monotonic()
        hung, neighbour, other = pool.step({0: "hang", 2: "tick", 1: "tick"})
        # The hang lasts an hour; the bound leaves a loaded machine time to restart the worker.
        assert time.monotonic() - started < 120
        for result in (hung, neighbour):  # env 2 shared the hung worker, which was killed
            assert result.truncated and "no answer within 1 s" in result.info["env_error"]
            assert "during env 0's step" in result.info["env_error"]
        assert not other.truncated and other.info["state_text"] == "Count 1."
        assert pool.num_restarts == 1
        assert pool.step({1: "tick"})[0].info["state_text"] == "Count 2."
        pool.reset()
        assert pool.step({0: "tick"})[0].info["state_text"] == "Count 1."


def test_hang_is_found_within_its_own_step_timeout(backend: str) -> None:
    """One worker hosting 40 envs: the hung env costs its own timeout, not one per env (40 s)."""
    with GroupedEnvPool(PROBE, 10, 4, num_workers=1, backend=backend, step_timeout=1.0) as pool:
        pool.reset()
        actions = {i: "tick" for i in range(39)} | {39: "hang"}
        started = time.monotonic()
        results = pool.step(actions)
        elapsed = time.monotonic() - started
        assert elapsed < 15, f"a hung env among 40 took {elapsed:.1f} s to be found"
        assert [r.truncated for r in results] == [False] * 39 + [True]
        assert "during env 39's step" in results[39].info["env_error"]
        assert [r.info["state_text"] for r in results[:39]] == ["Count 1."] * 39
        # Their episodes lived in the killed worker: each reports so on its next step.
        later = pool.step({0: "tick", 5: "tick"})
        assert all(r.truncated and "worker 0" in r.info["env_error"] for r in later)


def test_group_mismatch_is_detected(backend: str) -> None:
    with probe_pool(backend, unique_start=True) as pool:
        with pytest.raises(GroupMismatchError, match=r"2 group\(s\).*\ngroup 0 .*\ngroup 1 "):
            pool.reset(seeds=[1, 2])
        with pytest.raises(RuntimeError, match="has not been reset"):
            pool.step({0: "tick"})


def test_close_leaves_no_process(backend: str) -> None:
    pool = probe_pool(backend)
    pool.reset()
    victim = pool.worker_pids()[0]
    os.kill(victim, signal.SIGKILL)
    pool.step({0: "tick", 1: "tick"})  # restarts worker 0
    pids = pool.worker_pids()
    pool.close()
    pool.close()
    assert pool.closed
    assert_gone([victim, *pids])
    if backend == "process":
        assert multiprocessing.active_children() == []
    with pytest.raises(RuntimeError, match="the pool is closed"):
        pool.reset()


def test_worker_killed_between_episodes_is_restarted_by_reset(backend: str) -> None:
    with probe_pool(backend) as pool:
        pool.reset()
        pool.step({i: "finish" for i in range(4)})  # every episode over: the workers sit idle
        victim = pool.worker_pids()[1]
        os.kill(victim, signal.SIGKILL)
        time.sleep(0.5)
        results = pool.reset()  # no PoolError: the dead worker is restarted within the call
        assert len(results) == 4 and pool.running == [0, 1, 2, 3]
        assert victim not in pool.worker_pids() and -1 not in pool.worker_pids()
        assert [r.info["state_text"] for r in pool.step({i: "tick" for i in range(4)})] == ["Count 1."] * 4


def test_worker_that_cannot_restart_costs_only_its_envs(backend: str, tmp_path: Path) -> None:
    refuse = tmp_path / "refuse"
    with probe_pool(backend, 2, 2, refuse_if_exists=str(refuse)) as pool:  # worker 1: envs 1, 3
        pool.reset()
        refuse.touch()  # from now on no env can be made, so worker 1's replacement fails
        os.kill(pool.worker_pids()[1], signal.SIGKILL)
        results = pool.step({0: "tick", 1: "tick"})
        assert not results[0].truncated and results[0].info["state_text"] == "Count 1."
        assert results[1].truncated and "could not be restarted" in results[1].info["env_error"]
        assert "refuses to start" in results[1].info["env_error"]
        assert pool.worker_pids()[1] == -1
        assert pool.running == [0, 2, 3]
        [kept, lost] = pool.step({2: "tick", 3: "tick"})  # the healthy worker's episodes go on
        assert kept.info["state_text"] == "Count 1." and not kept.truncated
        assert lost.truncated and "worker 1" in lost.info["env_error"]
        assert pool.step({0: "tick"})[0].info["state_text"] == "Count 2."
        started = time.monotonic()
        with pytest.raises(PoolError, match=r"worker 1: .*(.|\n)*refuses to start"):
            pool.reset()  # retried with backoff, then said in one error
        assert time.monotonic() - started > 5  # 1 + 2 + 4 s of backoff
        threading.Timer(0.5, refuse.unlink).start()  # the cause goes away during the retries
        pool.reset()
        assert -1 not in pool.worker_pids() and pool.running == [0, 1, 2, 3]


def test_an_unsendable_result_ends_only_its_episode(backend: str) -> None:
    with probe_pool(backend) as pool:
        pool.reset()
        unpicklable, neighbour = pool.step({0: "unpicklable", 2: "tick"})
        assert unpicklable.truncated
        assert "cannot be sent to the pool" in unpicklable.info["env_error"]
        assert "_thread.lock" in unpicklable.info["env_error"]
        assert neighbour.info["state_text"] == "Count 1." and pool.num_restarts == 0  # the worker lives on
        assert pool.step({2: "tick"})[0].info["state_text"] == "Count 2."


def test_a_node_unreachable_for_a_moment_is_trusted_again(ray_cluster, monkeypatch) -> None:
    """White-box: the only node, marked lost as an ActorUnavailableError would mark it, takes no
    replacement; once Ray has listed it alive for the grace period, it takes them again."""
    import ray

    from hgpo_env.vector import ray_workers

    monkeypatch.setattr(ray_workers, "ROOM_WAIT", 0.1)
    with probe_pool("ray") as pool:
        pool.reset()
        pool._workers._lost_nodes[ray.get_runtime_context().get_node_id()] = time.monotonic()
        os.kill(pool.worker_pids()[1], signal.SIGKILL)  # a dead process, not a lost node
        lost = pool.step({0: "tick", 1: "tick"})[1]
        assert "no live Ray node has {'CPU': 1.0} free" in lost.info["env_error"]
        monkeypatch.setattr(ray_workers, "LOST_NODE_GRACE", 0.0)
        pool.reset()
        assert -1 not in pool.worker_pids() and pool.running == [0, 1, 2, 3]


# --------------------------------------------------------------------- process backend only
def test_workers_die_with_a_killed_parent_even_inside_a_hung_step() -> None:
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {TESTS_DIR!r})
        from hgpo_env.vector import GroupedEnvPool
        if __name__ == "__main__":
            pool = GroupedEnvPool({PROBE!r}, 1, 2, num_workers=2, step_timeout=600)
            pool.reset()
            print("ready", flush=True)
            pool.step({{0: "hang", 1: "hang"}})
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", script], cwd=REPO_DIR, stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout.readline().strip() == "ready"
        time.sleep(1.0)  # both workers are now inside the hung step
        children = [p.pid for p in psutil.Process(parent.pid).children(recursive=True)]
        assert len(children) >= 2  # the workers, and multiprocessing's resource tracker
    finally:
        parent.kill()
        parent.wait(10)
    assert_gone(children, timeout=5.0)


def test_an_exiting_env_names_its_exit_code_and_itself() -> None:
    with probe_pool("process") as pool:
        pool.reset()
        [exited] = pool.step({1: "exit"})
        assert "exited with code 3 during env 1's step" in exited.info["env_error"]


def test_env_factory_and_env_kwargs() -> None:
    with GroupedEnvPool(make_probe, 1, 3, num_workers=2, max_steps=2) as pool:
        pool.reset()
        pool.step({0: "tick", 1: "tick"})
        results = pool.step({0: "tick", 1: "tick"})
        assert all(r.truncated and "env_error" not in r.info for r in results)  # max_steps=2 reached
        assert pool.running == [2]


def test_misuse_raises_clear_errors() -> None:
    with pytest.raises(ValueError, match="backend must be one of"):
        GroupedEnvPool(PROBE, 1, 2, backend="threads")
    with pytest.raises(ValueError, match="ray_actor_options needs backend='ray'"):
        GroupedEnvPool(PROBE, 1, 2, ray_actor_options={"num_cpus": 2})
    with pytest.raises(ValueError, match=r"num_workers \(3\) exceeds the number of envs \(2\)"):
        GroupedEnvPool(PROBE, 1, 2, num_workers=3)
    with pytest.raises(ValueError, match="num_groups must be a positive int"):
        GroupedEnvPool(PROBE, 0, 2)
    with probe_pool("process") as pool:
        with pytest.raises(RuntimeError, match=r"env 1 \(group 0, member 1\) has not been reset"):
            pool.step({1: "tick"})
        with pytest.raises(ValueError, match=r"seeds needs one entry per group \(2\), got 1"):
            pool.reset(seeds=[1])
        pool.reset()
        with pytest.raises(IndexError, match="env index 4 out of range"):
            pool.step({4: "tick"})
        with pytest.raises(TypeError, match="the action for env 0 must be a str"):
            pool.step({0: 3})
        assert [r.info["state_text"] for r in pool.step({0: "tick"})] == ["Count 1."]  # nothing was sent


def test_failing_env_creation_is_reported() -> None:
    with pytest.raises(PoolError, match=r"2 worker\(s\) could not start(.|\n)*no_such_option"):
        GroupedEnvPool(PROBE, 1, 2, num_workers=2, no_such_option=1)
    assert multiprocessing.active_children() == []


def test_failing_reset_is_reported_and_pool_stays_usable() -> None:
    with probe_pool("process") as pool:
        with pytest.raises(PoolError, match=r"env 0 \(group 0, member 0\): env reset raised ValueError"):
            pool.reset(options=[{"task_id": -1}, None])
        assert pool.running == []
        pool.reset(options=[{"task_id": 1}, None])
        assert pool.running == [0, 1, 2, 3]


def test_imports_and_runs_without_ray_or_torch() -> None:
    script = textwrap.dedent(
        f"""
        import sys
        sys.modules["ray"] = sys.modules["torch"] = None  # importing either now fails
        sys.path.insert(0, {TESTS_DIR!r})
        from hgpo_env.vector import GroupedEnvPool
        with GroupedEnvPool({PROBE!r}, 1, 2, num_workers=2) as pool:
            pool.reset()
            assert pool.step({{0: "tick"}})[0].info["state_text"] == "Count 1."
        """
    )
    subprocess.run([sys.executable, "-c", script], cwd=REPO_DIR, check=True, timeout=60)
