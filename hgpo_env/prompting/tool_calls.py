"""Tool calls in a model's reply: found, checked against the tools' schemas, never raising.

A reply is a string the policy sampled, in one of the call formats chat models are trained on
(``call_format``), or an OpenAI assistant message whose ``tool_calls`` a server's tool parser
already filled (vLLM, SGLang, any OpenAI-compatible endpoint):

* ``hermes``: ``<tool_call>{"name": "act", "arguments": {"command": "go north"}}</tool_call>``
  (Qwen2.5, Qwen3, Hermes and the many models trained on their template).
* ``qwen_xml``: ``<tool_call><function=act><parameter=command>go north</parameter></function>
  </tool_call>`` (Qwen3.5, Qwen3-Coder); a parameter's text is read as its schema's type.
* ``llama3``: ``{"name": "act", "parameters": {"command": "go north"}}``, optionally after
  ``<|python_tag|>`` (Llama 3.1 to 3.3's JSON tool calling).

Reasoning is never searched for calls: the text before the last ``</think>`` (or all of it after
an unclosed ``<think>``, or all of it when the prompt opened the block, ``reasoning_open``) and an
OpenAI message's ``reasoning_content``. Exactly one call is an action; its arguments are coerced
to the tool's JSON schema (``"7"`` for an integer, ``"false"`` and Jinja's ``False`` for a
boolean, a number for a string) and then validated by it (``jsonschema``).

Every reply gets one status (:data:`PARSE_STATUSES`); only ``ok`` carries an action.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import jsonschema

CALL_FORMATS = ("hermes", "qwen_xml", "llama3")
PARSE_STATUSES = (
    "ok",
    "no_call",  # no call outside the reasoning
    "bad_json",  # a call whose body is not a well-formed call (JSON, or qwen_xml's markup)
    "unknown_tool",  # a call of a tool the env does not offer
    "bad_args",  # arguments the tool's schema refuses, after coercion
    "multiple_calls",  # more than one call: an env step takes one action
    "call_in_reasoning",  # no call, but one written inside the reasoning
    "unterminated",  # a call opened and never closed (the reply was cut)
)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")
_THINK_OPEN, _THINK_CLOSE = re.compile(r"<think>", re.IGNORECASE), re.compile(r"</think>", re.IGNORECASE)
_PYTHON_TAG = "<|python_tag|>"
_END_MARKERS = ("<|eom_id|>", "<|eot_id|>")
_MARKERS = {
    "hermes": ("<tool_call>",),
    "qwen_xml": ("<tool_call>", "<function="),
    "llama3": (_PYTHON_TAG, '{"name"'),
}
_QWEN_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>(.*)</function>\s*", re.DOTALL)
_QWEN_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.DOTALL)


@dataclass(frozen=True)
class Tool:
    """A function the agent may call: its name, what it does and its arguments' JSON schema
    (an object schema). A name that chat templates cannot show or a schema that is not JSON
    schema raises ``ValueError``."""

    name: str
    description: str
    parameters: Mapping[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name):
            raise ValueError(
                f"a tool name is a letter or _ then up to 63 of [A-Za-z0-9_.-], got {self.name!r}"
            )
        if not isinstance(self.parameters, Mapping) or self.parameters.get("type") != "object":
            raise ValueError(
                f"tool {self.name!r}: parameters must be an object's JSON schema, got {self.parameters!r}"
            )
        try:
            jsonschema.validators.validator_for(self.parameters).check_schema(self.parameters)
        except jsonschema.SchemaError as error:
            raise ValueError(f"tool {self.name!r}: parameters are not JSON schema: {error.message}") from None

    def schema(self) -> dict[str, Any]:
        """The tool as chat templates and OpenAI's API take it (``tools=[...]``)."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": dict(self.parameters),
            },
        }

    def check(self, arguments: Any) -> tuple[dict[str, Any] | None, str]:
        """The arguments coerced to the schema and checked, or None and why they are refused."""
        if not isinstance(arguments, dict):
            return None, f"arguments must be an object, got {type(arguments).__name__}"
        properties = self.parameters.get("properties", {})
        coerced = {name: _coerce(value, properties.get(name, {})) for name, value in arguments.items()}
        error = jsonschema.exceptions.best_match(
            jsonschema.validators.validator_for(self.parameters)(self.parameters).iter_errors(coerced)
        )
        if error is not None:
            where = "/".join(str(part) for part in error.absolute_path)
            return None, f"{where + ': ' if where else ''}{error.message}"
        return coerced, ""


