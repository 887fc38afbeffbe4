"""A quiet console for a backend run: the libraries' output goes to the run folder's log.

Ray relays every actor's output to the driver, so a run would show OpenRLHF's argument
namespace, vLLM's engine config, DeepSpeed's messages and the model's repr. While
:func:`quiet_console` is on, everything written to ``sys.stdout``/``sys.stderr`` goes to
``driver.log`` in the run folder, and the terminal shows only what the run says to its user: the
trainer actor's lines (an iteration's progress and summary), without Ray's prefix, and
:func:`say`. The trainer actor also runs OpenRLHF's code, whose info lines (a sample prompt every
iteration) stay in the log; its warnings and errors are shown. ``--verbose`` shows everything on
the terminal too.
"""

from __future__ import annotations

import io
import re
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

LOG_FILE = "driver.log"
TRAINER_PREFIX = re.compile(r"^(?:\x1b\[\d+m)?\(\w*Trainer pid=\d+(?:, ip=[\d.]+)?\)(?:\x1b\[0m)? ?")
"""How Ray prefixes a line the trainer actor (``<trainer class> pid=...``) printed."""
LIBRARY_INFO = re.compile(r"^(?:DEBUG|INFO) \d\d-\d\d \d\d:\d\d:\d\d \[?[\w.-]+:\d+\] ")
"""An info or debug record in OpenRLHF's and vLLM's log format (every line of it: both repeat the
record's head on each line of a message)."""

_quiet: tuple[TextIO, TextIO] | None = None
"""The log and the terminal while the console is quiet."""


def say(message: str) -> None:
    """Show ``message`` on the terminal (and in the log while the console is quiet)."""
    if _quiet is None:
        print(message, file=sys.stderr, flush=True)
        return
    for stream in _quiet:
        stream.write(message + "\n")
        stream.flush()


class Filter(io.TextIOBase):
    """A stream writing everything to ``log`` and the trainer's lines (or, ``verbose``, all) to ``terminal``."""

    def __init__(self, log: TextIO, terminal: TextIO, verbose: bool) -> None:
        self.log, self.terminal, self.verbose = log, terminal, verbose
        self.pending = ""
        self.lock = threading.Lock()  # Ray's log monitor writes from a thread of its own

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        with self.lock:
            self.log.write(text)
            self.pending += text
            *lines, self.pending = self.pending.split("\n")
            for line in lines:
                shown = line if self.verbose else TRAINER_PREFIX.sub("", line, count=1)
                if self.verbose or (shown != line and not LIBRARY_INFO.match(shown)):
                    self.terminal.write(shown + "\n")
        return len(text)

    def flush(self) -> None:
        self.log.flush()
        self.terminal.flush()


@contextmanager
def quiet_console(run_dir: Path, verbose: bool = False) -> Iterator[Path]:
    """Send ``sys.stdout`` and ``sys.stderr`` to the run folder's log while the block runs (the
    terminal gets what :class:`Filter` passes); yields the log's path."""
    global _quiet
    path = run_dir / LOG_FILE
    saved = sys.stdout, sys.stderr
    with path.open("a", buffering=1) as log:
        sys.stdout = Filter(log, saved[0], verbose)
        sys.stderr = Filter(log, saved[1], verbose)
        _quiet = log, saved[1]
        try:
            yield path
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            sys.stdout, sys.stderr = saved
            _quiet = None
