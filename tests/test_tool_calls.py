"""Tool calls parsed from replies as each model family writes them: one status per reply, never
an exception for what a model wrote, arguments coerced to and checked by the schema."""

from __future__ import annotations

import pytest

from hgpo_env.prompting.tool_calls import (
    CALL_FORMATS,
    PARSE_STATUSES,
    Tool,
    ToolCall,
    parse_tool_call,
    split_reasoning,
    write_call,
)

ACT = Tool(
    "act",
    "Send one command to the game.",
    {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
)
SCROLL = Tool(
    "scroll",
    "Scroll the page.",
    {
        "type": "object",
        "properties": {"pages": {"type": "integer", "minimum": 1}, "down": {"type": "boolean"}},
        "required": ["pages", "down"],
        "additionalProperties": False,
    },
)
TOOLS = (ACT, SCROLL)
GO = ToolCall("act", {"command": "go north"})

# (reply, format, status, the call when ok): golden strings written from each family's
# documented format, the status being what the reply is, not what the parser printed
GOLDEN = [
    # Hermes / Qwen2.5 / Qwen3 JSON
    ('<tool_call>\n{"name": "act", "arguments": {"command": "go north"}}\n</tool_call>', "hermes", "ok", GO),
    (
        '<think>north is open</think>\n\n<tool_call>\n{"name": "act", "arguments": {"command": "go north"}}\n</tool_call>',
        "hermes",
        "ok",
        GO,
    ),
    ("I will go north.", "hermes", "no_call", None),
    (
        '<tool_call>\n{"name": "act", "arguments": {"command": "go north"</tool_call>',
        "hermes",
        "bad_json",
        None,
    ),
    ('<tool_call>\n{"name": "fly", "arguments": {}}\n</tool_call>', "hermes", "unknown_tool", None),
    (
        '<tool_call>\n{"name": "act", "arguments": {"cmd": "go north"}}\n</tool_call>',
        "hermes",
        "bad_args",
        None,
    ),
    (
        '<tool_call>{"name": "act", "arguments": {"command": "a"}}</tool_call>\n<tool_call>{"name": "act", "arguments": {"command": "b"}}</tool_call>',
        "hermes",
        "multiple_calls",
        None,
    ),
    (
        '<think>maybe <tool_call>{"name": "act", "arguments": {"command": "go north"}}</tool_call></think>\nLet me think more.',
        "hermes",
        "call_in_reasoning",
        None,
    ),
    ('<tool_call>\n{"name": "act", "arguments": {"command": "go no', "hermes", "unterminated", None),
    (
        '<tool_call>\n{"name": "act", "arguments": "{\\"command\\": \\"go north\\"}"}\n</tool_call>',
        "hermes",
        "ok",
        GO,
    ),
    (
        '<tool_call>\n{"name": "scroll", "arguments": {"pages": "2", "down": "false"}}\n</tool_call>',
        "hermes",
        "ok",
        ToolCall("scroll", {"pages": 2, "down": False}),
    ),
    (
        '<tool_call>\n{"name": "scroll", "arguments": {"pages": 0, "down": true}}\n</tool_call>',
        "hermes",
        "bad_args",
        None,
    ),
    ('<tool_call>\n["act", "go north"]\n</tool_call>', "hermes", "bad_json", None),
    # Qwen3.5 / Qwen3-Coder XML
    (
        "<tool_call>\n<function=act>\n<parameter=command>\ngo north\n</parameter>\n</function>\n</tool_call>",
        "qwen_xml",
        "ok",
        GO,
    ),
    (
        "<tool_call>\n<function=scroll>\n<parameter=pages>\n3\n</parameter>\n<parameter=down>\nFalse\n</parameter>\n</function>\n</tool_call>",
        "qwen_xml",
        "ok",
        ToolCall("scroll", {"pages": 3, "down": False}),
    ),
    (
        "<tool_call>\n<function=act>\n<parameter=command>\ngo north\n</parameter>\n",
        "qwen_xml",
        "unterminated",
        None,
    ),
    (
        "<tool_call>\n<function=act>\n<parameter=command>\ngo north\n</parameter>\n</function>",
        "qwen_xml",
        "unterminated",
        None,
    ),
    ("<tool_call>\nact: go north\n</tool_call>", "qwen_xml", "bad_json", None),
    (
        "<tool_call>\n<function=act>\nnorth\n<parameter=command>\ngo north\n</parameter>\n</function>\n</tool_call>",
        "qwen_xml",
        "bad_json",
        None,
    ),
    (
        "<tool_call>\n<function=scroll>\n<parameter=pages>\nthree\n</parameter>\n<parameter=down>\ntrue\n</parameter>\n</function>\n</tool_call>",
        "qwen_xml",
        "bad_args",
        None,
    ),
    (
        "<think>\n<tool_call>\n<function=act>\n<parameter=command>\ngo north\n</parameter>\n</function>\n</tool_call>\n</think>\n\nDone.",
        "qwen_xml",
        "call_in_reasoning",
        None,
    ),
    # Llama 3.1 JSON tool calling
    ('{"name": "act", "parameters": {"command": "go north"}}', "llama3", "ok", GO),
    ('<|python_tag|>{"name": "act", "parameters": {"command": "go north"}}<|eom_id|>', "llama3", "ok", GO),
    (
        '{"name": "act", "parameters": {"command": "a"}}; {"name": "act", "parameters": {"command": "b"}}',
        "llama3",
        "multiple_calls",
        None,
    ),
    ('{"name": "act", "parameters": {"command": "go no', "llama3", "unterminated", None),
    ("<|python_tag|>brave_search.call(query='north')", "llama3", "bad_json", None),
    ('{"name": "act", "parameters": {"command": "go north"}} and then south', "llama3", "bad_json", None),
    ("Going north.", "llama3", "no_call", None),
]


@pytest.mark.parametrize(("reply", "call_format", "status", "call"), GOLDEN)
def test_golden_replies(reply, call_format, status, call):
    parsed = parse_tool_call(reply, TOOLS, call_format)
    assert parsed.status == status, parsed
    assert parsed.status in PARSE_STATUSES and (parsed.detail == "") == parsed.ok
    if status == "ok":
        assert parsed.call == call


def test_every_status_has_a_golden_reply():
    assert {status for _, _, status, _ in GOLDEN} == set(PARSE_STATUSES)


def test_a_template_that_opened_the_reasoning():
    """Thinking templates write ``<think>`` into the prompt: the reply closes a block it never
    opened, and a reply cut inside the reasoning has no call to take."""
    call = '<tool_call>\n{"name": "act", "arguments": {"command": "go north"}}\n</tool_call>'
    assert parse_tool_call(f"north is open.\n</think>\n\n{call}", TOOLS, reasoning_open=True).call == GO
    assert parse_tool_call(f"maybe {call}", TOOLS, reasoning_open=True).status == "call_in_reasoning"
    assert parse_tool_call("still thinking", TOOLS, reasoning_open=True).status == "no_call"
    assert split_reasoning("a</think>b</think>c") == ("a</think>b", "c")
    assert split_reasoning("x<think>y") == ("<think>y", "x")


OPENAI_CALL = {
    "id": "chatcmpl-tool-1",
    "type": "function",
    "function": {"name": "act", "arguments": '{"command": "go north"}'},
}


@pytest.mark.parametrize(
    ("message", "status"),
    [
        ({"role": "assistant", "content": None, "tool_calls": [OPENAI_CALL]}, "ok"),
        (
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {**OPENAI_CALL, "function": {"name": "act", "arguments": {"command": "go north"}}}
                ],
            },
            "ok",
        ),
        ({"role": "assistant", "content": "north", "tool_calls": []}, "no_call"),
        (
            {"role": "assistant", "content": "", "reasoning_content": "<tool_call>{}</tool_call>"},
            "call_in_reasoning",
        ),
        ({"role": "assistant", "tool_calls": [OPENAI_CALL, OPENAI_CALL]}, "multiple_calls"),
        (
            {
                "role": "assistant",
                "tool_calls": [{**OPENAI_CALL, "function": {"name": "act", "arguments": "{command: north}"}}],
            },
            "bad_json",
        ),
        (
            {
                "role": "assistant",
                "tool_calls": [{**OPENAI_CALL, "function": {"name": "look", "arguments": "{}"}}],
            },
            "unknown_tool",
        ),
    ],
)
def test_openai_messages(message, status):
    """What a server with a tool parser returns is read as it is, whatever the call format."""
    parsed = parse_tool_call(message, TOOLS, "qwen_xml")
    assert parsed.status == status, parsed
    if status == "ok":
        assert parsed.call == GO


