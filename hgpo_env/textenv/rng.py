"""Private random streams for third-party envs that draw from the process-global ones.

Many text games call ``random.randint`` or ``np.random.choice`` (TextArena, GEM seed the global
``random`` on reset). Two such envs in one process (a pool worker hosts many) then advance each
other's streams, and members of a task group stop playing the same game. :class:`IsolatedRNG`
gives one env its own ``random.Random`` and ``numpy.random.RandomState`` and, while the env runs,
makes the module-level functions of ``random`` and ``numpy.random`` draw from them.

It swaps the modules' function attributes, not their states: about a microsecond per call, where
saving and restoring the global states costs tens. Code that bound a function at import
(``from random import choice``) or uses another generator is not covered; envs are not
thread-safe here (a pool runs them in processes).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from types import ModuleType
from typing import Any, TypeVar

import numpy as np


def _bound_names(module: ModuleType, generator: Any) -> tuple[str, ...]:
    """Module attributes that are methods of the module's hidden global generator."""
    return tuple(
        name
        for name in dir(module)
        if not name.startswith("_") and callable(getattr(module, name)) and hasattr(generator, name)
    )


_PY_NAMES = _bound_names(random, random.Random())
_NP_NAMES = _bound_names(np.random, np.random.RandomState())
_PY_GLOBAL = {name: getattr(random, name) for name in _PY_NAMES}
_NP_GLOBAL = {name: getattr(np.random, name) for name in _NP_NAMES}
_PY_MODULE = vars(random)
_NP_MODULE = vars(np.random)
_T = TypeVar("_T")


class IsolatedRNG:
    """An env's own ``random`` and ``numpy.random`` streams; during :meth:`call` the module-level
    functions draw from them (not re-entrant: one env runs at a time)."""

    def __init__(self, seed: int = 0) -> None:
        self.python = random.Random()
        self.numpy = np.random.RandomState()
        self._python_functions = {name: getattr(self.python, name) for name in _PY_NAMES}
        self._numpy_functions = {name: getattr(self.numpy, name) for name in _NP_NAMES}
        self.seed(seed)

    def seed(self, seed: int) -> None:
        """Restart both streams from ``seed`` (a group's members get equal streams)."""
        self.python.seed(seed)
        self.numpy.seed(seed % 2**32)

    def call(self, function: Callable[..., _T], /, *args: Any) -> _T:
        """``function(*args)`` on these streams (a call rather than a ``with`` block: its protocol
        would be a fifth of the swap's 2 µs, paid on every env step)."""
        _PY_MODULE.update(self._python_functions)
        _NP_MODULE.update(self._numpy_functions)
        try:
            return function(*args)
        finally:
            _PY_MODULE.update(_PY_GLOBAL)
            _NP_MODULE.update(_NP_GLOBAL)
