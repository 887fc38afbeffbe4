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
    """Refuse chat prompts (``prompt_format="chat"``) before the framework starts: the adapters
    hand each prompt on as one text turn, and a list of messages there fails deep inside it."""
    prompt_format = env_kwargs.get("prompt_format", "text")
    if prompt_format != "text":
        raise ValueError(
            f"{integration} plays text prompts; prompt_format={prompt_format!r} (chat messages and "
            "tool calls) is not supported by the integrations yet: train it with python -m hgpo_train"
        )
