"""Start-up of what speaks OpenEnv: the seconds until a server answers, and a client's import.

    python benchmarks/serve_startup.py [--repeats 3]

Every server (``python -m hgpo_env serve``), pool worker of ``backend="openenv"`` and client
imports OpenEnv, whose server package imports its Gradio web UI unless it is told not to.
``hgpo_env.serve`` leaves that UI out unless ``ENABLE_WEB_INTERFACE`` (OpenEnv's switch for it)
is on. The baseline, in the same run, is the same start with the switch on: what every start cost
before. Prints the median of ``--repeats`` starts of each, and the ratio.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from command_line import options
from serve_helpers import running_server

CLIENT_IMPORT = [sys.executable, "-c", "import hgpo_env.serve.client"]


def seconds(start: Callable[[], None], web_ui: bool, repeats: int) -> float:
    """The median wall time of ``repeats`` calls of ``start`` with the web UI switch as given."""
    saved = os.environ.get("ENABLE_WEB_INTERFACE")
    os.environ["ENABLE_WEB_INTERFACE"] = "true" if web_ui else "false"
    try:
        times = []
        for _ in range(repeats):
            began = time.perf_counter()
            start()
            times.append(time.perf_counter() - began)
        return statistics.median(times)
    finally:
        if saved is None:
            os.environ.pop("ENABLE_WEB_INTERFACE")
        else:
            os.environ["ENABLE_WEB_INTERFACE"] = saved


def server_answers() -> None:
    with running_server("HGPO-Rooms-v0"):
        pass


def client_imports() -> None:
    subprocess.run(CLIENT_IMPORT, check=True)


def main() -> None:
    args = options(__doc__, repeats=3)
    print(f"{'what':<28} {'web UI on (s)':>13} {'off (s)':>8} {'ratio':>6}")
    for name, start in (("server, until it answers", server_answers), ("client import", client_imports)):
        on, off = (seconds(start, web_ui, args.repeats) for web_ui in (True, False))
        print(f"{name:<28} {on:13.2f} {off:8.2f} {on / off:6.1f}x")


if __name__ == "__main__":
    main()
