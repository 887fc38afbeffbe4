"""Fixtures of the integration tests."""

from __future__ import annotations

import pytest
from integration_setup import tiny_chat_model


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    return tiny_chat_model(tmp_path_factory.mktemp("tiny") / "model")
