"""Nothing a run started outlives its driver, even a SIGKILLed one.

A local Ray cluster, its agents, the actors' worker processes and vLLM's engine cores are all
descendants of the driver. When the driver is killed, Ray's head goes with it, but agents and
engine workers linger for minutes, holding CPUs, memory and ports. A killed process cannot clean
up after itself, so the driver starts this watchdog first, in a session of its own: it keeps a
list of the driver's descendants (a fresh look every :data:`POLL_S`) and, once the driver is gone,
stops every one still running (SIGTERM, then SIGKILL after :data:`GRACE_S`). On a cluster the
driver joined with ``--ray-address`` its descendants are only its own processes: the cluster
itself is never touched (Ray stops a dead driver's actors there).

    python -m hgpo_train.openrlhf.watchdog DRIVER_PID
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil

POLL_S = 0.5
GRACE_S = 3.0


def start(driver_pid: int) -> subprocess.Popen:
    """The watchdog of ``driver_pid``, in its own session (a signal to the driver's group misses it)."""
    return subprocess.Popen(
        [sys.executable, "-m", __name__, str(driver_pid)],
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
    )


def descendants(driver: psutil.Process) -> dict[tuple[int, float], psutil.Process]:
    """The driver's descendants but this watchdog, keyed by (pid, start time) so that a reused pid is never mistaken."""
    found = {}
    for child in driver.children(recursive=True):
        if child.pid == os.getpid():
            continue
        try:
            found[(child.pid, child.create_time())] = child
        except psutil.NoSuchProcess:
            continue
    return found


def stop(processes: list[psutil.Process]) -> None:
    """SIGTERM, then SIGKILL whatever is still running after :data:`GRACE_S`."""
    for process in processes:
        try:
            process.terminate()
        except psutil.NoSuchProcess:
            continue
    _, alive = psutil.wait_procs(processes, timeout=GRACE_S)
    for process in alive:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            continue


def watch(driver_pid: int) -> None:
    try:
        driver = psutil.Process(driver_pid)
    except psutil.NoSuchProcess:
        return
    seen: dict[tuple[int, float], psutil.Process] = {}
    try:
        while driver.is_running() and driver.status() != psutil.STATUS_ZOMBIE:
            seen.update(descendants(driver))
            time.sleep(POLL_S)
    except psutil.NoSuchProcess:
        pass
    stop([p for p in seen.values() if p.is_running()])  # is_running also checks the start time


if __name__ == "__main__":
    watch(int(sys.argv[1]))
