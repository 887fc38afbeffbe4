"""Notes: the agent rewrites its notes in every reply; the prompt shows the task, the notes and
the current observation only, so its length stays constant (MEM1-style agents).

Each reply carries the notes in a tag the prompt's answer format names (``<notes>`` by default);
the wrapper takes them out before the env's parser sees the reply, and the next prompt shows them.
A reply without the tag leaves the notes empty: the reply is the agent's whole memory.

For an agent that chooses its reply from a list (constrained decoding), ``info["admissible_replies"]``
pairs each note it may keep (its notes so far, or one sentence of the observation) with each
admissible command.

Keys (:mod:`hgpo_env.contract.fingerprint`): level 0 is the state, level 1 the state with the notes shown;
levels above 1 (up to K = ``history_length``) are 0, as the prompt shows no past step.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, SupportsFloat

import gymnasium as gym

from hgpo_env.contract.info import env_attribute
from hgpo_env.prompting.memory import (
    ANSWER_FORMATS,
    DEFAULT_HISTORY_LENGTH,
    FREE_FORM_ANSWER_FORMATS,
    KStepMemory,
    PromptTemplate,
    sentences,
    tagged,
    untagged,
)


def notes_request(tag: str) -> str:
    """What every notes answer format asks before the action."""
    return (
        f"rewrite your notes inside <{tag}> </{tag}> tags: the next prompt shows only the task, your "
        "notes and the current observation, so keep there everything you will need later"
    )


def notes_answer_format(response_format: str, tag: str, free_form: bool = False) -> str:
    """The answer format of ``response_format`` that asks for the notes in ``<tag>`` before the action."""
    command = "your next command" if free_form else "exactly one admissible action"
    notes = notes_request(tag)
    if response_format == "plain":
        return f"Now it is your turn to act. First {notes}. Then reply with {command} and nothing else."
    return (
        "Now it is your turn to act. First reason step by step about the current situation inside "
        f"<think> </think> tags. Then {notes}. Then write {command} inside <action> </action> tags."
    )


class NotesMemory(KStepMemory):
    """Memory of notes the agent rewrites each turn (module doc); ``notes_tag`` names the tag,
    which the template's answer format must ask for."""

    measured_against_window = True

    def __init__(
        self,
        env: gym.Env[str, str],
        history_length: int = DEFAULT_HISTORY_LENGTH,
        fingerprint_mode: str = "observations_actions",
        *,
        notes_tag: str = "notes",
        fingerprint_state: str = "text",
        template: PromptTemplate | None = None,
        response_format: str = "think_action",
    ) -> None:
        if history_length < 1:
            raise ValueError(
                f"memory='notes' needs history_length >= 1 (level 1's key holds the notes), got {history_length}"
            )
        if not notes_tag.isidentifier():
            raise ValueError(f"notes_tag must be a tag name (letters, digits, _), got {notes_tag!r}")
        if template is None and response_format in ANSWER_FORMATS:
            free_form = bool(env_attribute(env, "free_form", False))
            template = PromptTemplate(
                env_attribute(env, "prompt_intro"),
                notes_answer_format(response_format, notes_tag, free_form),
                list_actions=not free_form,
            )
        if template is not None and f"<{notes_tag}>" not in template.answer_format:
            raise ValueError(
                f"memory='notes' reads the notes from <{notes_tag}> tags, which the template's "
                "answer_format does not ask for"
            )
        super().__init__(
            env,
            history_length,
            fingerprint_mode,
            fingerprint_state=fingerprint_state,
            template=template,
            response_format=response_format,
        )
        self.notes_tag = notes_tag
        self._notes = ""
        free_form = bool(env_attribute(env, "free_form", False))
        window_answers = (FREE_FORM_ANSWER_FORMATS if free_form else ANSWER_FORMATS).get(response_format)
        if window_answers is not None:
            self.window_template = PromptTemplate(
                self.template.intro, window_answers, self.template.list_actions
            )

    @property
    def notes(self) -> str:
        """The notes the prompt shows."""
        return self._notes

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        self._notes = ""
        return super().reset(seed=seed, options=options)

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        """Take the notes out of ``action`` (a reply, or a chat model's assistant message, whose
        content holds them), then step with the rest."""
        message = isinstance(action, Mapping)
        text = (action.get("content") or "") if message else action
        self._notes = tagged(text, self.notes_tag) or ""
        rest = untagged(text, self.notes_tag)
        obs, reward, terminated, truncated, info = self._act(
            {**action, "content": rest.strip()} if message else rest
        )
        return self._observe(obs, info), reward, terminated, truncated, info

    def _observe(self, obs: str, info: dict[str, Any]) -> str:
        prompt = super()._observe(obs, info)
        info["admissible_replies"] = self.replies(obs, info["admissible_actions"])
        return prompt

    def replies(self, obs: str, commands: Sequence[str]) -> list[str]:
        """Every reply that keeps one note (the notes so far, or a sentence of ``obs``) and gives
        one of ``commands``."""
        kept = list(dict.fromkeys([*([self._notes] if self._notes else []), *sentences(obs)]))
        tag, fmt = self.notes_tag, self.response_format
        space = " " if fmt == "plain" else ""
        return [f"<{tag}>{note}</{tag}>{space}{self.command_reply(c)}" for note in kept for c in commands]

    def _context(self, obs: str, info: dict[str, Any]) -> tuple[str, tuple[int, ...], int]:
        prompt = self._render([], obs, info, [f"Your notes: {self._notes or '(empty)'}"])
        notes = self.fingerprinter.text("notes", self._notes)
        return prompt, self.fingerprinter.levels(self._state, [notes], self.history_length + 1), 0