@dataclass(frozen=True)
class ToolCall:
    """One call: the tool's name and its arguments (checked against the schema)."""

    name: str
    arguments: dict[str, Any]

    def canonical(self) -> str:
        """The call as canonical JSON (sorted keys, no spaces): equal calls, equal text."""
        return canonical_json({"name": self.name, "arguments": self.arguments})


@dataclass(frozen=True)
class ParsedCall:
    """What a reply called: ``status`` (one of :data:`PARSE_STATUSES`), the call when it is
    ``ok`` (and, for ``bad_args``, the tool named), and ``detail``, a line saying why not."""

    status: str
    call: ToolCall | None = None
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def canonical_json(value: Any) -> str:
    """``value`` as JSON with sorted keys and no spaces, non-ASCII kept."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def write_call(call: ToolCall, call_format: str = "hermes") -> str:
    """``call`` as models of ``call_format`` write it, and as their templates render it: what a
    reply choosing ``call`` from a list (constrained decoding) samples."""
    if call_format == "hermes":
        return f"<tool_call>\n{json.dumps({'name': call.name, 'arguments': call.arguments}, ensure_ascii=False)}\n</tool_call>"
    if call_format == "llama3":
        return json.dumps({"name": call.name, "parameters": call.arguments}, ensure_ascii=False)
    if call_format == "qwen_xml":
        parameters = "".join(
            f"<parameter={name}>\n{value if isinstance(value, str) else json.dumps(value)}\n</parameter>\n"
            for name, value in call.arguments.items()
        )
        return f"<tool_call>\n<function={call.name}>\n{parameters}</function>\n</tool_call>"
    raise ValueError(f"call_format must be one of {CALL_FORMATS}, got {call_format!r}")


def parse_tool_call(
    reply: str | Mapping[str, Any] | Any,
    tools: Iterable[Tool],
    call_format: str = "hermes",
    *,
    reasoning_open: bool = False,
) -> ParsedCall:
    """The single call in ``reply`` (a sampled string in ``call_format``, or an OpenAI assistant
    message), checked against ``tools``. Never raises for what a model wrote; an unknown format
    or a reply of another type raises."""
    if call_format not in CALL_FORMATS:
        raise ValueError(f"call_format must be one of {CALL_FORMATS}, got {call_format!r}")
    offered = {tool.name: tool for tool in tools}
    if isinstance(reply, str):
        reasoning, content = split_reasoning(reply, reasoning_open)
        found = _FORMATS[call_format](content)
        if found.status == "no_call" and any(marker in reasoning for marker in _MARKERS[call_format]):
            return ParsedCall("call_in_reasoning", detail="the only call is inside the reasoning")
    else:
        found = _from_message(reply)
    if found.status != "ok" or found.call is None:
        return found
    tool = offered.get(found.call.name)
    if tool is None:
        return ParsedCall(
            "unknown_tool", detail=f"no tool {found.call.name!r}; the tools are {sorted(offered)}"
        )
    arguments, why = tool.check(found.call.arguments)
    if arguments is None:
        return ParsedCall("bad_args", ToolCall(tool.name, {}), f"{tool.name}: {why}")
    return ParsedCall("ok", ToolCall(tool.name, arguments))


def split_reasoning(reply: str, reasoning_open: bool = False) -> tuple[str, str]:
    """``reply`` as (reasoning, the rest): up to the last ``</think>``; after an unclosed
    ``<think>``, or everything when the prompt opened the block and the reply never closed it."""
    closes = list(_THINK_CLOSE.finditer(reply))
    if closes:
        return reply[: closes[-1].start()], reply[closes[-1].end() :]
    if reasoning_open:
        return reply, ""
    opened = _THINK_OPEN.search(reply)
    if opened:
        return reply[opened.start() :], reply[: opened.start()]
    return "", reply


def _single_block(content: str) -> ParsedCall | str:
    """The body of the one ``<tool_call>`` block in ``content``, or the status saying why not."""
    opened = content.count("<tool_call>")
    if opened == 0:
        return ParsedCall("no_call", detail="no <tool_call>")
    if opened > 1:
        return ParsedCall("multiple_calls", detail=f"{opened} calls: one action per step")
    body, closed, _ = content.partition("<tool_call>")[2].partition("</tool_call>")
    if not closed:
        return ParsedCall("unterminated", detail="<tool_call> is never closed")
    return body


def _json_call(text: str, argument_keys: tuple[str, ...]) -> ParsedCall:
    """A call from a JSON object ``{"name": ..., <an argument key>: {...}}``; arguments that are
    a JSON string (encoded twice) are decoded."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        return ParsedCall("bad_json", detail=f"the call is not JSON: {error}")
    return _call_from_object(value, argument_keys)


