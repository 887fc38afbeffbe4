"""Fixtures of the integration tests, and which of them this environment runs.

verl pins transformers < 5.11 and this project 5.15, so ``test_verl.py`` runs in its own
environment (``bash scripts/test_verl.sh``, part of the README's test command); an environment
without verl leaves that file to it rather than skipping its tests.
"""

from __future__ import annotations

import importlib.util

import pytest
from integration_setup import tiny_chat_model

collect_ignore = [] if importlib.util.find_spec("verl") else ["test_verl.py"]


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    return tiny_chat_model(tmp_path_factory.mktemp("tiny") / "model")
