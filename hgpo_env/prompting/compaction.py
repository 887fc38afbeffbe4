"""Compaction: the agent summarises the steps leaving its context; later prompts show the summary.

Under ``memory="compaction"`` a prompt shows the task, the summary so far and every step since
the last compaction. Once ``compact_every`` steps have passed since the start or the last
compaction (or when the next prompt would pass ``compact_at_tokens``), all but the last K steps
leave: the env first asks the agent to summarise them together with the old summary. That
summary turn is a step of the episode: its prompt is the request (``info["turn"] == "summary"``),
the env takes no action and gives reward 0, and the reply becomes the summary every later prompt
shows in their place. A ``summarizer`` callable (a frozen model, a rule) may write the summary
instead; then the agent sees no summary turn and nothing about summaries is trained.

Keys (:mod:`hgpo_env.contract.fingerprint`): level 0 is the state; level k < K covers the last k steps as
the window's does; level K covers everything the prompt shows, every step since the compaction
and the summary. A summary turn's level 0 is the request (old summary and leaving steps), its
other levels 0; its action key is the summary's.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple, SupportsFloat

import gymnasium as gym

from hgpo_env.contract.fingerprint import MISSING, canonical_text
from hgpo_env.prompting.memory import (
    DEFAULT_HISTORY_LENGTH,
    SUMMARY_TURN,
    KStepMemory,
    PastStep,
    PromptTemplate,
    Tokenizer,
    sentences,
    tagged,
)

SUMMARY_FORMATS = {
    "think_action": (
        "These steps leave your context now: later prompts show your summary in their place. "
        "First reason step by step inside <think> </think> tags about what you will need later. "
        "Then write a summary of {what} inside <summary> </summary> tags."
    ),
    "plain": (
        "These steps leave your context now: later prompts show your summary in their place. "
        "Reply with a summary of {what}, keeping what you will need later, and nothing else."
    ),
}


class SummaryRequest(NamedTuple):
    """What a summariser is asked: the task, the old summary (None before the first compaction),
    the steps leaving the context (oldest first) and the request prompt the agent would see."""

    task: str
    previous: str | None
    leaving: tuple[PastStep, ...]
    prompt: str


def shown_facts(previous: str | None, leaving: Sequence[PastStep]) -> list[str]:
    """The facts a summary turn offers as its admissible replies (for constrained decoding): the
    old summary, then each sentence the leaving observations showed, without repeats."""
    facts = [previous] if previous else []
    facts += [fact for past in leaving for fact in sentences(past.observation)]
    return list(dict.fromkeys(facts))


class CompactionMemory(KStepMemory):
    """K-step memory whose older steps are folded into a summary the agent writes (module doc).

    ``history_length`` (K >= 1) steps stay verbatim after a compaction; the top level's key covers
    the summary. ``compact_every`` and ``compact_at_tokens`` (with ``tokenizer``) are the
    triggers, either or both.
    """

    measured_against_window = True

    def __init__(
        self,
        env: gym.Env[str, str],
        history_length: int = DEFAULT_HISTORY_LENGTH,
        fingerprint_mode: str = "observations_actions",
        *,
        compact_every: int | None = None,
        compact_at_tokens: int | None = None,
        tokenizer: Tokenizer | None = None,
        summarizer: Callable[[SummaryRequest], str] | None = None,
        fingerprint_state: str = "text",
        template: PromptTemplate | None = None,
        response_format: str = "think_action",
    ) -> None:
        if history_length < 1:
            raise ValueError(
                f"memory='compaction' needs history_length >= 1 (level K's key holds the summary), "
                f"got {history_length}"
            )
        if compact_every is None and compact_at_tokens is None:
            raise ValueError("memory='compaction' needs compact_every or compact_at_tokens (or both)")
        if compact_every is not None and compact_every < 1:
            raise ValueError(f"compact_every must be positive, got {compact_every}")
        if compact_at_tokens is not None and tokenizer is None:
            raise ValueError("compact_at_tokens counts tokens: pass the tokenizer too")
        if compact_at_tokens is not None and compact_at_tokens < 1:
            raise ValueError(f"compact_at_tokens must be positive, got {compact_at_tokens}")
        super().__init__(
            env,
            history_length,
            fingerprint_mode,
            fingerprint_state=fingerprint_state,
            template=template,
            response_format=response_format,
        )
        self.compact_every = compact_every
        self.compact_at_tokens = compact_at_tokens
        self.summarizer = summarizer
        self._tokenizer = tokenizer
        self._history = deque()  # every step since the last compaction
        self._shown_history = deque()
        self._summary: str | None = None
        self._summarised_through = 0
        self._leaving: tuple[PastStep, ...] = ()
        self._waiting: tuple[Any, dict[str, Any]] | None = None
        """The env's observation and info held back while the agent writes a summary."""

    @property
    def summary(self) -> str | None:
        """The summary the prompt shows (None before the first compaction)."""
        return self._summary

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        self._summary, self._summarised_through, self._leaving, self._waiting = None, 0, (), None
        prompt, info = super().reset(seed=seed, options=options)
        if self.compact_at_tokens is not None and self._tokens(prompt) > self.compact_at_tokens:
            raise ValueError(
                f"compact_at_tokens={self.compact_at_tokens} is below the prompt without history "
                f"({self._tokens(prompt)} tokens): no compaction can make prompts fit"
            )
        return prompt, info

    def step(self, action: str) -> tuple[str, SupportsFloat, bool, bool, dict[str, Any]]:
        if self._waiting is not None:
            return self._take_summary(action)
        obs, reward, terminated, truncated, info = self._act(action)
        prompt = self._observe(obs, info)
        if terminated or truncated or not self._due(prompt):
            return prompt, reward, terminated, truncated, info
        self._leaving = tuple(self._history)[: len(self._history) - self.history_length]
        request = self._request_prompt(info["task"])
        if self.summarizer is not None:
            written = self.summarizer(SummaryRequest(info["task"], self._summary, self._leaving, request))
            self._fold(canonical_text(written))
            return self._observe(obs, info), reward, terminated, truncated, info
        self._waiting = (obs, info)
        return request, reward, False, False, self._request_info(info, request)

    def _due(self, prompt: str) -> bool:
        """Whether steps must leave before ``prompt`` is shown."""
        if len(self._history) <= self.history_length:
            return False
        if self.compact_every is not None and self._steps_taken % self.compact_every == 0:
            return True
        return self.compact_at_tokens is not None and self._tokens(prompt) > self.compact_at_tokens

    def _request_prompt(self, task: str) -> Any:
        """The summary turn's prompt: the steps leaving, then what to write."""
        return "\n".join(
            [
                self.template.intro,
                f"Your task is to: {task}",
                *self._summary_lines(),
                "Steps leaving your context:",
                *[self.template.past_step(past) for past in self._leaving],
                self._request_text(SUMMARY_FORMATS),
            ]
        )

    def _request_text(self, formats: Mapping[str, str]) -> str:
        """What a summary turn asks for, in the reply format's words among ``formats``."""
        what = "these steps" if self._summary is None else "these steps and of the summary above"
        return formats[self.response_format].format(what=what)

    def _request_state(self, request: Any) -> tuple[str, int]:
        """A summary turn's ``state_text`` (the old summary and the steps leaving) and its key."""
        body = "\n".join([*self._summary_lines(), *(self.template.past_step(p) for p in self._leaving)])
        return body, self.fingerprinter.text("summary-request", body)

    def _request_info(self, info: dict[str, Any], request: Any) -> dict[str, Any]:
        """The info of a summary turn's prompt: the step's own keys, the request's fingerprints
        (level 0 only) and the facts it offers, bare and as whole replies."""
        body, key = self._request_state(request)
        facts = shown_facts(self._summary, self._leaving)
        levels = (key,) + (MISSING,) * self.history_length
        info = {name: value for name, value in info.items() if name != "window_prompt"}
        return {
            **info,
            "turn": SUMMARY_TURN,
            "state_text": body,
            "admissible_actions": facts,
            "admissible_replies": [self.summary_reply(fact) for fact in facts],
            "fingerprints": levels,
            "history_used": len(self._leaving),
        }

    def summary_reply(self, summary: str) -> str:
        """The reply that writes ``summary`` and nothing else, in the reply format."""
        return f"<summary>{summary}</summary>" if self.response_format == "think_action" else summary

    def _summary_of(self, reply: Any) -> str | None:
        """The summary a summary turn's reply wrote (None or empty when it wrote none)."""
        return tagged(reply, "summary") if self.response_format == "think_action" else canonical_text(reply)

    def _take_summary(self, reply: str) -> tuple[str, SupportsFloat, bool, bool, dict[str, Any]]:
        """The summary turn's step: fold the leaving steps into the reply, then show the prompt
        the env's observation was waiting for."""
        assert self._waiting is not None
        (obs, info), self._waiting = self._waiting, None
        summary = self._summary_of(reply)
        self._fold(summary or "")
        prompt = self._observe(obs, info)
        info = {**info, "parsed_action": summary, "action_valid": bool(summary)}
        info["action_key"] = self.fingerprinter.action(summary)
        info.pop("parse_error", None)
        if not summary:
            info["parse_error"] = "no summary: " + (
                "no <summary> </summary> block" if self.response_format == "think_action" else "empty reply"
            )
        return prompt, 0.0, False, False, info

    def _fold(self, summary: str) -> None:
        """The leaving steps give way to ``summary``."""
        for _ in self._leaving:
            self._history.popleft()
            self._shown_history.popleft()
        self._summary, self._summarised_through = summary, self._leaving[-1].number

    def _summary_lines(self) -> list[str]:
        if self._summary is None:
            return []
        return [f"Summary of your first {self._summarised_through} step(s): {self._summary or '(empty)'}"]

    def _context(self, obs: str, info: dict[str, Any]) -> tuple[str, tuple[int, ...], int]:
        shown = list(self._shown_history)
        prompt = self._render(shown, obs, info, self._summary_lines())
        items = [past.record for past in reversed(self._history)]
        if self._summary is not None:
            items.append(self._summary_key())
        return (
            prompt,
            self.fingerprinter.covering_levels(self._state, items, self.history_length + 1),
            len(shown),
        )

    def _summary_key(self) -> int:
        """The key the summary adds to level K."""
        return self.fingerprinter.text("summary", self._summary or "")

    def _tokens(self, prompt: Any) -> int:
        assert self._tokenizer is not None
        return len(self._tokenizer.encode(self.prompt_text(prompt)))
