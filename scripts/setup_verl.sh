#!/usr/bin/env bash
# The verl integration's environment (.venv-verl): verl 0.9.1 pins transformers < 5.11, this
# project 5.15, so it gets its own. Creates or updates it.
set -euo pipefail
# Python compiles each module when it is first imported, and keeps it: pip need not compile every
# file now, unless PYTHONDONTWRITEBYTECODE says imports keep nothing.
COMPILE=--no-compile
[ -z "${PYTHONDONTWRITEBYTECODE:-}" ] || COMPILE=--compile
cd "$(dirname "$0")/.."

python3 -m venv .venv-verl
.venv-verl/bin/python -m pip install --quiet --upgrade pip
.venv-verl/bin/python -m pip install --quiet "$COMPILE" torch==2.13.0
# an editable build writes hgpo.egg-info into the source tree: one at a time (scripts/test.sh
# installs two environments at once)
flock "${TMPDIR:-/tmp}/hgpo-editable-install.lock" .venv-verl/bin/python -m pip install --quiet "$COMPILE" -e ".[verl,test]"
