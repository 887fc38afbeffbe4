"""Chat prompts (``prompt_format="chat"``): the window as the messages a chat template renders,
and keys of exactly those messages.

A prompt is a system message (the env's intro, the task, how to answer), then each remembered
step as real turns (its observation, then the agent's reply as an assistant message), then the
current observation with its admissible actions. An observation answering a tool call is a tool
message answering that call; any other is a user message, so every window has a user query.
Past replies are shown as the canonical reply of the command the step executed
(``history_replies="action"``, as the paper's memory shows actions): no reasoning, a call's
arguments as canonical JSON and its id counted back from the current turn (``call_1`` is the
last), so equal histories render equal prompts; ``"content"`` and ``"verbatim"`` show more
(:data:`HISTORY_REPLIES`). A reply that gave no valid action is shown as ``(no valid action)``
and the next observation starts with why.

Keys follow the text format's chain (:mod:`hgpo_env.contract.fingerprint`), over what the
messages hold: level 0 hashes a digest of the template settings and the tools (the salt), the
system text and the current observation's text; each shown step adds a record of its
observation, its reply message and its error. The roles and call ids follow from those, so two
prompts of the same level-k window are equal exactly when their level-k keys are.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import gymnasium as gym

from hgpo_env.contract.info import env_attribute
from hgpo_env.prompting.calling import ToolSet
from hgpo_env.prompting.memory import NO_ACTION, KStepMemory, PastStep, action_reply
from hgpo_env.prompting.tool_calls import ToolCall, as_message, canonical_json, split_reasoning, write_call

PROMPT_FORMATS = ("text", "chat")
HISTORY_REPLIES = ("action", "content", "verbatim")
"""How past replies are shown: the canonical reply of the command executed (the paper's memory,
no reasoning: equal histories render equally); what the reply said outside its reasoning and its
call, with the call canonical; or the reply as written (groups above level 0 then rarely share)."""
CHAT_ANSWER_FORMATS = {
    "think_action": (
        "Each turn, first reason step by step about the current situation inside <think> </think> "
        "tags. Then choose exactly one admissible action and write it inside <action> </action> tags."
    ),
    "plain": "Each turn, reply with exactly one admissible action and nothing else.",
    "tool_call": (
        "Each turn, act by calling exactly one tool; its result is your next observation. "
        "Use one of the admissible actions listed with the observation."
    ),
}
FREE_FORM_CHAT_ANSWER_FORMATS = {
    "think_action": (
        "Each turn, first reason step by step about the current situation inside <think> </think> "
        "tags. Then write your next command inside <action> </action> tags."
    ),
    "plain": "Each turn, reply with your next command and nothing else.",
    "tool_call": "Each turn, act by calling exactly one tool; its result is your next observation.",
}


def chat_answers(free_form: bool) -> dict[str, str]:
    """The window's answer formats, for worlds with or without an admissible list."""
    return FREE_FORM_CHAT_ANSWER_FORMATS if free_form else CHAT_ANSWER_FORMATS


class Messages(gym.spaces.Space[list]):
    """The observation space of chat prompts: lists of messages, each a mapping with a ``role``
    among system, user, assistant and tool and a text ``content``."""

    ROLES = ("system", "user", "assistant", "tool")

    def __init__(self) -> None:
        super().__init__(dtype=None)

    def contains(self, x: Any) -> bool:
        return isinstance(x, list) and all(
            isinstance(m, Mapping) and m.get("role") in self.ROLES and isinstance(m.get("content"), str)
            for m in x
        )

    def sample(self, mask: Any = None, probability: Any = None) -> list[dict[str, Any]]:
        return [{"role": "user", "content": ""}]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Messages)


@dataclass(frozen=True)
class ChatStep:
    """One remembered step as turns show it: its observation, the reply shown for it (an
    assistant message without call ids) and, for an invalid reply, why."""

    observation: str
    reply: Mapping[str, Any]
    error: str | None = None


