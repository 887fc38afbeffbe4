"""Patching OpenRLHF modules in the processes that import them, and only there.

A Ray setup hook runs in every actor of a run: vLLM engines and env actors as well as the
DeepSpeed ones. Importing an OpenRLHF module to patch it would pull DeepSpeed into all of them
(OpenRLHF keeps the two apart on purpose), so a patch waits for the module's first import.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import types
from collections.abc import Callable
from typing import Any

Patch = Callable[[types.ModuleType], None]


class PatchOnImport(importlib.abc.MetaPathFinder):
    """Runs ``patches[name]`` on module ``name`` right after its first import in this process."""

    def __init__(self, patches: dict[str, Patch]) -> None:
        self.patches = patches

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in self.patches:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        execute = spec.loader.exec_module

        def exec_module(module: types.ModuleType) -> None:
            execute(module)
            self.patches[name](module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def patch_modules(patches: dict[str, Patch]) -> None:
    """Patch the modules already imported now, the others when they are."""
    for name, patch in patches.items():
        if name in sys.modules:
            patch(sys.modules[name])
    sys.meta_path.insert(0, PatchOnImport(patches))
