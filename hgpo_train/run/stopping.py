"""Stopping a run at a safe point, as schedulers ask (SIGTERM, or a file in the run folder).

Both trainers checkpoint every iteration, so a run killed at any moment loses at most the
iteration in progress. A requested stop does better where it can: a rollout in progress is
abandoned (the policy has not changed since the last checkpoint), an update in progress finishes
and is checkpointed, then the run exits with :data:`STOPPED_EXIT` and one line saying where
re-running the same command resumes. The request is a file, :data:`STOP_FILE`, in the run folder,
so anything that sees the folder can make it: the driver's SIGTERM handler, or, on any machine
that mounts the folder, ``python -m hgpo_train stop RUN_DIR --wait S`` (a Kubernetes
``preStop`` hook), which returns once the run has stopped.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

STOP_FILE = "stop_requested"
"""Its presence in the run folder asks the trainer to stop at the next safe point."""
RUNNING_FILE = "running"
"""In the run folder while a driver trains there (its host and pid); gone when it exits."""
STOPPED_EXIT = 130
"""The exit status of a run that stopped on request (as after Ctrl-C)."""


class RolloutStopped(Exception):
    """A stop was requested during a rollout: the iteration is abandoned, the policy is unchanged."""


class StopRequested(Exception):
    """The run stopped on request after checkpointing ``iteration``; re-running resumes from there.

    ``abandoned``: the next iteration's rollout was in progress and dropped. The driver says so
    (not the trainer, whose output may reach the console after the driver has exited)."""

    def __init__(self, iteration: int, abandoned: bool = False) -> None:
        super().__init__(f"stopped after iteration {iteration}")
        self.iteration = iteration
        self.abandoned = abandoned


def stop_requested(run_dir: Path) -> bool:
    return (run_dir / STOP_FILE).exists()


def tell(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def request_stop(run_dir: Path, why: str, say: Callable[[str], None] = tell) -> bool:
    """Ask the run in ``run_dir`` to stop at its next safe point, saying so with ``say``; False if
    it was asked already."""
    stop_file = run_dir / STOP_FILE
    if stop_file.exists():
        return False
    stop_file.touch()
    say(f"{why}: stopping at the next safe point with a checkpoint")
    return True


def clear_stop(run_dir: Path) -> None:
    """Forget an earlier request (a run starting or ending)."""
    (run_dir / STOP_FILE).unlink(missing_ok=True)


@contextmanager
def running(run_dir: Path) -> Iterator[None]:
    """Mark ``run_dir`` as trained in while the block runs, with no stop requested at its start or end."""
    clear_stop(run_dir)
    (run_dir / RUNNING_FILE).write_text(f"{socket.gethostname()} {os.getpid()}\n")
    try:
        yield
    finally:
        (run_dir / RUNNING_FILE).unlink(missing_ok=True)
        clear_stop(run_dir)


def stop_and_wait(run_dir: Path, wait_s: float, poll_s: float = 0.5) -> bool:
    """Ask the run in ``run_dir`` to stop, then wait up to ``wait_s`` for its driver to exit;
    True when no driver runs there any more (a driver killed by SIGKILL leaves its marker behind:
    the wait then runs out)."""
    if not (run_dir / RUNNING_FILE).exists():
        return True
    request_stop(run_dir, "python -m hgpo_train stop")
    deadline = time.monotonic() + wait_s
    while (run_dir / RUNNING_FILE).exists():
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hgpo_train stop",
        description="Ask the run training in RUN_DIR to stop at its next safe point with a checkpoint "
        "(any machine that mounts the folder: a preStop hook, a scheduler's epilog).",
    )
    parser.add_argument("run_dir", type=Path, help="the run's train.output_dir")
    parser.add_argument(
        "--wait", type=float, default=0.0, metavar="S", help="wait up to S seconds for it to stop"
    )
    args = parser.parse_args(argv)
    if not (args.run_dir / RUNNING_FILE).exists():
        print(f"no run is training in {args.run_dir}", file=sys.stderr)
        return 0
    if not args.wait:
        request_stop(args.run_dir, "python -m hgpo_train stop")
        return 0
    if stop_and_wait(args.run_dir, args.wait):
        print(f"the run in {args.run_dir} stopped", file=sys.stderr)
        return 0
    print(f"the run in {args.run_dir} did not stop within {args.wait:g} s", file=sys.stderr)
    return 1


def stopped_line(stopped: StopRequested, checkpoint: str | None) -> str:
    """What a run that stopped on request says last."""
    done = stopped.iteration
    if not done or checkpoint is None:
        return "stopped on request before the first iteration finished; re-run the same command to start"
    dropped = f"iteration {done + 1}'s rollout was abandoned; " if stopped.abandoned else ""
    return (
        f"stopped on request after iteration {done}, checkpointed ({checkpoint}); {dropped}"
        "re-run the same command to resume"
    )


if __name__ == "__main__":
    sys.exit(main())
