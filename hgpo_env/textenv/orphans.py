"""Child processes that end with their parent: the pool's workers and the server's frame checker
call :func:`exit_with_parent` first, so a killed parent leaves no orphan behind."""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import threading

ORPHAN_EXIT_CODE = 70
"""A child's exit code when it ends itself because its parent died."""


def exit_with_parent() -> None:
    """Watch the parent from a daemon thread and end this process the moment it is gone (a
    spawned child's first call: a killed parent leaves no orphan)."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch() -> None:
        multiprocessing.connection.wait([parent.sentinel])
        os._exit(ORPHAN_EXIT_CODE)  # no cleanup: the main thread may be stuck inside an env

    threading.Thread(target=watch, name="hgpo-parent-watchdog", daemon=True).start()
