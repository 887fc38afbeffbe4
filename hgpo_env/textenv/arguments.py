"""Arguments typed as text, and checking ``gymnasium.make`` keyword arguments against type hints.

Every ``key=value`` on a command line (``python -m hgpo_env serve``, the trainer's overrides,
``hgpo_train.evaluation.evaluate``) is read by :func:`read_value`, so a value means the same everywhere and the
same as in a YAML config file. A wrongly typed argument would otherwise surface far from its cause
(``history_length="two"`` as ``'<' not supported between 'str' and 'int'``); here it names the
argument and the type. Hints that cannot be checked by ``isinstance`` (protocols, type variables)
accept anything.
"""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, Literal, Union

import numpy as np
import yaml


class _Loader(yaml.SafeLoader):
    """YAML's safe loader that also reads ``1e-5`` as a number (PyYAML's YAML 1.1 needs ``1.0e-5``)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def read_yaml(text: str) -> Any:
    """YAML text as config files and command lines are read; ``yaml.YAMLError`` if it is broken."""
    return yaml.load(text, Loader=_Loader)


def read_value(text: str) -> Any:
    """A command-line value as a config file would hold it: ``3``, ``1e-5``, ``true``, ``null``,
    ``[0, 1]``, ``{a: 1}``, anything else text; empty is None. Raises ``ValueError`` in one line
    on broken YAML (``[1, 2``)."""
    if not text.strip():
        return None
    try:
        return read_yaml(text)
    except yaml.YAMLError as error:
        raise ValueError(f"cannot read {text!r}: {str(error).splitlines()[0]}") from None


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
