#!/usr/bin/env bash
# Every test suite, from scratch: installs the project with its dev extras into the current
# environment and runs the main suite there, and the verl, verifiers and OpenRLHF-on-CPU suites in
# environments of their own (.venv-verl, .venv-verifiers, .venv-openrlhf). Two lines run at once:
# this one installs the current environment and runs the main suite; the second makes the other
# environments and runs the verl and verifiers suites, the OpenRLHF modules in BESIDE (those
# whose deadlines a loaded machine meets), then the Slurm module. The rest of the OpenRLHF suite
# (kills and stops at a moment, grace periods) runs last, alone. Extra arguments go to the main
# suite's pytest. The first failure ends the run. Every run ends with the budget
# (scripts/ci_report.py): each step's wall time and the CPUs' busy share while it ran, each line's
# idle time and each suite's slowest tests; the files behind it stay in $HGPO_CI_REPORT (a temp
# dir unless set).
set -euo pipefail
cd "$(dirname "$0")/.."

BESIDE=(test_objective_cpu test_vllm_generator_cpu test_backend_cpu test_cluster_cpu)
SLURM=test_slurm_cpu # its time limit is set once its driver trains: a busy machine only slows it
export HGPO_CI_REPORT=${HGPO_CI_REPORT:-$(mktemp -d -t hgpo-ci-XXXXXX)}
unset PYTHONDONTWRITEBYTECODE # installs compile nothing: imports compile once and keep it (below)
# One OpenMP thread per process: the two lines already keep both cores busy, and torch's two
# intra-op threads spin-wait for each other whenever the other line holds a core (with one core
# taken by a busy loop, two of the end-to-end tests took 52.6 CPU-seconds with torch's default
# threads and 36.9 with one). Ray's workers get one thread each already.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
budget() { python3 scripts/ci_report.py "$HGPO_CI_REPORT"; }
trap budget EXIT  # after a failure too

# timed LINE STEP COMMAND...: run COMMAND, and record for the budget table when it ran and the
# machine's CPU counters (/proc/stat's busy and idle ticks, all cores) at its start and end
timed() {
    local line=$1 step=$2 start cpu rc=0
    shift 2
    start=$(date +%s.%N) cpu=$(cpu_ticks)
    "$@" || rc=$?
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$line" "$step" "$start" "$(date +%s.%N)" "$rc" "$cpu" "$(cpu_ticks)" \
        >>"$HGPO_CI_REPORT/timeline.tsv"
    return "$rc"
}
cpu_ticks() { awk '/^cpu /{print $2+$3+$4+$7+$8+$9 " " $5+$6}' /proc/stat; }
export -f timed cpu_ticks
junit() { echo "--junitxml=$HGPO_CI_REPORT/$1.xml"; }

beside=$(printf ' or %s' "${BESIDE[@]}")
log=$(mktemp -t hgpo-second-line-XXXXXX.log)
setsid bash -c "set -e
    timed second 'verl: environment' bash scripts/setup_verl.sh
    HGPO_ENVS_READY=1 timed second 'verl: suite' bash scripts/test_verl.sh $(junit verl)
    timed second 'verifiers: environment' bash scripts/setup_verifiers.sh
    HGPO_ENVS_READY=1 timed second 'verifiers: suite' bash scripts/test_verifiers.sh $(junit verifiers)
    timed second 'openrlhf: environment' bash scripts/setup_openrlhf_cpu.sh
    HGPO_ENVS_READY=1 timed second 'openrlhf: ${BESIDE[*]}' \
        bash scripts/test_openrlhf_cpu.sh -k '${beside# or }' $(junit openrlhf-beside)
    HGPO_ENVS_READY=1 timed second 'openrlhf: $SLURM' \
        bash scripts/test_openrlhf_cpu.sh -k $SLURM $(junit openrlhf-slurm)" >"$log" 2>&1 &
second=$!
trap 'kill -- -$second 2>/dev/null || true; budget' EXIT  # a failing main suite stops the second line

# (a function that timed runs does not stop at a failing command by itself: hence the &&)
# --no-compile (here and in the setup scripts): Python compiles a module when it is first imported;
# compiling every file at install time took most of an install (torch and transformers: 59 s
# against 21 s). Imports then write what they compile: a PYTHONDONTWRITEBYTECODE in the caller's
# environment would make every process compile torch anew.
install() {
    pip install --no-compile torch==2.13.0 &&
        # an editable build writes hgpo.egg-info into the source tree: one at a time (the second
        # line installs too)
        flock "${TMPDIR:-/tmp}/hgpo-editable-install.lock" pip install --no-compile -e ".[dev]" &&
        pip install --no-compile --no-deps openrlhf==0.11.2 # its flash-attn pin is CUDA only
}
timed main 'main: environment' install
timed main 'main: suite' python -m pytest "$(junit main)" "$@"
status=0
wait "$second" || status=$?
trap budget EXIT
echo "----- run beside the main suite: the verl and verifiers suites, the OpenRLHF environment, ${BESIDE[*]}, $SLURM -----"
cat "$log"
if [ "$status" -ne 0 ]; then
    echo "the second line failed (exit $status): its output is above" >&2
    exit "$status"
fi
ignored=()
for module in "${BESIDE[@]}" "$SLURM"; do ignored+=("--ignore=tests/openrlhf_cpu/$module.py"); done
HGPO_ENVS_READY=1 timed main 'openrlhf: the rest' bash scripts/test_openrlhf_cpu.sh "${ignored[@]}" "$(junit openrlhf-rest)"
