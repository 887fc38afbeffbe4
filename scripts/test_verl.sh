#!/usr/bin/env bash
# The verl integration's tests (tests/integrations/test_verl.py) in .venv-verl, made or updated
# first by scripts/setup_verl.sh (skipped when HGPO_ENVS_READY is set: scripts/test.sh made it);
# extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

[ -n "${HGPO_ENVS_READY:-}" ] || bash scripts/setup_verl.sh
.venv-verl/bin/python -m pytest tests/integrations/test_verl.py "$@"
