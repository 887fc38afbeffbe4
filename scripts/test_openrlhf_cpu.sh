#!/usr/bin/env bash
# The OpenRLHF backend's and the vLLM generator's tests on the real stack on CPU, in their own
# environment (.venv-openrlhf, made or updated by scripts/setup_openrlhf_cpu.sh); extra
# arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup_openrlhf_cpu.sh
.venv-openrlhf/bin/python -m pytest tests/openrlhf_cpu "$@"
