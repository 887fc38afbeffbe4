"""K-step memory: the wrapper that writes the LLM prompt and the context fingerprints.

The prompt shows the task, the last K steps (observation and action) and the current
observation with its admissible actions. The same wrapper emits one fingerprint per level of
that shown context (:mod:`hgpo_env.contract.fingerprint`), so whatever the prompt shows is exactly what
the keys hash: levels the prompt does not show are 0, equal prompts give equal keys.
"""

from __future__ import annotations

import re
import warnings
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, SupportsFloat

import gymnasium as gym

from hgpo_env.contract.fingerprint import Fingerprinter, canonical_text, task_key
from hgpo_env.contract.info import env_attribute

ANSWER_FORMATS = {
    "think_action": (
        "Now it is your turn to act. First reason step by step about the current situation "
        "inside <think> </think> tags. Then choose exactly one admissible action and write it "
        "inside <action> </action> tags."
    ),
    "plain": "Now it is your turn to act. Reply with exactly one admissible action and nothing else.",
}
FREE_FORM_ANSWER_FORMATS = {
    "think_action": (
        "Now it is your turn to act. First reason step by step about the current situation "
        "inside <think> </think> tags. Then write your next command inside <action> </action> tags."
    ),
    "plain": "Now it is your turn to act. Reply with your next command and nothing else.",
}
"""Answer formats for worlds without an admissible list (``free_form``)."""
DEFAULT_HISTORY_LENGTH = 2
"""K, the past steps a prompt shows by default: the HGPO paper's setting."""
NO_ACTION = "(no valid action)"
ACTION_TURN, SUMMARY_TURN = "action", "summary"
"""What a prompt asks for (``info["turn"]``): a command for the env, or a summary of the steps
leaving the context (:class:`~hgpo_env.prompting.compaction.CompactionMemory`)."""
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")


def tagged(response: str, tag: str) -> str | None:
    """The canonical content of the last ``<tag>...</tag>`` block of ``response`` (tags in any
    case), None when it has none."""
    found = re.findall(rf"<{re.escape(tag)}>(.*?)</{re.escape(tag)}>", response, re.IGNORECASE | re.DOTALL)
    return canonical_text(found[-1]) if found else None


def action_reply(command: str, response_format: str) -> str:
    """The reply that gives ``command`` in ``response_format`` and says nothing else: what an
    agent whose replies are chosen from a list (constrained decoding) writes."""
    return command if response_format == "plain" else f"<action>{command}</action>"


def sentences(text: str) -> list[str]:
    """The sentences of ``text``, canonical, in order: the facts a memory turn can offer to keep."""
    return [s for s in (canonical_text(part) for part in _SENTENCE_END.split(text)) if s]


def untagged(response: str, tag: str) -> str:
    """``response`` without its ``<tag>...</tag>`` blocks (what the env's parser should see)."""
    return re.sub(
        rf"<{re.escape(tag)}>.*?</{re.escape(tag)}>", " ", response, flags=re.IGNORECASE | re.DOTALL
    )


class Tokenizer(Protocol):
    def encode(self, text: str) -> Sequence[int]: ...


class PastStep(NamedTuple):
    """One remembered step: what the prompt shows of it and the key it adds to fingerprints.

    ``observation`` is the step's ``state_text``: the observation without headers the prompt
    already shows once (WebShop repeats the instruction on every page). ``error`` says why the
    reply gave no valid action, ``reply`` the reply as the agent gave it (chat prompts show them).
    """

    number: int
    observation: str
    action: str | None
    record: int
    error: str | None = None
    reply: Any = None


