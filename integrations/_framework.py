"""The errors every adapter raises alike: its framework is not installed, or the env's prompts are
not the text turns it plays."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def missing_framework(extra: str, error: ImportError, where: str = "") -> ImportError:
    """One line naming the missing module and the hgpo extra that installs it (``where``: a
    note on where to install it)."""
    return ImportError(f"this integration needs {error.name or error}: pip install -e '.[{extra}]'{where}")


def text_prompts_only(env_kwargs: Mapping[str, Any], integration: str) -> None:
    """Refuse chat prompts (``prompt_format="chat"``) before the framework starts, where an adapter
    hands each prompt on as one text turn: a list of messages there fails deep inside it."""
    prompt_format = env_kwargs.get("prompt_format", "text")
    if prompt_format != "text":
        raise ValueError(
            f"{integration} plays text prompts; prompt_format={prompt_format!r} (chat messages and "
            "tool calls) is not supported there: docs/integrations/index.md names the integrations "
            "that play chat envs"
        )


def conversation_env_kwargs(env_kwargs: Mapping[str, Any], integration: str) -> dict[str, Any]:
    """``env_kwargs`` for an env whose conversation the framework keeps: that conversation is a
    chat env's memory, so the env shows no history of its own (``history_length=0``, the default
    here; another value is refused)."""
    kwargs = dict(env_kwargs)
    if kwargs.get("prompt_format") == "chat" and kwargs.setdefault("history_length", 0) != 0:
        raise ValueError(
            f"{integration} keeps the conversation, which is a chat env's memory: set history_length=0 "
            f"(got {kwargs['history_length']})"
        )
    return kwargs


def turn_message(observation: Any, info: Mapping[str, Any]) -> dict[str, Any]:
    """What a step adds to a conversation the framework keeps: a text env's prompt as a user
    message, or a chat env's current observation, as a tool message answering the reply's call
    where it made one (``info["tool_call"]``)."""
    if isinstance(observation, str):
        return {"role": "user", "content": observation}
    role = "user" if info.get("tool_call") is None else "tool"
    return {"role": role, "content": observation[-1]["content"]}
