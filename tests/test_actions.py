"""Response parsing: the documented accept/reject cases, and robustness to any string."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hgpo_env.prompting.actions import parse_response

ACCEPTED = [
    ("<think>go</think><action>go north</action>", "go north"),
    ("<action>go north</action>", "go north"),  # thinking is optional by default
    ("<ACTION>  go \n north </Action>", "go north"),  # tags case-insensitive, whitespace collapsed
    ("I reason.</think> <action>take mug</action>", "take mug"),  # template opened <think>
    ("<think>a</think><action>look</action> trailing words", "look"),
    ("<action>click[Café crème]</action>", "click[Café crème]"),
    ("<action>put the apple 1 in/on the fridge 1</action>", "put the apple 1 in/on the fridge 1"),
]

REJECTED = [
    ("", "no <action>"),
    ("go north", "no <action>"),
    ("<action>go north", "no <action>"),
    ("</action>go north<action>", "before <action>"),
    ("<action>a</action><action>b</action>", "more than one"),
    ("<action>   </action>", "empty action"),
    ("<think>maybe <action>go north</action>", "not closed"),
    ("<action>go\x00north</action>", "control"),
    ("<action>go\u200bnorth</action>", "control"),  # zero-width space: format character
    ("<action>" + "x" * 300 + "</action>", "longer than 256"),
    ("<action>go</action>" + "y" * 20000, "response longer"),
]


@pytest.mark.parametrize("response,action", ACCEPTED)
def test_accepts(response, action):
    parsed = parse_response(response)
    assert parsed.valid and parsed.action == action and parsed.error is None


@pytest.mark.parametrize("response,reason", REJECTED)
def test_rejects_with_a_reason(response, reason):
    parsed = parse_response(response)
    assert not parsed.valid and parsed.action is None
    assert reason in parsed.error


def test_require_think():
    assert not parse_response("<action>look</action>", require_think=True).valid
    assert parse_response("<think>x</think><action>look</action>", require_think=True).valid


def test_plain_format():
    assert parse_response("  go   north ", "plain").action == "go north"
    assert parse_response("", "plain").error == "empty action"
    assert parse_response("a\x07b", "plain").error.startswith("action contains control")


def test_limits_are_configurable():
    assert parse_response("<action>abcdef</action>", max_action_chars=5).error.startswith("action longer")
    assert parse_response("<action>a</action>", max_response_chars=5).error.startswith("response longer")


def test_programming_errors_raise():
    with pytest.raises(ValueError, match="response_format"):
        parse_response("x", "json")
    with pytest.raises(TypeError, match="str"):
        parse_response(b"<action>look</action>")  # type: ignore[arg-type]


@settings(max_examples=500, deadline=None)
@given(st.text(max_size=300) | st.binary(max_size=200).map(lambda b: b.decode("latin-1")))
def test_never_raises_and_valid_actions_are_clean(text):
    for response in (text, f"<action>{text}</action>"):
        for fmt in ("think_action", "plain"):
            parsed = parse_response(response, fmt)
            assert parsed.valid == (parsed.error is None)
            if parsed.valid:
                assert parsed.action == parsed.action.strip() and parsed.action.isprintable()