@dataclass(frozen=True)
class PromptTemplate:
    """Lays out a prompt; ``intro`` describes the world, ``answer_format`` the reply.

    ``list_actions`` False leaves out the admissible list (free-form worlds have none).
    :class:`KStepMemory` calls :meth:`past_step` once per step and :meth:`layout` once per prompt
    (:meth:`render` is the two together): a subclass changes the text by overriding those two.
    """

    intro: str
    answer_format: str = ANSWER_FORMATS["think_action"]
    list_actions: bool = True

    def render(
        self,
        task: str,
        steps_taken: int,
        history: Sequence[PastStep],
        observation: str,
        admissible_actions: Sequence[str],
    ) -> str:
        """The prompt text; ``history`` is in chronological order."""
        shown = [self.past_step(past) for past in history]
        return self.layout(task, steps_taken, shown, observation, admissible_actions)

    def past_step(self, past: PastStep) -> str:
        """How the prompt shows one remembered step (made once per step by :class:`KStepMemory`)."""
        return (
            f"[Step {past.number}] Observation: {past.observation}\n"
            f"[Step {past.number}] Action: {past.action or NO_ACTION}"
        )

    def layout(
        self,
        task: str,
        steps_taken: int,
        shown_history: Sequence[str],
        observation: str,
        admissible_actions: Sequence[str],
        carried: Sequence[str] = (),
    ) -> str:
        """The prompt around remembered steps already shown by :meth:`past_step`; ``carried``
        are the lines a memory kind keeps beside them (a summary, notes), shown after the task."""
        lines = [self.intro, f"Your task is to: {task}", *carried]
        if steps_taken == 0:
            lines.append("This is your first step.")
        elif not shown_history:
            lines.append(f"You have taken {steps_taken} step(s) so far.")
        else:
            lines.append(
                f"You have taken {steps_taken} step(s) so far. "
                f"Your last {len(shown_history)} observation(s) and action(s):"
            )
            lines.extend(shown_history)
        lines.append(f"You are now at step {steps_taken + 1}. Current observation: {observation}")
        if self.list_actions:
            lines.append("Admissible actions:")
            lines.extend([f"- {action}" for action in admissible_actions])
        lines.append(self.answer_format)
        return "\n".join(lines)


