#!/usr/bin/env bash
# The verl integration's environment (.venv-verl): verl 0.9.1 pins transformers < 5.11, this
# project 5.15, so it gets its own. Creates or updates it.
# --no-compile: Python compiles each module when first imported, not every file at install.
set -euo pipefail
cd "$(dirname "$0")/.."

python3 -m venv .venv-verl
.venv-verl/bin/python -m pip install --quiet --upgrade pip
.venv-verl/bin/python -m pip install --quiet --no-compile torch==2.13.0
# an editable build writes hgpo.egg-info into the source tree: one at a time (scripts/test.sh
# installs two environments at once)
flock "${TMPDIR:-/tmp}/hgpo-editable-install.lock" .venv-verl/bin/python -m pip install --quiet --no-compile -e ".[verl,test]"
