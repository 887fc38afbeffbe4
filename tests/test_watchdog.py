"""The OpenRLHF backend's watchdog: what a SIGKILLed driver started does not outlive it.

A stand-in driver (a Python process, not the backend: the real one is killed in
tests/openrlhf_cpu/test_resume_cpu.py) starts the watchdog, then children and a grandchild, one
of which ignores SIGTERM; after the driver's SIGKILL all of them must be gone within seconds.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

import psutil

from hgpo_train.openrlhf import watchdog

DRIVER = textwrap.dedent(
    """
    import os, subprocess, sys, time
    from hgpo_train.openrlhf import watchdog
    watchdog.start(os.getpid())
    python = [sys.executable, "-c"]
    subprocess.Popen(["sleep", "120"])
    subprocess.Popen(python + ["import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"])
    subprocess.Popen(python + ["import subprocess, time; subprocess.Popen(['sleep', '120']); time.sleep(120)"])
    time.sleep(120)
    """
)


def test_a_killed_drivers_descendants_are_stopped() -> None:
    driver = subprocess.Popen([sys.executable, "-c", DRIVER])
    try:
        deadline = time.monotonic() + 30
        while (
            len(psutil.Process(driver.pid).children(recursive=True)) < 5
        ):  # watchdog, 3 children, 1 grandchild
            assert time.monotonic() < deadline, "the stand-in driver did not start its processes"
            time.sleep(0.1)
        time.sleep(2 * watchdog.POLL_S)  # the watchdog has seen them all
        started = psutil.Process(driver.pid).children(recursive=True)
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait()
    _, alive = psutil.wait_procs(started, timeout=watchdog.GRACE_S + 5)
    assert not alive, [p.cmdline() for p in alive]
