"""What a client of an env server may choose: the task, and only the env arguments the operator allows.

The env's constructor arguments are the operator's, fixed at launch: an argument can read a
path (``data_path``) or size memory (``history_length``, ``num_products``), and one message from
anyone who can connect would otherwise choose them. A client picks the task (``seed``,
``task_id``, or the Task API's ``split`` and ``index``); the ``env_kwargs`` of its reset may only
repeat the values the server runs with (a trainer sends its whole env config), choose ``split``,
or set a key the operator named with ``--allow KEY`` or ``--allow KEY=LOW..HIGH`` (numbers).
"""

from __future__ import annotations

import re
import reprlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

from hgpo_env.textenv.registration import env_defaults

TASK_KEYS = frozenset({"split"})
"""Env arguments that choose tasks, which every client may set."""
_PATH = re.compile(r"(?<![\w.:/~-])(?:~|\.{1,2})?/(?:[\w.@+-]+/)*[\w.@+-]+")
"""Absolute, home-relative (``~/``) and explicitly relative (``./``, ``../``) file paths."""
_GYM_KWARGS = re.compile(r" with kwargs \(.*", re.DOTALL)
"""Gymnasium's ``... was raised from the environment creator for ID with kwargs ({...})``."""


def redact(text: str, server_values: Iterable[Any] = ()) -> str:
    """``text`` fit for a stranger: the server's own argument values (paths with spaces, keys)
    replaced wherever they appear, gymnasium's echo of the arguments cut, file paths replaced."""
    for value in server_values:
        if isinstance(value, (str, PurePath)) and len(str(value)) >= 4:
            text = text.replace(str(value), "<server argument>")
    return _PATH.sub("<path>", _GYM_KWARGS.sub("", text))


@dataclass(frozen=True)
class Allowed:
    """An env argument clients may set; numbers within ``[low, high]`` when bounds are given."""

    name: str
    low: float | None = None
    high: float | None = None

    @classmethod
    def parse(cls, text: str) -> Allowed:
        """``KEY`` or ``KEY=LOW..HIGH``."""
        name, _, bounds = text.partition("=")
        low, dots, high = bounds.partition("..")
        message = f"--allow takes KEY or KEY=LOW..HIGH (numbers), got {text!r}"
        if not name.isidentifier() or (bounds and not dots):
            raise ValueError(message)
        if not bounds:
            return cls(name)
        try:
            allowed = cls(name, float(low), float(high))
        except ValueError:
            raise ValueError(message) from None
        if not allowed.low <= allowed.high:  # an empty range would refuse every value
            raise ValueError(f"--allow {text}: the low bound is above the high one")
        return allowed

    def check(self, value: Any) -> None:
        if self.low is None or self.high is None:
            return
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not self.low <= value <= self.high
        ):
            raise ValueError(
                f"env argument {self.name!r} must be a number in [{self.low:g}, {self.high:g}], got {reprlib.repr(value)}"
            )


class ClientChoices:
    """Resolves the env arguments of a client's reset against the operator's."""

    def __init__(
        self, env_id: str, launch_kwargs: Mapping[str, Any], allowed: Sequence[Allowed] = ()
    ) -> None:
        self.launch_kwargs = dict(launch_kwargs)
        self.effective = {**env_defaults(env_id), **self.launch_kwargs}
        self.allowed = {a.name: a for a in allowed}

    def resolve(self, requested: Mapping[str, Any] | None) -> dict[str, Any]:
        """The arguments to make the session's env with; a ``ValueError`` names every argument
        the client may not set."""
        kwargs = dict(self.launch_kwargs)
        refused = []
        for name, value in (requested or {}).items():
            if name in self.effective and _same(self.effective[name], value):
                continue
            if name in TASK_KEYS:
                kwargs[name] = value
            elif name in self.allowed:
                self.allowed[name].check(value)
                kwargs[name] = value
            else:
                refused.append(name)
        if refused:  # named, cut short (the names are the client's and may be huge); the values the
            # server runs with are never shown: they may be paths or carry secrets
            names = [_short(name) for name in refused[:8]]
            raise ValueError(
                f"env arguments {names} are the operator's: a client may repeat the values the server "
                f"runs with and choose the task and {sorted(TASK_KEYS | set(self.allowed))}"
            )
        return kwargs


def _short(name: str, limit: int = 60) -> str:
    return name if len(name) <= limit else f"{name[:limit]}..."


def _same(served: Any, requested: Any) -> bool:
    """Equal values, a tuple default equal to the list JSON made of it included."""
    return (list(served) if isinstance(served, tuple) else served) == requested
