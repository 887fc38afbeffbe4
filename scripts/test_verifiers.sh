#!/usr/bin/env bash
# The verifiers integration's tests (tests/integrations/test_verifiers.py) in .venv-verifiers,
# made or updated first by scripts/setup_verifiers.sh (skipped when HGPO_ENVS_READY is set:
# scripts/test.sh made it); extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

[ -n "${HGPO_ENVS_READY:-}" ] || bash scripts/setup_verifiers.sh
# verifiers' harnesses run their chat program with this environment's uv
PATH="$PWD/.venv-verifiers/bin:$PATH" .venv-verifiers/bin/python -m pytest tests/integrations/test_verifiers.py "$@"
