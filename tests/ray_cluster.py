"""Ray nodes a test starts on this machine and stops by pid (never ``ray stop``).

Each node is one ``ray start --block`` process in a session of its own, with its own temp dir,
bound to 127.0.0.1; stopping it kills that process, its children and its session.

Every port a node opens is one the OS picked free, worker ports included: ``ray start`` hands out
worker ports from a fixed range (10002 up) in order, so two clusters on one machine (CI runs the
main suite beside the OpenRLHF suite) give out the same ports, and a driver whose port is taken
dies at once (Ray's "Failed to start the grpc server ... port is 10007"), taking pytest with it.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import psutil
from serve_helpers import free_port

RAY_CLI = [sys.executable, "-m", "ray.scripts.scripts"]


class RayNode:
    """One ``ray start --block`` process (and its children), in a session of its own.

    ``head_port`` makes it a head (with the dashboard and its job server when ``dashboard_port``
    is given); otherwise it joins ``join``. ``num_gpus`` are logical GPUs (the CPU stack's).
    ``hide`` puts the node in a mount namespace of its own with an empty tmpfs over that folder:
    a node without the shared storage the others have.
    """

    def __init__(
        self,
        tmp: Path,
        name: str,
        num_cpus: int,
        *,
        num_gpus: int = 0,
        head_port: int | None = None,
        dashboard_port: int | None = None,
        join: str = "",
        env: dict[str, str] | None = None,
        hide: Path | None = None,
    ) -> None:
        self.name, self.restarts, self.is_head = name, 0, head_port is not None
        temp_dir = tmp / name
        temp_dir.mkdir()
        self._options = [*RAY_CLI, "start", "--block", "--disable-usage-stats", "--node-ip-address=127.0.0.1"]
        self._options += [f"--num-cpus={num_cpus}", f"--num-gpus={num_gpus}", f"--temp-dir={temp_dir}"]
        if head_port is None:
            self._options += [f"--address={join}"]
        else:
            self._options += ["--head", f"--port={head_port}", f"--ray-client-server-port={free_port()}"]
            if dashboard_port is None:
                self._options += ["--include-dashboard=false"]
            else:
                self._options += ["--include-dashboard=true", "--dashboard-host=127.0.0.1"]
                self._options += [f"--dashboard-port={dashboard_port}"]
        self._hide, self._env = hide, {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", **(env or {})}
        self.log = tmp / f"{name}.log"
        self._start()

    def _start(self) -> None:
        # nodes on one machine need ports of their own where Ray's defaults are fixed numbers
        command = [*self._options, f"--dashboard-agent-listen-port={free_port()}"]
        command += [f"--metrics-export-port={free_port()}", "--min-worker-port=0", "--max-worker-port=0"]
        if self._hide is not None:
            mount = f"mount -t tmpfs none {shlex.quote(str(self._hide))} && exec {shlex.join(command)}"
            command = ["unshare", "--mount", "--propagation", "private", "sh", "-c", mount]
        with self.log.open("a") as log:
            self.process = subprocess.Popen(
                command, start_new_session=True, env=self._env, stdout=log, stderr=subprocess.STDOUT
            )

    def restart(self) -> None:
        """Start a node whose ``ray start`` exited again, on fresh ports (a port another process
        took between ``free_port`` and Ray's bind is a race no test can close)."""
        self.kill()
        self.restarts += 1
        self._start()

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of what ``ray start`` printed, under the node's name."""
        tail = self.log.read_text(errors="replace").splitlines()[-lines:]
        return "\n".join([f"--- {self.name}: {self.log}", *tail])

    def pids(self) -> set[int]:
        return {process.pid for process in self._processes()}

    def _processes(self) -> list[psutil.Process]:
        """The ``ray start`` process and its descendants, while it is not reaped (after that its
        pid may be another process's). psutil's objects remember each start time, so signalling
        one that has since exited never reaches a process that took its pid."""
        if self.process.returncode is not None:
            return []
        try:
            leader = psutil.Process(self.process.pid)
            return [leader, *leader.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def kill(self) -> None:
        """SIGKILL this node's processes (and only them), at once; safe to call again."""
        for process in self._processes():
            try:
                process.kill()
            except psutil.NoSuchProcess:
                pass
        # The session this test made for the node, whose id is the leader's pid: Linux gives no
        # new process that pid while the leader is unreaped or any member lives, so a process that
        # has it now (after a reap) is a stranger, and its session is left alone.
        if self.process.returncode is None or not psutil.pid_exists(self.process.pid):
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.process.wait(30)


def wait_for_head(address: str, timeout: float = 60.0) -> None:
    """Return once the head at ``address`` answers ``ray status``."""
    deadline = time.monotonic() + timeout
    while True:
        probe = subprocess.run([*RAY_CLI, "status", f"--address={address}"], capture_output=True, check=False)
        if probe.returncode == 0:
            return
        assert time.monotonic() < deadline, f"the Ray head at {address} did not start"
        time.sleep(1)


def wait_for_nodes(
    dashboard: str, count: int, *, starting: Sequence[RayNode] = (), timeout: float = 300.0
) -> None:
    """Return once exactly ``count`` nodes are alive in the cluster whose dashboard is ``dashboard``
    (Ray's state API: ``ray status`` goes on listing a killed node for minutes).

    A node joins in ~20 s on an idle 2-core machine and several times that on a busy one, so the
    wait is long. A joining node in ``starting`` whose process exits is started again once; a
    second exit (or a head's) fails the wait at once, and any failure shows those nodes' logs.
    """
    from ray.util.state import list_nodes

    deadline = time.monotonic() + timeout
    while True:
        try:
            states = [n.state for n in list_nodes(address=dashboard)]
        except Exception as error:  # noqa: BLE001 (the dashboard may still be starting)
            states = [repr(error)]
        if states.count("ALIVE") == count:
            return
        exited = [node for node in starting if node.process.poll() is not None]
        for node in [n for n in exited if not n.restarts and not n.is_head]:
            print(f"Ray node {node.name} exited while joining; starting it again:\n{node.log_tail()}")
            node.restart()
            exited.remove(node)
        if exited or time.monotonic() > deadline:
            why = f"{', '.join(n.name for n in exited)} exited" if exited else f"not after {timeout:.0f} s"
            logs = "\n".join(node.log_tail() for node in starting)
            raise AssertionError(f"the cluster did not come to {count} live nodes ({why}): {states}\n{logs}")
        time.sleep(1)
