#!/usr/bin/env bash
# The verifiers integration's environment (.venv-verifiers): verifiers 0.4.0 pins mcp 2.0, while
# openenv 0.10 (the served envs) needs fastmcp 3, which imports mcp 1.x, so it gets its own. Its
# tests need no torch. Creates or updates it.
set -euo pipefail
# Python compiles each module when it is first imported, and keeps it: pip need not compile every
# file now, unless PYTHONDONTWRITEBYTECODE says imports keep nothing.
COMPILE=--no-compile
[ -z "${PYTHONDONTWRITEBYTECODE:-}" ] || COMPILE=--compile
cd "$(dirname "$0")/.."

python3 -m venv .venv-verifiers
.venv-verifiers/bin/python -m pip install --quiet --upgrade pip
# an editable build writes hgpo.egg-info into the source tree: one at a time (scripts/test.sh
# installs two environments at once)
flock "${TMPDIR:-/tmp}/hgpo-editable-install.lock" .venv-verifiers/bin/python -m pip install --quiet "$COMPILE" -e ".[verifiers,test]"