@dataclass(frozen=True)
class ChatLayout:
    """Lays out chat prompts as :class:`~hgpo_env.prompting.memory.PromptTemplate` lays out text:
    :meth:`past_step` once per step, :meth:`layout` once per prompt. ``tool_set`` is the env's
    tools under ``response_format="tool_call"`` (None otherwise)."""

    intro: str
    answer_format: str
    response_format: str = "think_action"
    list_actions: bool = True
    tool_set: ToolSet | None = None
    history_replies: str = "action"
    call_format: str = "hermes"
    reasoning_open: bool = False

    def past_step(self, past: PastStep) -> ChatStep:
        """How the prompt shows one remembered step (:data:`HISTORY_REPLIES`)."""
        if self.history_replies == "verbatim":
            return ChatStep(
                past.observation, {"role": "assistant", "content": self.written(past.reply)}, past.error
            )
        if past.action is None:
            said = self.said(past.reply) if self.history_replies == "content" else ""
            return ChatStep(past.observation, {"role": "assistant", "content": said or NO_ACTION}, past.error)
        if self.tool_set is None:
            reply = action_reply(past.action, self.response_format)
            if self.history_replies == "content":
                reply = self.said(past.reply) or reply
            return ChatStep(past.observation, {"role": "assistant", "content": reply})
        call = self.tool_set.call(past.action)
        function = {"name": call.name, "arguments": call.arguments}
        said = self.said(past.reply) if self.history_replies == "content" else ""
        return ChatStep(past.observation, {"role": "assistant", "content": said, "tool_calls": [function]})

    def written(self, reply: Any) -> str:
        """The reply as the model wrote it: the text, or an assistant message's content and its
        calls as the call format writes them."""
        if isinstance(reply, str):
            return reply
        message = as_message(reply)
        calls = [call.get("function", call) for call in message.get("tool_calls") or ()]
        return "\n".join(
            [message.get("content") or "", *(written_call(call, self.call_format) for call in calls)]
        ).strip()

    def said(self, reply: Any) -> str:
        """What the reply says outside its reasoning and its tool call (``history_replies="content"``)."""
        if not isinstance(reply, str):
            return (as_message(reply).get("content") or "").strip()
        content = split_reasoning(reply, self.reasoning_open)[1]
        if self.tool_set is not None:
            content = re.sub(r"<tool_call>.*?(</tool_call>|$)", "", content, flags=re.DOTALL)
            content = "" if self.call_format == "llama3" else content
        return content.strip()

    def system(self, task: str, carried: Sequence[str] = (), answer: bool = True) -> str:
        """The system message's text: the intro, the task, what a memory kind carries (a summary,
        notes), the answer format (unless ``answer`` is False: a summary turn asks for another)."""
        return "\n".join(
            [self.intro, f"Your task is to: {task}", *carried, *([self.answer_format] if answer else [])]
        )

    def current(self, observation: str, admissible_actions: Sequence[str]) -> str:
        """The current observation's text, with its admissible actions (as calls of the tools
        under ``response_format="tool_call"``: ``click(target="Buy Now")``)."""
        if not self.list_actions:
            return observation
        if self.tool_set is not None:
            admissible_actions = [signature(self.tool_set.call(action)) for action in admissible_actions]
        return "\n".join(
            [observation, "Admissible actions:", *[f"- {action}" for action in admissible_actions]]
        )

    def layout(
        self,
        task: str,
        steps_taken: int,
        shown_history: Sequence[ChatStep],
        observation: str,
        admissible_actions: Sequence[str],
        carried: Sequence[str] = (),
    ) -> list[dict[str, Any]]:
        """The messages of a prompt (``steps_taken`` is not shown: turns show the order)."""
        messages, answering, error = self._turns(self.system(task, carried), shown_history)
        messages.append(observation_message(self.current(observation, admissible_actions), answering, error))
        return messages

    def summary_request(
        self,
        task: str,
        leaving: Sequence[ChatStep],
        following: str,
        request: str,
        carried: Sequence[str] = (),
    ) -> list[dict[str, Any]]:
        """The messages of a summary turn (``memory="compaction"``): the steps leaving the context
        as turns, the observation they led to (``following``: it answers the last call, so none
        is left an orphan), then ``request`` as a user message."""
        messages, answering, error = self._turns(self.system(task, carried, answer=False), leaving)
        messages.append(observation_message(following, answering, error))
        messages.append({"role": "user", "content": request})
        return messages

    def _turns(
        self, system: str, shown_history: Sequence[ChatStep]
    ) -> tuple[list[dict[str, Any]], tuple[str, str] | None, str | None]:
        """The system message and the steps' turns; the call (id, tool) the next observation
        answers and the error it starts with."""
        messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
        answering: tuple[str, str] | None = None
        error: str | None = None
        for back, step in zip(range(len(shown_history), 0, -1), shown_history):
            messages.append(observation_message(step.observation, answering, error))
            reply, answering, error = dict(step.reply), None, step.error
            if "tool_calls" in reply:
                call_id = f"call_{back}"
                reply["tool_calls"] = [
                    {"id": call_id, "type": "function", "function": f} for f in reply["tool_calls"]
                ]
                answering = (call_id, reply["tool_calls"][0]["function"]["name"])
            messages.append(reply)
        return messages, answering, error


def signature(call: ToolCall) -> str:
    """A call as a line of the admissible list: its tool and its arguments as JSON values."""
    arguments = ", ".join(
        f"{name}={json.dumps(value, ensure_ascii=False)}" for name, value in call.arguments.items()
    )
    return f"{call.name}({arguments})"


def written_call(function: Mapping[str, Any], call_format: str) -> str:
    """A parsed message's call as ``call_format`` writes it (its arguments as given when they are
    not a JSON object)."""
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return f"{function.get('name')}({arguments})"
    if not isinstance(arguments, dict):
        return f"{function.get('name')}({arguments!r})"
    return write_call(ToolCall(str(function.get("name")), arguments), call_format)


def observation_message(text: str, answering: tuple[str, str] | None, error: str | None) -> dict[str, Any]:
    """An observation's message: a tool message answering the call ``answering`` (its id and
    tool), else a user message; after an invalid reply, it starts with why."""
    content = f"Error: {error}\n{text}" if error else text
    if answering is None:
        return {"role": "user", "content": content}
    return {"role": "tool", "tool_call_id": answering[0], "name": answering[1], "content": content}


