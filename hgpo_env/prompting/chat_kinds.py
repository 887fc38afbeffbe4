"""Chat prompts for the memory kinds beyond the window: compaction and notes as messages.

Each is :class:`~hgpo_env.prompting.chat.ChatMemory` listed before the kind's class, so the kind
keeps its rules (when to compact, what the notes hold, which level keys what) and the chat window
lays out its prompts: what the kind carries (the summary, the notes) goes into the system message
after the task. A summary turn is the steps leaving the context as turns, the observation they
led to, then the request as a user message; its level 0 hashes those messages, salted as every
chat key is. Under ``response_format="tool_call"`` a summary is plain text (no tool is called)
and notes are written in the reply's text beside the call.
"""

from __future__ import annotations

from typing import Any

from hgpo_env.contract.fingerprint import canonical_text
from hgpo_env.prompting.chat import ChatMemory, chat_answers, rendered_text
from hgpo_env.prompting.compaction import SUMMARY_FORMATS, CompactionMemory
from hgpo_env.prompting.memory import tagged
from hgpo_env.prompting.notes import NotesMemory, notes_request
from hgpo_env.prompting.tool_calls import canonical_json

CHAT_SUMMARY_FORMATS = {
    **SUMMARY_FORMATS,
    "tool_call": (
        "These steps leave your context now: later prompts show your summary in their place. "
        "Call no tool: reply with a summary of {what}, keeping what you will need later, and nothing else."
    ),
}


class ChatCompaction(ChatMemory, CompactionMemory):
    """``memory="compaction"`` as chat messages (module doc)."""

    def _request_prompt(self, task: str) -> list[dict[str, Any]]:
        shown = list(self._shown_history)
        leaving = shown[: len(self._leaving)]
        following = shown[len(self._leaving)]  # the first step kept: there are K >= 1
        request = self._request_text(CHAT_SUMMARY_FORMATS)
        return self.template.summary_request(
            task, leaving, following.observation, request, self._summary_lines()
        )

    def _request_state(self, request: Any) -> tuple[str, int]:
        return rendered_text(request), self.fingerprinter.fields(
            "chat-summary-request", self._salt, canonical_json(request)
        )

    def _summary_key(self) -> int:
        return self.fingerprinter.fields("chat-summary", *self._summary_lines())  # the line as shown

    def _summary_of(self, reply: Any) -> str | None:
        if self.response_format == "think_action":
            return tagged(self.template.written(reply), "summary")
        return canonical_text(self.template.said(reply))


class ChatNotes(ChatMemory, NotesMemory):
    """``memory="notes"`` as chat messages (module doc): the system message asks for the notes
    before the action, and shows them."""

    @classmethod
    def answer_format(cls, response_format: str, free_form: bool, **kind_options: Any) -> str:
        tag = kind_options.get("notes_tag", "notes")
        if response_format == "think_action":
            command = (
                "write your next command"
                if free_form
                else "choose exactly one admissible action and write it"
            )
            return (
                "Each turn, first reason step by step about the current situation inside <think> </think> "
                f"tags. Then {notes_request(tag)}. Then {command} inside <action> </action> tags."
            )
        answer = chat_answers(free_form)[response_format].removeprefix("Each turn, ")
        return f"Each turn, first {notes_request(tag)}. Then {answer}"
