"""What crosses the wire: the action and observation models, and the ``info`` contract as JSON.

The action is the model's raw response; the observation carries the prompt, the reward, ``done``
and, in ``metadata``, every ``info`` key of the env plus ``terminated`` and ``truncated`` (the
OpenEnv wire has ``done`` only). 64-bit fingerprints do not survive JSON readers that parse
numbers as doubles (JavaScript, many others), so ``fingerprints``, ``initial_fingerprint``,
``task_key`` and ``action_key`` travel as decimal strings; :func:`info_from_wire` turns them back
into ints. A value JSON cannot hold (in an env's own ``env_info``) is sent as its ``repr``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from openenv.core.env_server.types import Action, Observation
from pydantic import Field

from hgpo_env.contract.info import RESET_KEYS
from hgpo_env.contract.milestones import MILESTONES_KEY

MAX_RESPONSE_CHARS = 1_000_000
"""Longest response a server steps with; a longer one gets an error reply (not echoed back)."""
_INTEGER_KEYS = ("initial_fingerprint", "task_key", "action_key")


class HGPOAction(Action):
    """One model response, as ``env.step`` takes it."""

    response: str = Field(description="the model's raw response")


class HGPOObservation(Observation):
    """The prompt for the next response; ``metadata`` holds the ``info`` contract (see module)."""

    prompt: str | list[dict[str, Any]] = Field(
        default="", description="the full LLM prompt the K-step memory wrote: text, or chat messages"
    )


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)
    return value


def _server_path(value: Any) -> bool:
    """Whether ``value`` names a file of the server: an absolute or home-relative path that exists."""
    return (
        isinstance(value, str)
        and value.startswith(("/", "~"))
        and len(value) < 4096
        and Path(value).expanduser().exists()
    )


def info_to_wire(info: dict[str, Any], terminated: bool, truncated: bool) -> dict[str, Any]:
    """``info`` as JSON-safe metadata, with ``terminated`` and ``truncated`` apart. Values that are
    server paths (ALFWorld's ``game_file``) stay on the server: clients get no paths, and envs
    give a machine-independent id beside them (ALFWorld's ``game_id``)."""
    wire = {
        key: value if key in RESET_KEYS else _jsonable(value)
        for key, value in info.items()
        if not _server_path(value)
    }
    wire["fingerprints"] = [str(key) for key in info["fingerprints"]]
    for key in _INTEGER_KEYS:
        if key in info:
            wire[key] = str(info[key])
    wire["terminated"], wire["truncated"] = bool(terminated), bool(truncated)
    return wire


def info_from_wire(metadata: dict[str, Any]) -> tuple[dict[str, Any], bool, bool]:
    """The ``info`` dict a local env would have given (fingerprints as ints again, milestones a
    tuple), and ``terminated`` and ``truncated``."""
    info = dict(metadata)
    terminated, truncated = bool(info.pop("terminated", False)), bool(info.pop("truncated", False))
    info["fingerprints"] = tuple(int(key) for key in info["fingerprints"])
    if MILESTONES_KEY in info:
        info[MILESTONES_KEY] = tuple(info[MILESTONES_KEY])
    for key in _INTEGER_KEYS:
        if key in info:
            info[key] = int(info[key])
    return info, terminated, truncated
