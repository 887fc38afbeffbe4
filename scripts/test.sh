#!/usr/bin/env bash
# Every test suite, from scratch, on two lines at once (CI's machine has two cores and most of
# this is one core's work):
#   - the second line makes the OpenRLHF environment (.venv-openrlhf) and runs the OpenRLHF-on-CPU
#     suite, the longest (Ray clusters, Slurm, kills with deadlines);
#   - this line installs the project with its dev extras into the current environment, runs the
#     main suite there, then makes the verl and verifiers environments and runs their suites.
# Extra arguments go to the main suite's pytest. The first failure of either line ends the run;
# the second line's output is printed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."

log=$(mktemp -t hgpo-second-line-XXXXXX.log)
setsid bash -c "bash scripts/setup_openrlhf_cpu.sh && HGPO_ENVS_READY=1 bash scripts/test_openrlhf_cpu.sh" \
    >"$log" 2>&1 &
second=$!
trap 'kill -- -$second 2>/dev/null || true' EXIT  # a failing first line stops the second too

pip install torch==2.13.0
# an editable build writes hgpo.egg-info into the source tree: one at a time (the second line
# installs too)
flock "${TMPDIR:-/tmp}/hgpo-editable-install.lock" pip install -e ".[dev]"
pip install --no-deps openrlhf==0.11.2  # its flash-attn pin is CUDA only
python -m pytest "$@"
bash scripts/test_verl.sh
bash scripts/test_verifiers.sh

status=0
wait "$second" || status=$?
trap - EXIT
echo "----- the second line: the OpenRLHF environment and suite -----"
cat "$log"
if [ "$status" -ne 0 ]; then
    echo "the second line failed (exit $status): its output is above" >&2
    exit "$status"
fi
