#!/usr/bin/env bash
# The verifiers integration's tests, in their own environment (.venv-verifiers): verifiers 0.4.0
# pins mcp 2.0, while openenv 0.10 (the served envs) needs fastmcp 3, which imports mcp 1.x.
# Creates or updates the environment, then runs pytest on tests/integrations/test_verifiers.py
# (extra arguments go to pytest). The tests need no torch.
set -euo pipefail
cd "$(dirname "$0")/.."

python3 -m venv .venv-verifiers
.venv-verifiers/bin/python -m pip install --quiet --upgrade pip
.venv-verifiers/bin/python -m pip install --quiet -e ".[verifiers,test]"
# verifiers' harnesses run their chat program with this environment's uv
PATH="$PWD/.venv-verifiers/bin:$PATH" .venv-verifiers/bin/python -m pytest tests/integrations/test_verifiers.py "$@"
