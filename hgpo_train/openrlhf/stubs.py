"""Stand-ins for the GPU-only packages OpenRLHF imports at module level (``vllm``, ``flash_attn``).

OpenRLHF's own CPU tests put ``MagicMock`` modules in ``sys.modules`` for what they do not run;
this does the same, so the backend's classes import, and OpenRLHF's argument parser runs, on a
machine without CUDA (CI, a laptop doing a dry run). A stub is installed only for a package that
is not importable; nothing that needs the real package (generation, attention kernels) works.
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import importlib.util
import sys
from collections.abc import Iterator, Sequence
from unittest import mock

GPU_PACKAGES: tuple[str, ...] = ("vllm", "flash_attn")
"""Imported by openrlhf modules at import time; CUDA-only wheels."""

SUBMODULES: dict[str, tuple[str, ...]] = {
    "vllm": (
        "inputs",
        "utils",
        "distributed",
        "distributed.utils",
        "distributed.device_communicators",
        "distributed.device_communicators.pynccl",
    ),
    "flash_attn": (
        "bert_padding",
        "utils",
        "utils.distributed",
        "ops",
        "ops.triton",
        "ops.triton.cross_entropy",
    ),
}
"""The submodules openrlhf 0.11.2 imports from each package (``from vllm.inputs import ...``)."""


def missing(packages: Sequence[str] = GPU_PACKAGES) -> list[str]:
    """The packages of ``packages`` that cannot be imported here."""
    return [name for name in packages if name not in sys.modules and importlib.util.find_spec(name) is None]


def stub_modules(packages: Sequence[str]) -> dict[str, mock.MagicMock]:
    """``MagicMock`` modules for ``packages`` and their known submodules, keyed by module name."""
    stubs: dict[str, mock.MagicMock] = {}
    for package in packages:
        stubs[package] = _module(package)
        stubs[package].__version__ = "0.0.0+stub"
        for sub in SUBMODULES.get(package, ()):
            name = f"{package}.{sub}"
            parent, _, leaf = name.rpartition(".")
            stubs[name] = _module(name)
            setattr(stubs[parent], leaf, stubs[name])
    return stubs


def _module(name: str) -> mock.MagicMock:
    """A stub module with a real spec: transformers probes packages with ``find_spec``."""
    module = mock.MagicMock(name=name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, loader=None, is_package=True)
    module.__path__ = []
    return module


@contextlib.contextmanager
def stubbed_gpu_packages(packages: Sequence[str] = GPU_PACKAGES) -> Iterator[list[str]]:
    """Within the block, the missing ones of ``packages`` import as stubs; yields their names.

    Only the stubs are removed afterwards: modules imported inside the block (openrlhf's) stay
    cached with their references to the stubs, so use it only where nothing runs the real GPU
    code later in the same process.
    """
    stubs = stub_modules(missing(packages))
    sys.modules.update(stubs)
    try:
        yield sorted(name for name in stubs if "." not in name)
    finally:
        for name, stub in stubs.items():
            if sys.modules.get(name) is stub:
                del sys.modules[name]