def rendered_text(messages: Sequence[Mapping[str, Any]]) -> str:
    """The messages' texts joined: what a token budget counts (the template's markup aside)."""
    parts = [str(message.get("content") or "") for message in messages]
    parts += [canonical_json(call) for message in messages for call in message.get("tool_calls", ())]
    return "\n".join(parts)


@dataclass(frozen=True)
class ChatSettings:
    """What the policy's chat template renders with, pinned by the env so keys can name it:
    the template's text (or a name for it), its keyword settings (``enable_thinking``, a date
    string), the call format replies are parsed in and whether the template's generation prompt
    opens the reasoning block (``reasoning_open``: a reply's text up to ``</think>`` is reasoning)."""

    chat_template: str = ""
    template_kwargs: Mapping[str, Any] = field(default_factory=dict)
    call_format: str = "hermes"
    reasoning_open: bool = False

    def digest(self, tools: Sequence[Mapping[str, Any]]) -> str:
        """A digest of the settings and the tools' schemas: the salt of every chat key."""
        settings = [
            self.chat_template, dict(self.template_kwargs), self.call_format, self.reasoning_open, list(tools)
        ]  # fmt: skip
        return hashlib.sha256(canonical_json(settings).encode()).hexdigest()


class ChatMemory(KStepMemory):
    """The window as chat messages (``prompt_format="chat"``): observations are message lists,
    ``info`` gains ``tools`` (the schemas, empty unless replies are tool calls) and
    ``chat_template_kwargs`` (the settings the env pins), and keys hash what the messages hold
    (this module's docstring). Listed before another memory kind's class, it makes that kind's
    prompts chat messages (:mod:`hgpo_env.prompting.chat_kinds`)."""

    def __init__(
        self,
        env: gym.Env[str, Any],
        history_length: int,
        fingerprint_mode: str = "observations_actions",
        *,
        response_format: str = "think_action",
        settings: ChatSettings = ChatSettings(),
        history_replies: str = "action",
        **kwargs: Any,
    ) -> None:
        if history_replies not in HISTORY_REPLIES:
            raise ValueError(f"history_replies must be one of {HISTORY_REPLIES}, got {history_replies!r}")
        if fingerprint_mode != "observations_actions":
            raise ValueError(
                "prompt_format='chat' shows every reply: its keys need fingerprint_mode='observations_actions'"
            )
        if kwargs.get("fingerprint_state", "text") != "text":
            raise ValueError(
                "prompt_format='chat' keys the current observation with its admissible list: fingerprint_state must be 'text'"
            )
        free_form = bool(env_attribute(env, "free_form", False))
        if response_format not in chat_answers(free_form):
            raise ValueError(
                f"response_format must be one of {tuple(chat_answers(free_form))}, got {response_format!r}"
            )
        tool_set = env_attribute(env, "tool_set", None) if response_format == "tool_call" else None
        layout = ChatLayout(
            env_attribute(env, "prompt_intro"),
            self.answer_format(response_format, free_form, **kwargs),
            response_format,
            not free_form,
            tool_set,
            history_replies,
            settings.call_format,
            settings.reasoning_open,
        )
        super().__init__(
            env, history_length, fingerprint_mode, template=layout, response_format=response_format, **kwargs
        )  # type: ignore[arg-type]
        self.template: ChatLayout = layout  # type: ignore[assignment]
        self.window_template = replace(layout, answer_format=chat_answers(free_form)[response_format])
        self.settings = settings
        self.tools = tool_set.schemas() if tool_set is not None else []
        self._salt = settings.digest(self.tools)
        self.observation_space = Messages()

    @classmethod
    def answer_format(cls, response_format: str, free_form: bool, **kind_options: Any) -> str:
        """The system message's answer format (a memory kind that asks for more overrides it)."""
        return chat_answers(free_form)[response_format]

    def _state_key(self, obs: str, info: dict[str, Any]) -> int:
        current = self.template.current(obs, info["admissible_actions"])
        return self.fingerprinter.fields(
            "chat-state", self._salt, self.template.system(info["task"]), current
        )

    def _record_key(self, past: PastStep, shown: ChatStep) -> int:
        return self.fingerprinter.fields(
            "chat-step", shown.observation, canonical_json(shown.reply), shown.error or ""
        )

    def _observe(self, obs: str, info: dict[str, Any]) -> Any:
        prompt = super()._observe(obs, info)
        info["tools"] = self.tools
        info["chat_template_kwargs"] = dict(self.settings.template_kwargs)
        if self.template.tool_set is not None and info["admissible_actions"]:  # for constrained decoding
            info.setdefault("admissible_replies", [self.command_reply(a) for a in info["admissible_actions"]])
        return prompt

    def command_reply(self, command: str) -> str:
        """The reply that gives ``command``: under tool calls, the call as the call format writes it."""
        if self.template.tool_set is None:
            return super().command_reply(command)
        return write_call(self.template.tool_set.call(command), self.settings.call_format)

    def prompt_text(self, prompt: Any) -> str:
        return rendered_text(prompt)
