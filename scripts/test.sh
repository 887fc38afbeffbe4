#!/usr/bin/env bash
# Every test suite, from scratch: installs the project with its dev extras into the current
# environment and runs the main suite there, and the verl, verifiers and OpenRLHF-on-CPU suites in
# environments of their own (.venv-verl, .venv-verifiers, .venv-openrlhf). While the current
# environment is installed and the main suite runs (mostly one core's work), a second line uses
# the other core: it makes those environments, runs the verl and verifiers suites and the
# OpenRLHF suite's modules that start no Ray cluster (BESIDE). The rest of the OpenRLHF suite
# (Ray clusters, Slurm, kills with deadlines) runs last, alone. Extra arguments go to the main
# suite's pytest. The first failure ends the run.
set -euo pipefail
cd "$(dirname "$0")/.."

BESIDE=(test_objective_cpu test_vllm_generator_cpu)
beside=$(printf ' or %s' "${BESIDE[@]}")
log=$(mktemp -t hgpo-second-line-XXXXXX.log)
setsid bash -c "bash scripts/test_verl.sh && bash scripts/test_verifiers.sh && bash scripts/setup_openrlhf_cpu.sh \
    && HGPO_ENVS_READY=1 bash scripts/test_openrlhf_cpu.sh -k '${beside# or }'" >"$log" 2>&1 &
second=$!
trap 'kill -- -$second 2>/dev/null || true' EXIT  # a failing main suite stops the second line too

pip install torch==2.13.0
# an editable build writes hgpo.egg-info into the source tree: one at a time (the second line
# installs too)
flock "${TMPDIR:-/tmp}/hgpo-editable-install.lock" pip install -e ".[dev]"
pip install --no-deps openrlhf==0.11.2  # its flash-attn pin is CUDA only
python -m pytest "$@"
status=0
wait "$second" || status=$?
trap - EXIT
echo "----- run beside the main suite: the verl and verifiers suites, the OpenRLHF environment, ${BESIDE[*]} -----"
cat "$log"
if [ "$status" -ne 0 ]; then
    echo "the second line failed (exit $status): its output is above" >&2
    exit "$status"
fi
ignored=()
for module in "${BESIDE[@]}"; do ignored+=("--ignore=tests/openrlhf_cpu/$module.py"); done
HGPO_ENVS_READY=1 bash scripts/test_openrlhf_cpu.sh "${ignored[@]}"
