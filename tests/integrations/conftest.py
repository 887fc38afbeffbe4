"""Fixtures of the integration tests, and which of them this environment runs.

verl pins transformers < 5.11 and this project 5.15, so ``test_verl.py`` runs in its own
environment (``bash scripts/test_verl.sh``, part of the README's test command); verifiers pins
mcp 2.0, which openenv's fastmcp cannot import, so ``test_verifiers.py`` runs in its own
(``bash scripts/test_verifiers.sh``). An environment without the framework leaves its file to
that script rather than skipping its tests.
"""

from __future__ import annotations

import importlib.util

import pytest
from integration_setup import tiny_chat_model

collect_ignore = [
    name
    for name, package in (("test_verl.py", "verl"), ("test_verifiers.py", "verifiers"))
    if importlib.util.find_spec(package) is None
]


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    return tiny_chat_model(tmp_path_factory.mktemp("tiny") / "model")
