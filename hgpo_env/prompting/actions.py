"""Turning a raw model response into an environment command.

Two response formats:

``think_action`` (default), the format of the paper's prompts::

    <think> free reasoning </think> <action> go north </action>

``plain``: the whole response is the command.

Validity rules, checked in this order (the first that fails names the reason):

1. The response is at most ``max_response_chars`` characters (a runaway generation is rejected
   before any scanning).
2. ``think_action`` only: exactly one ``<action>`` and one ``</action>`` tag (case-insensitive),
   the opening one first. A ``<think>`` block is optional unless ``require_think``; when one
   opens before the action it must close before ``<action>`` (an action inside the reasoning is
   ambiguous). A lone ``</think>`` also closes the reasoning, as chat templates that open
   ``<think>`` in the prompt produce. Text after ``</action>`` is ignored.
3. The command (the tag content, or the whole response in ``plain``) is canonicalised: NFC,
   whitespace runs collapsed to one space, stripped. It must then be non-empty, at most
   ``max_action_chars`` characters, and free of control, format, surrogate, private-use and
   unassigned characters (Unicode category C).

Whether the command is admissible is the environment's call; parsing only checks the form.
Parsing never raises for any string and never touches the environment. These are the rules of
the ``"strict"`` protocol; :mod:`hgpo_env.contract.protocol` has the papers' ``"verl-agent"`` rules.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from typing import Any, SupportsFloat

import gymnasium as gym

from hgpo_env.contract.fingerprint import canonical_text
from hgpo_env.contract.info import env_attribute
from hgpo_env.contract.protocol import FALLBACK_CHARS, MAX_SENT_CHARS

RESPONSE_FORMATS = ("think_action", "plain")

_TAG = re.compile(r"<(/?)(think|action)>", re.IGNORECASE)
_CJK = re.compile("[\u4e00-\u9fff]")


@dataclass(frozen=True, slots=True)
class ParsedResponse:
    """A parsed response: the command to send (None: nothing) and, for an invalid step, why.

    Under the strict rules an invalid response sends nothing; under verl-agent's it may still
    send a command.
    """

    action: str | None
    error: str | None = None

    @property
    def valid(self) -> bool:
        return self.error is None


def _check_command(text: str, max_action_chars: int) -> ParsedResponse:
    command = canonical_text(text)
    if not command:
        return ParsedResponse(None, "empty action")
    if len(command) > max_action_chars:
        return ParsedResponse(None, f"action longer than {max_action_chars} characters")
    if not command.isprintable() and any(unicodedata.category(ch)[0] == "C" for ch in command):
        return ParsedResponse(None, "action contains control or unassigned characters")
    return ParsedResponse(command)


def _action_block(response: str, require_think: bool) -> str | ParsedResponse:
    """The raw text inside the single action block, or the reason it cannot be found."""
    tags = [(m.group(1) == "/", m.group(2).lower(), m.start(), m.end()) for m in _TAG.finditer(response)]
    opens = [t for t in tags if t[1] == "action" and not t[0]]
    closes = [t for t in tags if t[1] == "action" and t[0]]
    if not opens or not closes:
        return ParsedResponse(None, "no <action>...</action> block")
    if len(opens) > 1 or len(closes) > 1:
        return ParsedResponse(None, "more than one <action> block")
    start, end = opens[0][3], closes[0][2]
    if end < start:
        return ParsedResponse(None, "</action> before <action>")
    think_open = think_closed = False
    for closing, name, position, _ in tags:
        if name != "think" or position >= opens[0][2]:
            continue
        think_open, think_closed = not closing, closing
    if think_open:
        return ParsedResponse(None, "<think> not closed before <action>")
    if require_think and not think_closed:
        return ParsedResponse(None, "no <think>...</think> block before the action")
    return response[start:end]


def parse_response(
    response: str,
    response_format: str = "think_action",
    *,
    require_think: bool = False,
    max_response_chars: int = 16384,
    max_action_chars: int = 256,
) -> ParsedResponse:
    """Extract the command from a model response under the rules of this module's docstring."""
    if response_format not in RESPONSE_FORMATS:
        raise ValueError(f"response_format must be one of {RESPONSE_FORMATS}, got {response_format!r}")
    if not isinstance(response, str):
        raise TypeError(f"a response is a str, got {type(response).__name__}")
    if len(response) > max_response_chars:
        return ParsedResponse(None, f"response longer than {max_response_chars} characters")
    if response_format == "plain":
        return _check_command(response, max_action_chars)
    block = _action_block(response, require_think)
    if isinstance(block, ParsedResponse):
        return block
    return _check_command(block, max_action_chars)