def test_a_pydantic_message_is_read_through_model_dump():
    class Message:
        def model_dump(self):
            return {"role": "assistant", "tool_calls": [OPENAI_CALL]}

    assert parse_tool_call(Message(), TOOLS).call == GO


@pytest.mark.parametrize(
    "reply",
    [
        "",
        "<tool_call>",
        "</tool_call><tool_call>",
        "<think>",
        "{",
        "<|python_tag|>",
        "\x00\ud800",
        "<function=>",
    ],
)
@pytest.mark.parametrize("call_format", ["hermes", "qwen_xml", "llama3"])
def test_nothing_a_model_writes_raises(reply, call_format):
    assert parse_tool_call(reply, TOOLS, call_format).status in PARSE_STATUSES


def test_canonical_calls_are_equal_text_for_equal_calls():
    assert (
        ToolCall("scroll", {"down": False, "pages": 2}).canonical()
        == '{"arguments":{"down":false,"pages":2},"name":"scroll"}'
    )
    assert ToolCall("act", {"command": "é"}).canonical() == ToolCall("act", {"command": "é"}).canonical()


def test_bad_input_is_one_line():
    with pytest.raises(ValueError, match="call_format must be one of"):
        parse_tool_call("", TOOLS, "mistral")
    with pytest.raises(TypeError, match="a reply is a str or an assistant message"):
        parse_tool_call(42, TOOLS)
    with pytest.raises(ValueError, match="parameters are not JSON schema"):
        Tool("act", "", {"type": "object", "properties": {"command": {"type": "text"}}})
    with pytest.raises(ValueError, match="must be an object's JSON schema"):
        Tool("act", "", {"type": "string"})
    with pytest.raises(ValueError, match="a tool name is"):
        Tool("go north", "")


@pytest.mark.parametrize("call_format", CALL_FORMATS)
@pytest.mark.parametrize(
    "call",
    [GO, ToolCall("scroll", {"pages": 2, "down": False}), ToolCall("act", {"command": 'say "hé" {x}'})],
)
def test_a_written_call_parses_back(call, call_format):
    assert parse_tool_call(write_call(call, call_format), TOOLS, call_format).call == call


def test_written_calls_are_golden():
    assert (
        write_call(GO, "hermes")
        == '<tool_call>\n{"name": "act", "arguments": {"command": "go north"}}\n</tool_call>'
    )
    assert write_call(GO, "llama3") == '{"name": "act", "parameters": {"command": "go north"}}'
    assert write_call(GO, "qwen_xml") == (
        "<tool_call>\n<function=act>\n<parameter=command>\ngo north\n</parameter>\n</function>\n</tool_call>"
    )