class KStepMemory(gym.Wrapper[str, str, str, str]):
    """Turns observations into prompts with the last ``history_length`` steps and adds
    ``fingerprints``, ``fingerprint_mode``, ``history_used`` (and ``initial_fingerprint`` on reset)
    to ``info``.

    Works on any env that reports the :mod:`hgpo_env.contract.info` keys and has ``env_family`` and
    ``prompt_intro`` on itself or a wrapper below (:func:`~hgpo_env.contract.info.env_attribute`); for a
    ``free_form`` env the prompt has no admissible list and asks for any command.

    An env that reports no ``task_key`` (one on the contract by hand) gets one hashed from its task
    text and first ``state_text``, which cannot see hidden state.

    ``fingerprint_state="text_and_actions"`` makes state keys hash the sorted admissible actions
    beside ``state_text`` (:data:`~hgpo_env.contract.fingerprint.STATE_SOURCES`).

    With ``tokenizer`` and ``max_prompt_tokens``, the history window shrinks (oldest step first)
    until the prompt fits; ``history_used`` says how many steps remained and the levels above it
    are 0. The budget counts the prompt text only: leave room for the chat template.
    """

    measured_against_window = False
    """Whether each action prompt's info carries the window's prompt (``window_prompt``): the
    memory kinds other than the window, whose saving it measures."""

    def __init__(
        self,
        env: gym.Env[str, str],
        history_length: int = DEFAULT_HISTORY_LENGTH,
        fingerprint_mode: str = "observations_actions",
        *,
        fingerprint_state: str = "text",
        template: PromptTemplate | None = None,
        response_format: str = "think_action",
        tokenizer: Tokenizer | None = None,
        max_prompt_tokens: int | None = None,
    ) -> None:
        super().__init__(env)
        if history_length < 0:
            raise ValueError(f"history_length must be >= 0, got {history_length}")
        if (tokenizer is None) != (max_prompt_tokens is None):
            raise ValueError("a token budget needs both tokenizer and max_prompt_tokens")
        if max_prompt_tokens is not None and max_prompt_tokens < 1:
            raise ValueError(f"max_prompt_tokens must be positive, got {max_prompt_tokens}")
        if template is None:
            if response_format not in ANSWER_FORMATS:
                raise ValueError(
                    f"response_format must be one of {tuple(ANSWER_FORMATS)}, got {response_format!r}"
                )
            free_form = bool(env_attribute(env, "free_form", False))
            answers = FREE_FORM_ANSWER_FORMATS if free_form else ANSWER_FORMATS
            template = PromptTemplate(
                env_attribute(env, "prompt_intro"), answers[response_format], list_actions=not free_form
            )
        self.history_length = history_length
        self.template = template
        self.window_template = template
        """How ``memory="window"`` would lay out this env's prompts (:meth:`window_prompt`)."""
        self.response_format = response_format
        self.tokenizer = tokenizer
        self.max_prompt_tokens = max_prompt_tokens
        self.fingerprinter = Fingerprinter(
            env_attribute(env, "env_family"), fingerprint_mode, fingerprint_state
        )
        self._history: deque[PastStep] = deque(maxlen=history_length)
        self._shown_history: deque[str] = deque(maxlen=history_length)
        self._steps_taken = 0
        self._observation = ""
        self._state = 0
        self._task_key = 0

    @property
    def history(self) -> tuple[PastStep, ...]:
        """The remembered steps, oldest first."""
        return tuple(self._history)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        obs, info = self.env.reset(seed=seed, options=options)
        self._history.clear()
        self._shown_history.clear()
        self._steps_taken = 0
        prompt = self._observe(obs, info)
        info["initial_fingerprint"] = self.fingerprinter.initial(info["task"], info["state_text"])
        if "task_key" not in info:  # an env on the contract by hand: the weakest identity there is
            info["task_key"] = task_key(self.fingerprinter.family, f"{info['task']}\n{info['state_text']}")
        self._task_key = info["task_key"]
        return prompt, info

    def step(self, action: str) -> tuple[str, SupportsFloat, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self._act(action)
        return self._observe(obs, info), reward, terminated, truncated, info

    def _act(self, action: str) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        """Step the env with ``action`` and remember the step; the observation is the env's."""
        obs, reward, terminated, truncated, info = self.env.step(action)
        info.setdefault("task_key", self._task_key)
        if "parsed_action" not in info:  # no response parser below: the action was a command
            info["parsed_action"] = canonical_text(action) or None
        self._steps_taken += 1
        parsed = info["parsed_action"]
        info["action_key"] = self.fingerprinter.action(parsed)
        past = PastStep(self._steps_taken, self._observation, parsed, 0, info.get("parse_error"), action)
        shown = self.template.past_step(past)
        past = past._replace(record=self._record_key(past, shown))
        self._history.append(past)
        if self.history_length:  # K = 0 shows no past step
            self._shown_history.append(shown)
        return obs, reward, terminated, truncated, info

    def _observe(self, obs: str, info: dict[str, Any]) -> str:
        """Render the prompt for ``obs`` and add the fingerprint keys to ``info``."""
        self._observation = info["state_text"]
        self._state = self._state_key(obs, info)
        prompt, info["fingerprints"], info["history_used"] = self._context(obs, info)
        info["fingerprint_mode"] = self.fingerprinter.mode
        info["turn"] = ACTION_TURN
        if self.measured_against_window:
            info["window_prompt"] = self.window_prompt(obs, info)
        return prompt

    def _state_key(self, obs: str, info: dict[str, Any]) -> int:
        """Level 0 of the prompt for ``obs``: the state's key."""
        return self.fingerprinter.state(info["state_text"], info["admissible_actions"])

    def _record_key(self, past: PastStep, shown: Any) -> int:
        """The key a remembered step adds to the levels above it (``shown``: how prompts show it)."""
        return self.fingerprinter.record(self._state, past.action)

    def window_prompt(self, obs: str, info: dict[str, Any]) -> str:
        """The prompt ``memory="window"`` would show for ``obs`` now, the last K steps: what the
        other kinds' prompts save against (``info["window_prompt"]`` under them)."""
        shown = list(self._shown_history)
        shown = shown[len(shown) - self.history_length :] if self.history_length else []
        return self.window_template.layout(
            info["task"], self._steps_taken, shown, obs, info["admissible_actions"]
        )

    def _context(self, obs: str, info: dict[str, Any]) -> tuple[str, tuple[int, ...], int]:
        """The prompt for ``obs``, its keys and how many past steps it shows: the window, shrunk
        to the token budget."""
        shown = list(self._shown_history)
        prompt = self._render(shown, obs, info)
        while self.max_prompt_tokens is not None and shown and self._too_long(prompt):
            shown.pop(0)
            prompt = self._render(shown, obs, info)
        if self.max_prompt_tokens is not None and not shown and self._too_long(prompt):
            warnings.warn(
                f"prompt exceeds max_prompt_tokens={self.max_prompt_tokens} even without history",
                stacklevel=4,
            )
        records = [past.record for past in reversed(self._history)][: len(shown)]
        return prompt, self.fingerprinter.levels(self._state, records, self.history_length + 1), len(shown)

    def _render(
        self, shown_history: Sequence[str], obs: str, info: dict[str, Any], carried: Sequence[str] = ()
    ) -> str:
        return self.template.layout(
            info["task"], self._steps_taken, shown_history, obs, info["admissible_actions"], carried
        )

    def _too_long(self, prompt: str) -> bool:
        assert self.tokenizer is not None and self.max_prompt_tokens is not None
        return len(self.tokenizer.encode(self.prompt_text(prompt))) > self.max_prompt_tokens

    def prompt_text(self, prompt: Any) -> str:
        """What a token budget counts of ``prompt``: a text prompt is its text."""
        return prompt

    def command_reply(self, command: str) -> str:
        """The reply that gives ``command`` and says nothing else (:func:`action_reply`)."""
        return action_reply(command, self.response_format)
