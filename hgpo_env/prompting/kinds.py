"""The memory kinds an env's prompt can have, chosen by one argument (``memory=``) everywhere.

* ``window`` (the default): the last K steps (:class:`~hgpo_env.prompting.memory.KStepMemory`).
* ``compaction``: older steps folded into a summary the agent writes in summary turns
  (:class:`~hgpo_env.prompting.compaction.CompactionMemory`; ``compact_every``, ``compact_at_tokens``,
  ``summarizer``).
* ``notes``: notes the agent rewrites in every reply (:class:`~hgpo_env.prompting.notes.NotesMemory`;
  ``notes_tag``).

One :class:`MemoryOptions` carries the kind and its options wherever they go; an option of
another kind than the chosen one is refused, not ignored.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import gymnasium as gym

from hgpo_env.prompting.chat import ChatMemory, ChatSettings
from hgpo_env.prompting.chat_kinds import ChatCompaction, ChatNotes
from hgpo_env.prompting.compaction import CompactionMemory, SummaryRequest
from hgpo_env.prompting.memory import DEFAULT_HISTORY_LENGTH, KStepMemory, Tokenizer
from hgpo_env.prompting.notes import NotesMemory

MEMORY_KINDS = ("window", "compaction", "notes")
KIND_OPTIONS = {
    "window": ("max_prompt_tokens",),
    "compaction": ("compact_every", "compact_at_tokens", "summarizer"),
    "notes": ("notes_tag",),
}
"""The options only one kind takes (``tokenizer`` serves ``max_prompt_tokens`` and ``compact_at_tokens``)."""
KIND_CLASSES: dict[str, type[KStepMemory]] = {
    "window": KStepMemory,
    "compaction": CompactionMemory,
    "notes": NotesMemory,
}
CHAT_KIND_CLASSES: dict[str, type[KStepMemory]] = {
    "window": ChatMemory,
    "compaction": ChatCompaction,
    "notes": ChatNotes,
}
"""Each kind's wrapper, for text prompts and for chat prompts (``prompt_format="chat"``)."""


@dataclass(frozen=True)
class MemoryOptions:
    """The memory kind of an env's prompt and the options of that kind, checked once: what the
    run config, :func:`~hgpo_env.textenv.registration.make_agent_env`, the pool and the server
    pass on. An unknown kind, an option of another kind (refused, not ignored) and compaction
    without a trigger raise ``ValueError``."""

    memory: str = "window"
    max_prompt_tokens: int | None = None
    compact_every: int | None = None
    compact_at_tokens: int | None = None
    summarizer: Callable[[SummaryRequest], str] | None = None
    notes_tag: str | None = None

    def __post_init__(self) -> None:
        if self.memory not in MEMORY_KINDS:
            raise ValueError(f"memory must be one of {MEMORY_KINDS}, got {self.memory!r}")
        for kind, names in KIND_OPTIONS.items():
            for name in names:
                if kind != self.memory and getattr(self, name) is not None:
                    raise ValueError(f"{name} is an option of memory={kind!r}, not of memory={self.memory!r}")
        if self.memory == "compaction" and self.compact_every is None and self.compact_at_tokens is None:
            raise ValueError("memory='compaction' needs compact_every or compact_at_tokens (or both)")

    @classmethod
    def pop_from(cls, kwargs: dict[str, Any]) -> MemoryOptions:
        """The options among ``kwargs`` (a ``gymnasium.make`` call's), taken out of it."""
        return cls(**{f.name: kwargs.pop(f.name) for f in fields(cls) if f.name in kwargs})

    def as_kwargs(self) -> dict[str, Any]:
        """The options set, as keyword arguments (none for a default window: a server that
        predates memory kinds still takes a window run's)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) != f.default}


def wrap_memory(
    env: gym.Env[str, str],
    options: MemoryOptions = MemoryOptions(),
    *,
    history_length: int = DEFAULT_HISTORY_LENGTH,
    fingerprint_mode: str = "observations_actions",
    fingerprint_state: str = "text",
    response_format: str = "think_action",
    tokenizer: Tokenizer | None = None,
    chat: ChatSettings | None = None,
    history_replies: str = "action",
) -> KStepMemory:
    """``env`` (its responses parsed) with the prompt memory ``options`` choose, its prompts text
    or, with ``chat`` settings, chat messages (:mod:`hgpo_env.prompting.chat`).

    ``history_length`` is K: the steps the window shows, the steps a compaction keeps verbatim,
    and for every kind the keys' levels 0..K (under ``notes``, which shows no past step, level 1
    holds the notes and the levels above it are 0).
    """
    kwargs: dict[str, Any] = {"fingerprint_state": fingerprint_state, "response_format": response_format}
    if options.memory == "notes":
        if tokenizer is not None:
            raise ValueError("memory='notes' counts no tokens: it takes no tokenizer")
        kwargs["notes_tag"] = options.notes_tag or "notes"
    elif options.memory == "compaction":
        kwargs.update(
            compact_every=options.compact_every,
            compact_at_tokens=options.compact_at_tokens,
            tokenizer=tokenizer,
            summarizer=options.summarizer,
        )
    else:
        kwargs.update(tokenizer=tokenizer, max_prompt_tokens=options.max_prompt_tokens)
    if chat is not None:
        kwargs.update(settings=chat, history_replies=history_replies)
    kind = (CHAT_KIND_CLASSES if chat is not None else KIND_CLASSES)[options.memory]
    return kind(env, history_length, fingerprint_mode, **kwargs)