def _call_from_object(value: Any, argument_keys: tuple[str, ...]) -> ParsedCall:
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return ParsedCall("bad_json", detail='a call is a JSON object with a "name"')
    arguments = next((value[key] for key in argument_keys if key in value), {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as error:
            return ParsedCall("bad_json", detail=f"the arguments are not JSON: {error}")
    return ParsedCall("ok", ToolCall(value["name"], arguments))


def _hermes(content: str) -> ParsedCall:
    body = _single_block(content)
    return body if isinstance(body, ParsedCall) else _json_call(body, ("arguments", "parameters"))


def _qwen_xml(content: str) -> ParsedCall:
    body = _single_block(content)
    if isinstance(body, ParsedCall):
        return body
    function = _QWEN_FUNCTION.fullmatch(body)
    if function is None:
        if "<function=" in body and "</function>" not in body:
            return ParsedCall("unterminated", detail="<function=...> is never closed")
        return ParsedCall("bad_json", detail="a call is <function=NAME>...</function>")
    name, inner = function.group(1).strip(), function.group(2)
    if _QWEN_PARAMETER.sub("", inner).strip():
        return ParsedCall("bad_json", detail="text in the call outside its <parameter=...> blocks")
    arguments: dict[str, Any] = {}
    for key, raw in _QWEN_PARAMETER.findall(inner):
        if key.strip() in arguments:
            return ParsedCall("bad_json", detail=f"parameter {key.strip()!r} given twice")
        arguments[key.strip()] = raw.removeprefix("\n").removesuffix("\n")
    return ParsedCall("ok", ToolCall(name, arguments))


def _llama3(content: str) -> ParsedCall:
    text = content.strip()
    for marker in _END_MARKERS:
        text = text.removesuffix(marker).rstrip()
    tagged = text.startswith(_PYTHON_TAG)
    text = text.removeprefix(_PYTHON_TAG).strip()
    if not text.startswith("{"):
        if tagged:
            return ParsedCall("bad_json", detail="<|python_tag|> without a JSON call")
        return ParsedCall("no_call", detail="no JSON call")
    try:
        value, end = json.JSONDecoder().raw_decode(text)
    except json.JSONDecodeError as error:
        if error.pos >= len(text) or error.msg.startswith("Unterminated string"):
            return ParsedCall("unterminated", detail="the JSON call is cut off")
        return ParsedCall("bad_json", detail=f"the call is not JSON: {error}")
    rest = text[end:].strip()
    if rest.startswith((";", "{")):
        return ParsedCall("multiple_calls", detail="more than one call: one action per step")
    if rest:
        return ParsedCall("bad_json", detail="text after the call")
    return _call_from_object(value, ("parameters", "arguments"))


def as_message(reply: Any) -> Mapping[str, Any]:
    """An OpenAI assistant message as a mapping (a pydantic one through ``model_dump``); any
    other reply raises."""
    message = reply.model_dump() if hasattr(reply, "model_dump") else reply
    if not isinstance(message, Mapping):
        raise TypeError(f"a reply is a str or an assistant message (a mapping), got {type(reply).__name__}")
    return message


def _from_message(reply: Any) -> ParsedCall:
    """The call of an OpenAI assistant message."""
    message = as_message(reply)
    calls = message.get("tool_calls") or []
    if not calls:
        reasoning = message.get("reasoning_content") or message.get("reasoning") or ""
        if any(marker in reasoning for markers in _MARKERS.values() for marker in markers):
            return ParsedCall("call_in_reasoning", detail="the only call is inside the reasoning")
        return ParsedCall("no_call", detail="the message has no tool_calls")
    if len(calls) > 1:
        return ParsedCall("multiple_calls", detail=f"{len(calls)} calls: one action per step")
    call = calls[0] if isinstance(calls[0], Mapping) else {}
    return _call_from_object(call.get("function", call), ("arguments",))


def _coerce(value: Any, schema: Mapping[str, Any]) -> Any:
    """``value`` as the type ``schema`` names when a model wrote it as another: text for a
    number, a boolean or a structure; a number for text. Anything else is left to validation."""
    kind = schema.get("type") if isinstance(schema, Mapping) else None
    if kind == "string" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return json.dumps(value)
    if not isinstance(value, str) or kind in (None, "string"):
        return value
    text = value.strip()
    if kind == "boolean" and text in ("True", "False"):  # Jinja's rendering of a Python bool
        return text == "True"
    try:
        decoded = json.loads(text)
    except json.JSONDecodeError:
        return value
    return decoded if kind != "number" or isinstance(decoded, (int, float)) else value


_FORMATS = {"hermes": _hermes, "qwen_xml": _qwen_xml, "llama3": _llama3}
