"""The memory kinds an env's prompt can have, chosen by one argument (``memory=``) everywhere.

* ``window`` (the default): the last K steps (:class:`~hgpo_env.memory.KStepMemory`).
* ``compaction``: older steps folded into a summary the agent writes in summary turns
  (:class:`~hgpo_env.compaction.CompactionMemory`; ``compact_every``, ``compact_at_tokens``,
  ``summarizer``).
* ``notes``: notes the agent rewrites in every reply (:class:`~hgpo_env.notes.NotesMemory`;
  ``notes_tag``).

An option of another kind than the chosen one is refused, not ignored.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym

from hgpo_env.compaction import CompactionMemory, SummaryRequest
from hgpo_env.memory import DEFAULT_HISTORY_LENGTH, KStepMemory, Tokenizer
from hgpo_env.notes import NotesMemory

MEMORY_KINDS = ("window", "compaction", "notes")
KIND_OPTIONS = {
    "window": ("max_prompt_tokens",),
    "compaction": ("compact_every", "compact_at_tokens", "summarizer"),
    "notes": ("notes_tag",),
}
"""The options only one kind takes (``tokenizer`` serves ``max_prompt_tokens`` and ``compact_at_tokens``)."""


def check_memory_options(memory: str, **options: Any) -> None:
    """Refuse an unknown kind, an option of another kind, and compaction without a trigger
    (``options``: the kind options a caller set, None where unset)."""
    if memory not in MEMORY_KINDS:
        raise ValueError(f"memory must be one of {MEMORY_KINDS}, got {memory!r}")
    for kind, names in KIND_OPTIONS.items():
        for name in names:
            if kind != memory and options.get(name) is not None:
                raise ValueError(f"{name} is an option of memory={kind!r}, not of memory={memory!r}")
    if (
        memory == "compaction"
        and options.get("compact_every") is None
        and options.get("compact_at_tokens") is None
    ):
        raise ValueError("memory='compaction' needs compact_every or compact_at_tokens (or both)")


def wrap_memory(
    env: gym.Env[str, str],
    memory: str = "window",
    *,
    history_length: int = DEFAULT_HISTORY_LENGTH,
    fingerprint_mode: str = "observations_actions",
    fingerprint_state: str = "text",
    response_format: str = "think_action",
    tokenizer: Tokenizer | None = None,
    max_prompt_tokens: int | None = None,
    compact_every: int | None = None,
    compact_at_tokens: int | None = None,
    summarizer: Callable[[SummaryRequest], str] | None = None,
    notes_tag: str | None = None,
) -> KStepMemory:
    """``env`` (its responses parsed) with the prompt memory of kind ``memory``.

    ``history_length`` is K: the steps the window shows, the steps a compaction keeps verbatim,
    and for every kind the keys' levels 0..K (under ``notes``, which shows no past step, level 1
    holds the notes and the levels above it are 0).
    """
    check_memory_options(
        memory,
        max_prompt_tokens=max_prompt_tokens,
        compact_every=compact_every,
        compact_at_tokens=compact_at_tokens,
        summarizer=summarizer,
        notes_tag=notes_tag,
    )
    common: dict[str, Any] = {"fingerprint_state": fingerprint_state, "response_format": response_format}
    if memory == "notes":
        if tokenizer is not None:
            raise ValueError("memory='notes' counts no tokens: it takes no tokenizer")
        return NotesMemory(env, history_length, fingerprint_mode, notes_tag=notes_tag or "notes", **common)
    if memory == "compaction":
        return CompactionMemory(
            env,
            history_length,
            fingerprint_mode,
            compact_every=compact_every,
            compact_at_tokens=compact_at_tokens,
            tokenizer=tokenizer,
            summarizer=summarizer,
            **common,
        )
    return KStepMemory(
        env,
        history_length,
        fingerprint_mode,
        tokenizer=tokenizer,
        max_prompt_tokens=max_prompt_tokens,
        **common,
    )
