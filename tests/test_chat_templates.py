"""Chat prompts and tool calls against the chat templates of released models (tests/data/chat_templates,
rendered by a tokenizer built here): every prompt renders, a rendered call parses back to the
call, the next turn extends the last, and keys are equal exactly when rendered prompts are."""

from __future__ import annotations

from pathlib import Path

import pytest
from jinja2.exceptions import TemplateError
from test_chat_prompts import play
from test_tool_calls import SCROLL

from hgpo_env.prompting.calling import ACT_TOOLS
from hgpo_env.prompting.tool_calls import ToolCall, parse_tool_call, write_call
from hgpo_train.rollout.collect import opens_reasoning

TEMPLATES = Path(__file__).parent / "data" / "chat_templates"
FAMILIES = {  # template file -> the call format its models write, the settings the env pins
    "qwen2.5": ("hermes", {}),
    "qwen3": ("hermes", {"enable_thinking": False}),
    "qwen3.5": ("qwen_xml", {"enable_thinking": False}),
    "llama3.3": ("llama3", {"date_string": "07 Dec 2026"}),
}
TRL_PARSES = {"qwen2.5", "qwen3.5", "llama3.3"}
"""The templates TRL knows byte for byte and gives a transformers response parser
(``trl.chat_template_utils.add_response_schema``): a second parser, not ours, to read the calls."""
SPECIAL = [
    "<|im_start|>",
    "<|im_end|>",
    "<|begin_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
]


def tokenizer_with(template: str):
    """A word-level tokenizer that knows nothing but its special tokens, with ``template``:
    rendering is all these tests ask of it."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<|begin_of_text|>", additional_special_tokens=SPECIAL
    )
    tokenizer.chat_template = template
    return tokenizer


def render(tokenizer, messages, info, *, generation: bool = True) -> str:
    return tokenizer.apply_chat_template(
        messages,
        tools=info["tools"] or None,
        tokenize=False,
        add_generation_prompt=generation,
        **info["chat_template_kwargs"],
    )


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request):
    name = request.param
    template = (TEMPLATES / f"{name}.jinja").read_text()
    call_format, settings = FAMILIES[name]
    steps = play(
        3, "tool_call", chat_template=template, call_format=call_format, chat_template_kwargs=settings
    )
    return name, tokenizer_with(template), call_format, steps


def test_every_prompt_renders_with_its_tools_and_observation(family):
    _, tokenizer, _, steps = family
    for prompt, info in steps:
        text = render(tokenizer, prompt, info)
        assert '"name": "act"' in text and prompt[-1]["content"].splitlines()[0] in text


def test_a_rendered_call_parses_back_to_the_call_and_the_next_turn_extends_the_prompt(family):
    """What the template writes for a past call is what the parser reads and what a constrained
    reply samples: the turn the prompt opened, extended by the call, is the history's text."""
    name, tokenizer, call_format, steps = family
    if name in TRL_PARSES:
        from trl.chat_template_utils import add_response_schema

        add_response_schema(tokenizer)  # raises unless the file is the template TRL knows
    checked = 0
    for prompt, info in steps:
        for end in range(2, len(prompt)):
            if "tool_calls" not in prompt[end]:
                continue
            opened = render(tokenizer, prompt[:end], info)
            closed = render(tokenizer, prompt[: end + 1], info, generation=False)
            assert closed.startswith(opened), "the call's turn does not extend the prompt it answers"
            turn = closed[len(opened) :].removesuffix("\n")  # the reply and its end token
            reply = turn.removesuffix("<|im_end|>").removesuffix("<|eot_id|>")
            function = prompt[end]["tool_calls"][0]["function"]
            parsed = parse_tool_call(reply, [tool_of(info)], call_format)
            assert parsed.call == ToolCall(function["name"], function["arguments"]), reply
            assert reply == write_call(parsed.call, call_format)  # what a constrained reply samples
            if name in TRL_PARSES:
                message = tokenizer.parse_response(turn, prefix=opened, tools=info["tools"])
                assert [call["function"] for call in message["tool_calls"]] == [function], reply
            checked += 1
    assert checked > 20


def tool_of(info):
    assert info["tools"] == ACT_TOOLS.schemas()
    return ACT_TOOLS.tools[0]


