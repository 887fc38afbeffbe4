"""Shared fixtures: where the real benchmark data lives, and how its absence is treated; and how a
test session ends.

Tests that need ``../shared/data`` use the ``shared_data`` fixture. They skip when the folder is
absent, unless ``HGPO_REQUIRE_SHARED_DATA=1`` (set by CI), where a skip would hide a gap: then
they fail.
"""

from __future__ import annotations

import atexit
import os
import sys
from pathlib import Path

import pytest

# Ray gives its workers ports from a fixed range (10002 up) unless told otherwise: two clusters on
# one machine (CI runs suites side by side) then hand one port to two workers, and the second to
# bind dies. Every cluster the tests start, here or in the commands they run, takes ports the OS
# picks instead (Ray's own switch for tests).
os.environ.setdefault("RAY_USE_RANDOM_PORTS", "1")

SHARED_DATA = Path(
    os.environ.get("HGPO_SHARED_DATA", Path(__file__).resolve().parents[1] / ".." / "shared" / "data")
).resolve()


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The ``../shared/data`` folder (ALFWorld games, WebShop catalog)."""
    if not SHARED_DATA.is_dir():
        message = f"real benchmark data not found at {SHARED_DATA}"
        if os.environ.get("HGPO_REQUIRE_SHARED_DATA") == "1":
            pytest.fail(message + " and HGPO_REQUIRE_SHARED_DATA=1")
        pytest.skip(message)
    return SHARED_DATA


@pytest.fixture(scope="session")
def alfworld_games_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data home (``HGPO_DATA``) of the session's own for ALFWorld's compiled games: the tests that
    play every valid_seen game (the walkthroughs, the shipped panel) compile each game once
    between them, as a user's disk cache does, instead of once each."""
    return tmp_path_factory.mktemp("alfworld-games-home")


SESSION = pytest.StashKey[pytest.Session]()


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[SESSION] = session  # pytest_unconfigure reads its exit status


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """End the process with pytest's exit status once every plugin has finished: the atexit
    handlers run (the libraries' own cleanup: process pools, Ray, temp files), the native teardown
    does not. A thread of a native library (its code already unloaded) once crashed the full suite
    with a segfault there, after all 997 tests had passed and been reported (2026-11-28, kernel
    log: a jump to an unmapped address)."""
    session = config.stash.get(SESSION, None)
    if session is None:
        return
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(int(session.exitstatus))
