"""Shared fixtures: where the real benchmark data lives, and how its absence is treated.

Tests that need ``../shared/data`` use the ``shared_data`` fixture. They skip when the folder is
absent, unless ``HGPO_REQUIRE_SHARED_DATA=1`` (set by CI), where a skip would hide a gap: then
they fail.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

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
