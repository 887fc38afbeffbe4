"""Acting by tool calls: an env family's tools and the wrapper that steps the env with the call
a reply makes (``response_format="tool_call"``).

An env family offers a fixed :class:`ToolSet` (its ``agent_tools`` attribute; games get one
``act(command)`` tool): the admissible actions go in the observation, never into a schema, so
equal histories render equal prompts whatever is admissible. A tool set maps a call to the env's
command and a command back to its canonical call, which is how past steps are shown.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, SupportsFloat

import gymnasium as gym

from hgpo_env.contract.fingerprint import canonical_text
from hgpo_env.contract.info import env_attribute
from hgpo_env.prompting.tool_calls import ParsedCall, Tool, ToolCall, parse_tool_call


@dataclass(frozen=True)
class ToolSet:
    """The tools of an env family, each with one string argument that carries the command:
    ``commands`` maps a tool's name to its argument and to the command's form (``{}`` for the
    argument's text; ``"search[{}]"`` for WebShop's)."""

    tools: tuple[Tool, ...]
    commands: Mapping[str, tuple[str, str]]

    def __post_init__(self) -> None:
        names = {tool.name for tool in self.tools}
        if set(self.commands) != names:
            raise ValueError(
                f"commands name the tools {sorted(self.commands)}, the tools are {sorted(names)}"
            )

    def command(self, call: ToolCall) -> str:
        """The env command ``call`` stands for."""
        argument, form = self.commands[call.name]
        return form.format(canonical_text(str(call.arguments[argument])))

    def call(self, command: str) -> ToolCall:
        """The canonical call of ``command``: the first tool whose form matches it."""
        for name, (argument, form) in self.commands.items():
            prefix, _, suffix = form.partition("{}")
            found = re.fullmatch(f"{re.escape(prefix)}(.*){re.escape(suffix)}", command, re.DOTALL)
            if found:
                return ToolCall(name, {argument: found.group(1)})
        raise ValueError(f"no tool of {sorted(self.commands)} gives the command {command!r}")

    def schemas(self) -> list[dict[str, Any]]:
        """The tools as chat templates take them."""
        return [tool.schema() for tool in self.tools]


def one_argument_tool(name: str, description: str, argument: str, about: str) -> Tool:
    """A tool with one required string argument."""
    properties = {argument: {"type": "string", "description": about}}
    return Tool(name, description, {"type": "object", "properties": properties, "required": [argument]})


ACT_TOOLS = ToolSet(
    (one_argument_tool("act", "Send one command to the environment.", "command", "An admissible action."),),
    {"act": ("command", "{}")},
)
"""The tool of every game: ``act(command)``."""


class ParseToolCall(gym.Wrapper[str, Any, str, str]):
    """Accepts a raw reply or an OpenAI assistant message and steps the text env with the
    command its single tool call stands for (:func:`~hgpo_env.prompting.tool_calls.parse_tool_call`).

    ``info`` gains ``parse`` (the status), ``tool_call`` (the call as ``{"name", "arguments"}``,
    or for ``bad_args`` the tool named with no arguments; None otherwise), ``parsed_action`` and,
    for an invalid reply,
    ``parse_error``. A reply that is not one valid call spends a step as the strict text protocol
    does: the env receives an empty command it rejects, and ``action_valid`` is false.
    """

    def __init__(
        self, env: gym.Env[str, str], call_format: str = "hermes", *, reasoning_open: bool = False
    ) -> None:
        super().__init__(env)
        if env_attribute(env, "protocol", "strict") != "strict":
            raise ValueError("response_format='tool_call' follows the strict protocol: the env's is not")
        self.tool_set: ToolSet = env_attribute(env, "agent_tools", ACT_TOOLS)
        self.call_format = call_format
        self.reasoning_open = reasoning_open
        parse_tool_call("", self.tool_set.tools, call_format)  # validates the format name early

    @property
    def tools(self) -> tuple[Tool, ...]:
        return self.tool_set.tools

    def parse(self, reply: str | Mapping[str, Any]) -> ParsedCall:
        return parse_tool_call(
            reply, self.tool_set.tools, self.call_format, reasoning_open=self.reasoning_open
        )

    def reset(self, **kwargs: Any) -> tuple[str, dict[str, Any]]:
        obs, info = self.env.reset(**kwargs)
        info.update(parsed_action=None, tool_call=None)
        return obs, info

    def step(self, action: str | Mapping[str, Any]) -> tuple[str, SupportsFloat, bool, bool, dict[str, Any]]:
        parsed = self.parse(action)
        command = self.tool_set.command(parsed.call) if parsed.ok and parsed.call is not None else None
        obs, reward, terminated, truncated, info = self.env.step(command or "")
        call = None if parsed.call is None else {"name": parsed.call.name, "arguments": parsed.call.arguments}
        info.update(parse=parsed.status, tool_call=call, parsed_action=command)
        info["action_valid"] = parsed.ok and info["action_valid"]
        if not parsed.ok:
            info["parse_error"] = f"{parsed.status}: {parsed.detail}"
        return obs, reward, terminated, truncated, info
