"""A real one-machine Slurm cluster a test starts and stops: munged, slurmctld and slurmd.

Debian's ``slurm-wlm`` and ``munge`` (22.05), each daemon with its own folders under one temp
dir and its own ports, bound to 127.0.0.1; clients find it through ``SLURM_CONF`` in
:attr:`SlurmCluster.env`. The node announces ``cpus`` CPUs and ``gpus`` GPUs whatever the
machine has (``config_overrides``): the GPUs are stand-ins (``/dev/null``, ``/dev/zero``), which
the CPU stack's logical GPUs need only to be counted. Stopping cancels the cluster's jobs, then
stops each daemon by its pid.
"""

from __future__ import annotations

import getpass
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import psutil
from serve_helpers import free_port

STAND_IN_GPUS = ("/dev/null", "/dev/zero")
DAEMONS = ("munged", "slurmctld", "slurmd")


def missing_commands() -> list[str]:
    return [c for c in (*DAEMONS, "sbatch", "scancel", "scontrol", "squeue") if shutil.which(c) is None]


class SlurmCluster:
    """One controller and one node named after this machine, in ``root`` (a short folder: Ray's
    socket paths, under a job's TMPDIR there, are limited in length)."""

    def __init__(self, root: Path, cpus: int = 8, gpus: int = 2) -> None:
        self.root = root
        self.node = socket.gethostname().split(".")[0]
        self.conf = root / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.pids: dict[str, int] = {}
        for folder in ("munge", "run", "state", "spool", "log"):
            (root / folder).mkdir(parents=True)
        root.chmod(0o755)
        (root / "run").chmod(0o755)  # munged: everyone reaches its socket
        (root / "munge").chmod(0o700)  # munged: only its user reads its key
        key = root / "munge" / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o400)
        self.socket = root / "run" / "munge.socket"
        self._write_config(cpus, gpus)
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _write_config(self, cpus: int, gpus: int) -> None:
        user, root, node = getpass.getuser(), self.root, self.node
        lines = {
            "ClusterName": "hgpotest",
            "SlurmctldHost": f"{node}(127.0.0.1)",
            "SlurmctldPort": free_port(),
            "SlurmdPort": free_port(),
            "SlurmUser": user,
            "SlurmdUser": user,
            "AuthType": "auth/munge",
            "CredType": "cred/munge",
            "AuthInfo": f"socket={self.socket}",
            "StateSaveLocation": root / "state",
            "SlurmdSpoolDir": root / "spool",
            "SlurmctldPidFile": root / "run" / "slurmctld.pid",
            "SlurmdPidFile": root / "run" / "slurmd.pid",
            "SlurmctldLogFile": root / "log" / "slurmctld.log",
            "SlurmdLogFile": root / "log" / "slurmd.log",
            "ProctrackType": "proctrack/linuxproc",
            "TaskPlugin": "task/none",
            "SelectType": "select/cons_tres",
            "SelectTypeParameters": "CR_CPU",
            "MpiDefault": "none",
            "ReturnToService": 2,
            "SlurmdParameters": "config_overrides",
            "GresTypes": "gpu",
            "JobAcctGatherType": "jobacct_gather/none",
            "AccountingStorageType": "accounting_storage/none",
            "NodeName": f"{node} NodeAddr=127.0.0.1 CPUs={cpus} Gres=gpu:{gpus} State=UNKNOWN",
            "PartitionName": "test Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
        }
        self.conf.write_text("".join(f"{key}={value}\n" for key, value in lines.items()))
        gres = "".join(f"NodeName={node} Name=gpu File={STAND_IN_GPUS[i]}\n" for i in range(gpus))
        (self.root / "gres.conf").write_text(gres)

    def _start(self) -> None:
        run = self.root / "run"
        munge = self.root / "munge"
        subprocess.run(
            [
                "munged",
                f"--socket={self.socket}",
                f"--key-file={munge / 'munge.key'}",
                f"--pid-file={run / 'munged.pid'}",
                f"--log-file={munge / 'munged.log'}",
                f"--seed-file={munge / 'munged.seed'}",
            ],
            check=True,
            capture_output=True,
        )
        self.pids["munged"] = int((run / "munged.pid").read_text())
        for daemon in ("slurmctld", "slurmd"):  # each forks into the background and writes its pid
            subprocess.run([daemon, "-f", str(self.conf)], check=True, env=self.env, capture_output=True)
            self.pids[daemon] = self._pid_of(daemon)
        deadline = time.monotonic() + 60
        while "idle" not in self.sinfo():
            assert time.monotonic() < deadline, (
                f"the Slurm node did not come up: {self.sinfo()}\n{self.logs()}"
            )
            time.sleep(0.5)

    def _pid_of(self, daemon: str) -> int:
        pid_file = self.root / "run" / f"{daemon}.pid"
        deadline = time.monotonic() + 30
        while not (pid_file.is_file() and pid_file.read_text().strip()):
            assert time.monotonic() < deadline, f"{daemon} did not start:\n{self.logs()}"
            time.sleep(0.1)
        return int(pid_file.read_text())

    def sinfo(self) -> str:
        done = subprocess.run(
            ["sinfo", "-h", "-o", "%T"], env=self.env, capture_output=True, text=True, check=False
        )
        return done.stdout.strip() or done.stderr.strip()

    def logs(self) -> str:
        return "\n".join(p.read_text()[-2000:] for p in sorted((self.root / "log").glob("*.log")))

    def run(self, *command: str) -> str:
        """A Slurm client command against this cluster; its stdout."""
        done = subprocess.run(command, env=self.env, capture_output=True, text=True, check=False)
        assert done.returncode == 0, f"{' '.join(command)}: {done.stderr.strip()}"
        return done.stdout.strip()

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job`` as a dict (JobState, Restarts, ...)."""
        fields = self.run("scontrol", "show", "job", "--oneliner", job_id).split()
        return dict(field.split("=", 1) for field in fields if "=" in field)

    def stop(self) -> None:
        """Cancel every job, let their steps end, kill what they left (with proctrack/linuxproc a
        process whose parent died is Slurm's no more), then stop the daemons this cluster started."""
        if "slurmctld" in self.pids:
            subprocess.run(["scancel", "--full", "--user", getpass.getuser()], env=self.env, check=False)
            deadline = time.monotonic() + 60
            while self.run_quietly("squeue", "-h") and time.monotonic() < deadline:
                time.sleep(0.5)
        left = self.job_processes()
        for process in left:
            process.kill()
        psutil.wait_procs(left, timeout=10)
        for name in reversed(DAEMONS):
            pid = self.pids.pop(name, None)
            if pid is None:
                continue
            try:
                process = psutil.Process(pid)
                process.send_signal(signal.SIGTERM)
                process.wait(30)
            except psutil.NoSuchProcess:
                pass
            except psutil.TimeoutExpired:
                process.kill()

    def job_processes(self) -> list[psutil.Process]:
        """Processes of this cluster's jobs still running: those with its SLURM_CONF."""
        found = []
        for process in psutil.process_iter():
            try:
                if process.pid not in self.pids.values() and process.environ().get("SLURM_CONF") == str(
                    self.conf
                ):
                    found.append(process)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return found

    def run_quietly(self, *command: str) -> str:
        done = subprocess.run(command, env=self.env, capture_output=True, text=True, check=False)
        return done.stdout.strip()
