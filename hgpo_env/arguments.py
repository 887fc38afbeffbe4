"""Checking ``gymnasium.make`` keyword arguments against the type hints of what receives them.

A wrongly typed argument would otherwise surface far from its cause (``history_length="two"``
as ``'<' not supported between 'str' and 'int'``); here it names the argument and the type.
Hints that cannot be checked by ``isinstance`` (protocols, type variables) accept anything.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, Literal, Union

import numpy as np


def _matches(value: Any, hint: Any) -> bool:
    origin = typing.get_origin(hint)
    if hint is Any:
        return True
    if origin in (Union, types.UnionType):
        return any(_matches(value, option) for option in typing.get_args(hint))
    if origin is Literal:
        return value in typing.get_args(hint)
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, (bool, np.bool_))
    if hint is int:
        return isinstance(value, (int, np.integer)) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    kind = origin if origin is not None else hint
    if not isinstance(kind, type) or getattr(kind, "_is_protocol", False):
        return True
    return isinstance(value, kind)


def _describe(hint: Any) -> str:
    if typing.get_origin(hint) in (Union, types.UnionType):
        return " or ".join(_describe(option) for option in typing.get_args(hint))
    if typing.get_origin(hint) is Literal:
        return " or ".join(repr(choice) for choice in typing.get_args(hint))
    if hint is type(None):
        return "None"
    return getattr(hint, "__name__", str(hint))


def check_argument_types(function: Callable[..., Any], arguments: Mapping[str, Any]) -> None:
    """Raise ``TypeError`` naming the first argument whose value does not fit ``function``'s hint."""
    hints = typing.get_type_hints(function)
    for name, value in arguments.items():
        hint = hints.get(name)
        if hint is not None and not _matches(value, hint):
            raise TypeError(f"{name} must be {_describe(hint)}, got {value!r} ({type(value).__name__})")