def test_keys_are_equal_exactly_when_rendered_prompts_are(family):
    _, tokenizer, _, steps = family
    by_key: dict[int, str] = {}
    for prompt, info in steps:
        text = render(tokenizer, prompt, info)
        top = info["fingerprints"][info["history_used"]]  # the level that covers all it shows
        assert by_key.setdefault(top, text) == text
    texts = {render(tokenizer, prompt, info) for prompt, info in steps}
    assert len(texts) == len(by_key) < len(steps)


def test_keys_of_two_templates_never_meet():
    first = {}
    for name in ("qwen2.5", "qwen3"):
        template = (TEMPLATES / f"{name}.jinja").read_text()
        steps = play(2, "tool_call", episodes=2, chat_template=template)
        first[name] = {key for _, info in steps for key in info["fingerprints"] if key}
    assert not first["qwen2.5"] & first["qwen3"]


def test_the_template_files_are_whole():
    for name in FAMILIES:
        text = (TEMPLATES / f"{name}.jinja").read_text()
        assert "\r" not in text and text.count("{%-") > 20, name


def test_a_template_whose_generation_prompt_opens_the_reasoning_block_is_recognised():
    """The trainer tells the env (``reasoning_open``) when replies close a block the prompt opened."""
    qwen3 = tokenizer_with((TEMPLATES / "qwen3.jinja").read_text())
    assert not opens_reasoning(qwen3, {"enable_thinking": True})  # the reply opens its own
    assert not opens_reasoning(qwen3, {"enable_thinking": False})  # an empty block, closed
    thinking = (
        (TEMPLATES / "qwen2.5.jinja")
        .read_text()
        .replace("{{- '<|im_start|>assistant\\n' }}", "{{- '<|im_start|>assistant\\n<think>\\n' }}")
    )
    assert thinking != (TEMPLATES / "qwen2.5.jinja").read_text()
    assert opens_reasoning(tokenizer_with(thinking), {})


def test_qwen35_refuses_a_window_without_a_user_query_and_renders_every_window_of_ours():
    """Qwen3.5's template raises "No user query found" for a window of calls and tool answers
    alone; every chat prompt opens with the task as a user message, so every window renders."""
    tokenizer = tokenizer_with((TEMPLATES / "qwen3.5.jinja").read_text())
    for prompt, info in play(1, "tool_call", episodes=2, call_format="qwen_xml"):
        assert any(message["role"] == "user" for message in prompt)
        render(tokenizer, prompt, info)
        bare = [prompt[0], *(message for message in prompt if message["role"] != "user")]
        if len(bare) > 1:
            with pytest.raises(TemplateError, match="No user query found"):
                render(tokenizer, bare, info)


def test_qwen35_renders_false_as_jinja_does_and_it_parses_back_to_false():
    """Qwen3.5 writes a non-string argument with Jinja's ``string`` filter: ``false`` is rendered
    ``False``, and the parser reads it back as the schema's boolean."""
    tokenizer = tokenizer_with((TEMPLATES / "qwen3.5.jinja").read_text())
    call = {"type": "function", "function": {"name": "scroll", "arguments": {"pages": 2, "down": False}}}
    messages = [
        {"role": "user", "content": "scroll"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
    ]
    opened = tokenizer.apply_chat_template(messages[:1], tokenize=False, add_generation_prompt=True)
    rendered = tokenizer.apply_chat_template(messages, tokenize=False)
    assert "<parameter=down>\nFalse\n</parameter>" in rendered
    reply = rendered.removeprefix(opened.removesuffix("<think>\n")).removesuffix("<|im_end|>\n")
    parsed = parse_tool_call(reply, [SCROLL], "qwen_xml")
    assert parsed.status == "ok" and parsed.call == ToolCall("scroll", {"pages": 2, "down": False}), reply


def test_qwen35_opens_the_reasoning_block_unless_thinking_is_off():
    """Unlike Qwen3, Qwen3.5's generation prompt opens ``<think>`` itself: a reply cut before it
    closes that block is all reasoning, and its calls are not actions (``reasoning_open``)."""
    tokenizer = tokenizer_with((TEMPLATES / "qwen3.5.jinja").read_text())
    assert opens_reasoning(tokenizer, {})
    assert not opens_reasoning(tokenizer, {"enable_thinking": False})
    musing = "I could try " + write_call(ToolCall("act", {"command": "look"}), "qwen_xml")
    assert (
        parse_tool_call(musing, ACT_TOOLS.tools, "qwen_xml", reasoning_open=True).status
        == "call_in_reasoning"
    )
    assert parse_tool_call(musing, ACT_TOOLS.tools, "qwen_xml").status == "ok"
