#!/usr/bin/env bash
# The OpenRLHF backend's and the vLLM generator's tests on the real stack on CPU, in their own
# environment (.venv-openrlhf), made or updated first by scripts/setup_openrlhf_cpu.sh (skipped
# when HGPO_ENVS_READY is set: scripts/test.sh made it); extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

[ -n "${HGPO_ENVS_READY:-}" ] || bash scripts/setup_openrlhf_cpu.sh
.venv-openrlhf/bin/python -m pytest tests/openrlhf_cpu "$@"