def project_verl_agent(response: str, env_family: str) -> ParsedResponse:
    """The command verl-agent sends for ``response`` and, when the step is invalid, why; the
    command is made encodable and cut at :data:`~hgpo_env.contract.protocol.MAX_SENT_CHARS`."""
    projected = _project_verl_agent(response, env_family)
    if projected.action is None:
        return projected
    command = projected.action.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
    return ParsedResponse(command[:MAX_SENT_CHARS], projected.error)


def _project_verl_agent(response: str, env_family: str) -> ParsedResponse:
    lowered = response.lower()
    start, end = lowered.find("<action>"), lowered.find("</action>")
    if start == -1 or end == -1:
        return ParsedResponse(lowered[-FALLBACK_CHARS[env_family] :], "no <action>...</action> block")
    command = lowered[start + len("<action>") : end].strip()
    if "<think>" not in response or "</think>" not in response:
        return ParsedResponse(command, "no <think> and </think> tags")
    if _CJK.search(response):
        return ParsedResponse(command, "CJK characters in the response")
    return ParsedResponse(command)


class ParseResponse(gym.Wrapper[str, str, str, str]):
    """Accepts raw model responses and steps the text env with the command they carry.

    The env's ``protocol`` (:mod:`hgpo_env.contract.protocol`) decides the rules. Strict: an unparseable
    response still spends a step, the env receiving an empty command that it rejects without
    changing state, and ``action_valid`` is true only when the response parsed *and* the env
    accepted the command. verl-agent: the projected command is always sent, and ``action_valid``
    is the projection's verdict alone. ``info`` gains ``parsed_action`` (what was sent) and, for
    an invalid response, ``parse_error``.
    """

    def __init__(
        self,
        env: gym.Env[str, str],
        response_format: str = "think_action",
        *,
        require_think: bool = False,
        max_response_chars: int = 16384,
        max_action_chars: int = 256,
    ) -> None:
        super().__init__(env)
        parse_response("", response_format)  # validates the format name early
        self.protocol = env_attribute(env, "protocol", "strict")
        self._family = env_attribute(env, "env_family") if self.protocol == "verl-agent" else None
        if self.protocol == "verl-agent" and response_format != "think_action":
            raise ValueError(
                "protocol='verl-agent' reads <think> and <action> tags: use response_format='think_action'"
            )
        self.response_format = response_format
        self._options = {
            "require_think": require_think,
            "max_response_chars": max_response_chars,
            "max_action_chars": max_action_chars,
        }

    def reset(self, **kwargs: Any) -> tuple[str, dict[str, Any]]:
        obs, info = self.env.reset(**kwargs)
        info["parsed_action"] = None
        return obs, info

    def parse(self, response: str) -> ParsedResponse:
        if self.protocol == "verl-agent":
            return project_verl_agent(response, self._family)
        return parse_response(response, self.response_format, **self._options)

    def step(self, action: str) -> tuple[str, SupportsFloat, bool, bool, dict[str, Any]]:
        parsed = self.parse(action)
        obs, reward, terminated, truncated, info = self.env.step(parsed.action or "")
        info["parsed_action"] = parsed.action
        info["action_valid"] = parsed.valid and (self.protocol == "verl-agent" or info["action_valid"])
        if parsed.error is not None:
            info["parse_error"] = parsed.error
        return obs, reward, terminated, truncated, info
