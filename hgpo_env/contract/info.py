"""The ``info`` contract shared by every HGPO-* environment.

Every key below is present in the ``info`` dict of ``reset`` and ``step`` of an env made with
``gymnasium.make("HGPO-...")`` (``initial_fingerprint`` on ``reset`` only, ``action_key`` on
``step`` only). The plain text env
(``env.unwrapped``) provides the first group; the response parser and the memory wrapper add the
rest. Trainers should read these names from here rather than spell them out.
"""

from __future__ import annotations

from typing import Any, TypedDict

import gymnasium as gym


class EnvInfo(TypedDict):
    """Keys the plain text environment reports (``env.unwrapped``)."""

    admissible_actions: list[str]
    """Commands the environment accepts now, in a stable order."""
    won: bool
    """True once the task is solved."""
    score: float
    """Env-native score (ALFWorld and Rooms: 1.0 when won else 0.0; WebShop: purchase score 0..1)."""
    task: str
    """The task in words, e.g. "put the apple in the kitchen"."""
    task_type: str | None
    """Family of the task (e.g. ALFWorld's six types), None where the env has none."""
    action_valid: bool
    """False when the last command was empty or not admissible: the step was spent, nothing changed."""
    state_text: str
    """The text that identifies the current state for grouping: the raw observation without task
    header, prompt template or admissible list."""
    task_key: int
    """Stable 64-bit identity of the task being played, its goal and hidden initial configuration
    (:func:`hgpo_env.contract.fingerprint.task_key`): equal across processes, machines and runs for one
    task, different for different tasks. Members of a task group must agree on it."""


class AgentInfo(EnvInfo):
    """Keys added by the response parser and the K-step memory wrapper."""

    parsed_action: str | None
    """The command parsed from the model response, None when the response had none."""
    fingerprints: tuple[int, ...]
    """K+1 context fingerprints, level 0..K; 0 means the prompt does not show that level."""
    fingerprint_mode: str
    """``"observations_actions"`` or ``"observations"``, see :mod:`hgpo_env.contract.fingerprint`."""
    history_used: int
    """How many past steps the prompt shows (at most K under the window; fewer early on or under a
    token budget; under ``memory="compaction"`` up to K + ``compact_every`` - 1)."""
    turn: str
    """What the prompt asks for: ``"action"`` (a command for the env) or ``"summary"`` (under
    ``memory="compaction"``: a summary of the steps leaving the context; the env does nothing
    with it and gives reward 0)."""


class StepInfo(AgentInfo):
    """``step`` adds the key of the action it executed."""

    action_key: int
    """64-bit key of the command the env received (``parsed_action``, lower-cased and
    whitespace-collapsed; :meth:`hgpo_env.contract.fingerprint.Fingerprinter.action`): equal for the same
    command in any state, run or machine; one key shared by every response that held no command.
    With level 0 of this step's fingerprints and of the next step's (the state it led to) it is a
    transition (state, action, next state)."""


class ResetInfo(AgentInfo):
    """``reset`` adds a key that lets a trainer verify a task group."""

    initial_fingerprint: int
    """Hash of the task and the initial state: equal for all members of a valid task group."""


ENV_KEYS: tuple[str, ...] = tuple(EnvInfo.__annotations__)
AGENT_KEYS: tuple[str, ...] = tuple(AgentInfo.__annotations__)
STEP_KEYS: tuple[str, ...] = tuple(StepInfo.__annotations__)
GROUP_KEYS: tuple[str, ...] = ("task_key", "initial_fingerprint")
"""The reset keys every member of a task group must agree on: the same task, the same start."""
RESET_KEYS: tuple[str, ...] = tuple(ResetInfo.__annotations__)


ENV_ATTRIBUTES = ("env_family", "prompt_intro")
"""Attributes the wrappers read from the env, or from any wrapper below them (``env_family``
salts the fingerprints, ``prompt_intro`` opens the prompt); ``free_form`` and ``protocol`` are
optional (default False and ``"strict"``)."""


def env_attribute(env: gym.Env, name: str, default: Any = ...) -> Any:
    """``name`` from ``env`` or the first wrapper below it that has it.

    Any env that reports the keys above and has :data:`ENV_ATTRIBUTES` works with the wrappers,
    whatever its class; :class:`hgpo_env.TextAdapter` gives both to a third-party env.
    """
    try:
        return env.get_wrapper_attr(name)
    except AttributeError:
        if default is not ...:
            return default
        raise AttributeError(
            f"{type(env.unwrapped).__name__} has no {name!r}: the HGPO wrappers need env_family and "
            "prompt_intro on the env or a wrapper; adapt a third-party env with hgpo_env.TextAdapter"
        ) from None
