"""Chat prompts and tool calls against the chat templates of released models (tests/data/chat_templates,
rendered by a tokenizer built here): every prompt renders, a rendered call parses back to the
call, the next turn extends the last, and keys are equal exactly when rendered prompts are."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_chat_prompts import play

from hgpo_env.prompting.tool_calls import ToolCall, parse_tool_call, write_call
from hgpo_train.rollout.collect import opens_reasoning

TEMPLATES = Path(__file__).parent / "data" / "chat_templates"
FAMILIES = {  # template file -> the call format its models write, the settings the env pins
    "qwen2.5": ("hermes", {}),
    "qwen3": ("hermes", {"enable_thinking": False}),
    "llama3.3": ("llama3", {"date_string": "07 Dec 2026"}),
}
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
    _, tokenizer, call_format, steps = family
    checked = 0
    for prompt, info in steps:
        for end in range(2, len(prompt)):
            if "tool_calls" not in prompt[end]:
                continue
            opened = render(tokenizer, prompt[:end], info)
            closed = render(tokenizer, prompt[: end + 1], info, generation=False)
            assert closed.startswith(opened), "the call's turn does not extend the prompt it answers"
            reply = closed[len(opened) :].removesuffix("\n")
            for end_token in ("<|im_end|>", "<|eot_id|>"):
                reply = reply.removesuffix(end_token)
            function = prompt[end]["tool_calls"][0]["function"]
            parsed = parse_tool_call(reply, [tool_of(info)], call_format)
            assert parsed.call == ToolCall(function["name"], function["arguments"]), reply
            assert reply == write_call(parsed.call, call_format)  # what a constrained reply samples
            checked += 1
    assert checked > 20


def tool_of(info):
    from hgpo_env.prompting.calling import ACT_TOOLS

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
