"""Chat prompts (``prompt_format="chat"``) and tool calls (``response_format="tool_call"``)
through ``gymnasium.make``: well-formed turns, keys of exactly what the messages hold, the parse
status of every reply in ``info``."""

from __future__ import annotations

import itertools
import json
import random

import gymnasium as gym
import pytest

import hgpo_env  # noqa: F401  (registers the ids)
from hgpo_env.envs.webshop.env import WebShopEnv
from hgpo_env.prompting.calling import ACT_TOOLS
from hgpo_env.prompting.chat import CHAT_ANSWER_FORMATS, ChatLayout, Messages
from hgpo_env.prompting.tool_calls import ToolCall
from hgpo_env.textenv.core import TextEnv
from hgpo_env.textenv.registration import make_agent_env
from hgpo_env.tools.audit import audit_env
from hgpo_env.tools.check import check_env_health

K = 3


def hermes(command: str) -> str:
    return f'<tool_call>\n{{"name": "act", "arguments": {{"command": {json.dumps(command)}}}}}\n</tool_call>'


def call_of(command: str, call_format: str) -> str:
    """The reply that calls ``act(command)`` as models of ``call_format`` write it."""
    if call_format == "llama3":
        return json.dumps({"name": "act", "parameters": {"command": command}})
    if call_format == "qwen_xml":
        return f"<tool_call>\n<function=act>\n<parameter=command>\n{command}\n</parameter>\n</function>\n</tool_call>"
    return hermes(command)


def random_reply(rng: random.Random, info: dict, response_format: str, call_format: str = "hermes") -> str:
    """An admissible command most of the time; otherwise a reply without an action, or a
    command the env rejects without a change (its next observation is that of ``look``: two
    histories then differ by a reply alone)."""
    command = rng.choice([*info["admissible_actions"], "xyzzy"])
    if rng.random() < 0.2:
        return "I am not sure."
    if response_format == "tool_call":
        return f"<think>{rng.random()}</think>\n{call_of(command, call_format)}"
    return f"<think>{rng.random()}</think><action>{command}</action>"


def play(
    history_length: int, response_format: str, episodes: int = 8, env_id: str = "HGPO-Rooms-v0", **kwargs
):
    """(prompt, info) of every step of ``episodes`` seeded Rooms episodes, the replies drawn by a
    seeded random policy: the same for every ``history_length``. Two tasks, four policies:
    episodes meet at every level (e and e + 4 are the same) and part ways at some. A summary
    turn's reply is one of the facts it offers; under memory="notes" a reply keeps a note."""
    env = gym.make(
        env_id,
        prompt_format="chat",
        response_format=response_format,
        history_length=history_length,
        max_steps=8,
        **kwargs,
    )
    steps = []
    for episode in range(episodes):
        rng = random.Random(episode % 4)
        prompt, info = env.reset(seed=episode % 2)
        done = False
        while not done:
            steps.append((prompt, info))
            if info["turn"] == "summary":
                reply = f"<think>{rng.random()}</think>{rng.choice(info['admissible_replies'])}"
            else:
                reply = random_reply(rng, info, response_format, kwargs.get("call_format", "hermes"))
            if kwargs.get("memory") == "notes":
                reply = f"<notes>{rng.choice('ab')}</notes>{reply}"
            prompt, _, terminated, truncated, info = env.step(reply)
            done = terminated or truncated
    return steps


COMPACTION = {"memory": "compaction", "compact_every": 2}
MEMORY_KINDS = [{}, COMPACTION, {"memory": "notes"}]


@pytest.mark.parametrize("memory", MEMORY_KINDS, ids=["window", "compaction", "notes"])
@pytest.mark.parametrize("response_format", ["tool_call", "think_action"])
def test_every_prompt_is_well_formed_turns(response_format, memory):
    turns = set()
    for prompt, info in play(K, response_format, **memory):
        turns.add(info["turn"])
        assert Messages().contains(prompt)
        assert prompt[0]["role"] == "system" and "Your task is to:" in prompt[0]["content"]
        assert any(m["role"] == "user" for m in prompt)  # every window has a user query
        if info["turn"] == "summary":  # the request is the last word, the system asks for no action
            assert prompt[-1]["role"] == "user" and "summary of these steps" in prompt[-1]["content"]
            assert "Each turn" not in prompt[0]["content"]
        else:
            assert prompt[-1]["role"] in ("user", "tool") and "Admissible actions:" in prompt[-1]["content"]
        if memory.get("memory") == "notes":  # the notes in the system message, no past turn
            assert len(prompt) == 2 and "Your notes: " in prompt[0]["content"]
            assert "<notes> </notes>" in prompt[0]["content"]
        for before, message in itertools.pairwise(prompt):
            calls = before.get("tool_calls", [])
            if message["role"] == "tool":  # answers the call just before it, never an orphan
                assert [c["id"] for c in calls] == [message["tool_call_id"]]
                assert calls[0]["function"]["name"] == message["name"]
            elif calls:
                assert message["role"] == "tool", prompt
        ids = [c["id"] for m in prompt for c in m.get("tool_calls", [])]
        assert ids == sorted(ids, reverse=True) and len(set(ids)) == len(ids)
        for message in prompt:
            if message["role"] == "assistant":  # past replies show the action only
                assert "<think>" not in message["content"] and "I am not" not in message["content"]
    assert turns == ({"action", "summary"} if memory == COMPACTION else {"action"})


@pytest.mark.parametrize(
    ("env_id", "response_format"),
    [("HGPO-Rooms-v0", "tool_call"), ("HGPO-Rooms-v0", "plain")],
)
def test_level_k_keys_are_equal_exactly_when_window_k_prompts_are(env_id, response_format):
    """Level k of a K-step prompt is the key of the prompt a k-step window shows: equal keys for
    equal prompts, different keys for different ones, over replayed episodes."""
    full = play(K, response_format, env_id=env_id)
    for k in range(K + 1):
        window = play(k, response_format, env_id=env_id)
        assert len(window) == len(full)
        by_key: dict[int, str] = {}
        for (prompt, info), (_, full_info) in zip(window, full):
            key = info["fingerprints"][k] if info["history_used"] >= k else None
            if key is None:
                continue
            assert full_info["fingerprints"][k] == key  # the K-step prompt's level k
            text = json.dumps(prompt, sort_keys=True)
            assert by_key.setdefault(key, text) == text, f"level {k}: one key, two prompts"
        texts = {json.dumps(p, sort_keys=True) for (p, i) in window if i["history_used"] >= k}
        assert len(texts) == len(by_key), f"level {k}: one prompt, two keys"
        assert len(by_key) < sum(1 for _, i in window if i["history_used"] >= k)  # prompts did meet


@pytest.mark.parametrize("memory", MEMORY_KINDS[1:], ids=["compaction", "notes"])
def test_a_memory_kinds_deepest_key_is_equal_exactly_when_its_prompts_are(memory):
    """The deepest level a prompt has covers all it shows (the steps since the compaction and
    the summary line; the notes); a summary turn's level 0 is its request's messages."""

    def deepest(info: dict) -> int:
        keys = info["fingerprints"]
        return 0 if info["turn"] == "summary" else max(level for level, key in enumerate(keys) if key)

    steps = play(K, "tool_call", **memory)
    by_key: dict[tuple, str] = {}
    for prompt, info in steps:
        level = deepest(info)
        text = json.dumps(prompt, sort_keys=True)
        key = (info["turn"], level, info["fingerprints"][level])
        assert by_key.setdefault(key, text) == text, f"{key}: one key, two prompts"
    assert len({json.dumps(p, sort_keys=True) for p, _ in steps}) == len(by_key), "one prompt, two keys"
    assert len(by_key) < len(steps)  # prompts did meet
    assert {turn for turn, *_ in by_key} == ({"action", "summary"} if memory == COMPACTION else {"action"})


def test_keys_of_other_templates_or_tools_never_meet():
    def first_keys(**kwargs):
        env = gym.make("HGPO-Rooms-v0", prompt_format="chat", **kwargs)
        return env.reset(seed=0)[1]["fingerprints"]

    plain = first_keys()
    assert first_keys() == plain
    assert first_keys(chat_template="{{ messages }}")[0] != plain[0]
    assert first_keys(chat_template_kwargs={"enable_thinking": False})[0] != plain[0]
    assert first_keys(response_format="tool_call")[0] != plain[0]
    assert first_keys(reasoning_open=True)[0] != plain[0]
    text = gym.make("HGPO-Rooms-v0").reset(seed=0)[1]["fingerprints"]
    assert text[0] != plain[0]


def test_tool_call_replies_step_the_env_and_say_their_status():
    env = gym.make("HGPO-Rooms-v0", prompt_format="chat", response_format="tool_call", history_length=2)
    prompt, info = env.reset(seed=0)
    assert info["tools"] == ACT_TOOLS.schemas() and info["chat_template_kwargs"] == {}
    command = info["admissible_actions"][0]
    message = {
        "role": "assistant",
        "tool_calls": [
            {
                "id": "x",
                "type": "function",
                "function": {"name": "act", "arguments": json.dumps({"command": command})},
            }
        ],
    }
    prompt, _, _, _, info = env.step(message)  # what a server with a tool parser returns
    assert info["parse"] == "ok" and info["action_valid"] and info["parsed_action"] == command
    assert info["tool_call"] == {"name": "act", "arguments": {"command": command}}
    state = info["state_text"]
    prompt, _, _, _, info = env.step('<tool_call>{"name": "fly", "arguments": {}}</tool_call>')
    assert info["parse"] == "unknown_tool" and not info["action_valid"] and info["parsed_action"] is None
    assert info["state_text"] == state  # the env took no action
    assert prompt[-1]["role"] == "user" and prompt[-1]["content"].startswith(
        "Error: unknown_tool: no tool 'fly'"
    )
    assert prompt[-2] == {"role": "assistant", "content": "(no valid action)"}
    prompt, _, _, _, info = env.step(hermes("go nowhere"))
    assert info["parse"] == "ok" and not info["action_valid"]  # a call the env rejects
    assert prompt[-2]["tool_calls"][0]["function"]["arguments"] == {"command": "go nowhere"}


def test_a_template_that_opens_the_reasoning_block_keeps_a_call_inside_it_from_acting():
    """Qwen3-Thinking and DeepSeek-R1 prompts end in ``<think>``: the reply only closes it."""
    env = gym.make("HGPO-Rooms-v0", prompt_format="chat", response_format="tool_call", reasoning_open=True)
    _, info = env.reset(seed=0)
    call = hermes(info["admissible_actions"][0])
    *_, info = env.step(f"maybe {call}")  # still reasoning: a call drafted there is not made
    assert info["parse"] == "call_in_reasoning" and info["parsed_action"] is None
    *_, info = env.step(f"north is open.\n</think>\n\n{call}")
    assert info["parse"] == "ok" and info["parsed_action"] is not None


def test_in_tool_call_prompts_the_admissible_actions_are_the_calls_that_play_them():
    layout = ChatLayout("intro", "answer", "tool_call", tool_set=WebShopEnv.agent_tools)
    listed = layout.current("Page", ["search[<your query>]", 'click[12" frame]'])
    assert listed.splitlines()[1:] == [
        "Admissible actions:",
        '- search(query="<your query>")',
        '- click(target="12\\" frame")',
    ]
    env = gym.make("HGPO-Rooms-v0", prompt_format="chat", response_format="tool_call")
    prompt, info = env.reset(seed=0)
    shown = prompt[-1]["content"].split("Admissible actions:\n", 1)[1].splitlines()
    assert shown == [f"- act(command={json.dumps(a)})" for a in info["admissible_actions"]]
    assert "search[" not in WebShopEnv.prompt_intro  # the intro names no syntax: the format does


def test_webshop_tools_map_to_its_commands_and_back():
    tools = WebShopEnv.agent_tools
    for command in ("search[red shoes size 9]", "click[Buy Now]", "click[b0815]"):
        assert tools.command(tools.call(command)) == command
    assert tools.call("search[x]") == ToolCall("search", {"query": "x"})
    assert tools.command(ToolCall("click", {"target": "  Buy   Now "})) == "click[Buy Now]"
    with pytest.raises(ValueError, match="no tool of"):
        tools.call("go north")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"prompt_format": "messages"}, "prompt_format must be one of"),
        ({"response_format": "tool_call"}, "needs prompt_format='chat'"),
        (
            {"prompt_format": "chat", "fingerprint_mode": "observations"},
            "fingerprint_mode='observations_actions'",
        ),
        (
            {"prompt_format": "chat", "response_format": "tool_call", "call_format": "mistral"},
            "call_format must be one of",
        ),
        ({"prompt_format": "chat", "response_format": "json"}, "response_format must be one of"),
        ({"prompt_format": "chat", "history_replies": "raw"}, "history_replies must be one of"),
        ({"history_replies": "content"}, "history_replies is an option of prompt_format='chat'"),
        ({"reasoning_open": True}, "reasoning_open is an option of prompt_format='chat'"),
    ],
)
def test_bad_input_is_one_line(kwargs, message):
    with pytest.raises(ValueError, match=message) as error:
        gym.make("HGPO-Rooms-v0", **kwargs)
    assert "\n" not in str(error.value)


class WhiteRoom(TextEnv):
    """Every command leaves the room as it is, and both tasks start there: prompts differ only
    by the task, the replies and the errors shown."""

    env_family = "white-room"
    prompt_intro = "You are in a white room."
    num_tasks = 2

    def __init__(self) -> None:
        super().__init__(max_steps=10)

    def _start_task(self, task_id: int) -> str:
        self._count = 3 + task_id
        return "A white room."

    def _apply(self, command: str) -> str:
        return "A white room."

    @property
    def admissible_actions(self) -> list[str]:
        return ["wait", "sing"]

    @property
    def task(self) -> str:
        return f"count to {self._count}"

    @property
    def won(self) -> bool:
        return False


def test_prompts_apart_by_a_task_a_reply_or_an_error_have_apart_keys():
    """Each case differs from the others in one thing the observations do not show; its prompt
    differs, and so does its key at the level that shows the difference."""
    cases = [
        (0, ["wait", "wait"]),
        (1, ["wait", "wait"]),  # another task: the system text differs
        (0, ["wait", "sing"]),  # a reply differs
        (0, ["wait", '<tool_call>{"name": "fly"}</tool_call>']),  # shown as (no valid action)...
        (0, ["wait", "<tool_call>{]</tool_call>"]),  # ...as this one is, but why differs
    ]
    env = make_agent_env(WhiteRoom, prompt_format="chat", response_format="tool_call", history_length=2)
    seen = []
    for task, replies in cases:
        prompt, info = env.reset(options={"task_id": task})
        for reply in replies:
            prompt, *_, info = env.step(reply if reply.startswith("<") else hermes(reply))
        seen.append((task, json.dumps(prompt), info["fingerprints"]))
    for (task, prompt, keys), (other_task, other_prompt, other_keys) in itertools.combinations(seen, 2):
        assert prompt != other_prompt and keys[2] != other_keys[2]
        assert (keys[0] == other_keys[0]) == (task == other_task)  # level 0: the system text and the room


@pytest.mark.parametrize("memory", MEMORY_KINDS, ids=["window", "compaction", "notes"])
def test_the_health_check_and_the_audit_play_chat_envs_by_tool_calls(memory):
    chat = {"prompt_format": "chat", "response_format": "tool_call", "call_format": "qwen_xml", **memory}
    report = check_env_health("HGPO-Rooms-v0", chat, groups=2, group_size=2, max_steps=8)
    assert report.ok, report.format()
    assert report.levels[0 if memory else 1].repeated > 0  # keys meet across a group's episodes
    audit = audit_env("HGPO-Rooms-v0", chat, episodes=8, group_size=4, max_steps=8, history_length=2)
    plain = audit_env("HGPO-Rooms-v0", memory, episodes=8, group_size=4, max_steps=8, history_length=2)
    assert audit.format().count("\n") == plain.format().count("\n")  # a full report, steps valid
    assert "invalid          0.000" in audit.format()
    assert ("summary turns, on their own keys" in audit.format()) == (memory == COMPACTION)


@pytest.mark.parametrize(
    ("history_replies", "shown"),
    [
        ("action", {"role": "assistant", "content": "", "tool_calls": "go south"}),
        ("content", {"role": "assistant", "content": "South it is.", "tool_calls": "go south"}),
        ("verbatim", {"role": "assistant", "content": "<think>hm</think>South it is.\n{call}"}),
    ],
)
def test_past_replies_are_shown_as_the_env_chooses(history_replies, shown):
    env = gym.make(
        "HGPO-Rooms-v0", prompt_format="chat", response_format="tool_call", history_replies=history_replies
    )
    env.reset(seed=0)
    call = hermes("go south")
    prompt, *_, info = env.step(f"<think>hm</think>South it is.\n{call}")
    assert info["parse"] == "ok"
    reply = dict(prompt[2])
    if "tool_calls" in shown:
        assert [c["function"]["arguments"]["command"] for c in reply.pop("tool_calls")] == [
            shown["tool_calls"]
        ]
        shown = {k: v for k, v in shown.items() if k != "tool_calls"}
    assert reply == {k: v.replace("{call}", call) for k, v in shown.items()}


def test_what_a_reply_said_is_keyed_when_it_is_shown():
    def level_1(history_replies: str, words: str) -> int:
        env = gym.make(
            "HGPO-Rooms-v0",
            prompt_format="chat",
            response_format="think_action",
            history_replies=history_replies,
        )
        env.reset(seed=0)
        return env.step(f"<think>{words}</think><action>look</action>")[-1]["fingerprints"][1]

    assert level_1("action", "a") == level_1("action", "b")  # the reasoning is never shown
    assert level_1("verbatim", "a") != level_1("verbatim", "b")


def test_a_chat_summary_is_the_replys_text_and_the_system_message_shows_it():
    env = gym.make(
        "HGPO-Rooms-v0", prompt_format="chat", response_format="tool_call", history_length=1, **COMPACTION
    )
    _, info = env.reset(seed=0)
    for _ in range(2):
        prompt, *_, info = env.step(hermes(info["admissible_actions"][0]))
    assert info["turn"] == "summary"
    # the leaving step as turns, its call answered by the observation it led to, then the request
    assert [m["role"] for m in prompt] == ["system", "user", "assistant", "tool", "user"]
    assert prompt[3]["tool_call_id"] == prompt[2]["tool_calls"][0]["id"]
    assert info["tools"] and all(not r.startswith("<") for r in info["admissible_replies"])

    prompt, reward, *_, info = env.step(f"<think>hm</think>The door is   north.\n{hermes('look')}")
    assert (reward, info["action_valid"], info["parsed_action"]) == (0.0, True, "The door is north.")
    assert "Summary of your first 1 step(s): The door is north." in prompt[0]["content"]
    assert prompt[0]["content"].endswith(CHAT_ANSWER_FORMATS["tool_call"])

    for _ in range(2):
        prompt, *_, info = env.step(hermes(info["admissible_actions"][0]))
    assert info["turn"] == "summary"
    _, _, _, _, info = env.step(hermes("look"))  # a call, and no text: no summary
    assert not info["action_valid"] and info["parse_error"] == "no summary: empty reply"


def test_chat_notes_ride_in_the_reply_text_beside_the_call():
    env = gym.make("HGPO-Rooms-v0", prompt_format="chat", response_format="tool_call", memory="notes")
    _, info = env.reset(seed=0)
    assert all(r.startswith("<notes>") and "<tool_call>" in r for r in info["admissible_replies"])
    command = info["admissible_actions"][0]
    call = {"type": "function", "function": {"name": "act", "arguments": json.dumps({"command": command})}}
    message = {"role": "assistant", "content": "<notes>key in the hall</notes>", "tool_calls": [call]}
    prompt, *_, info = env.step(message)  # an assistant message, as a server's tool parser gives it
    assert (info["parse"], info["parsed_action"]) == ("ok", command)
    assert "Your notes: key in the hall" in prompt[0]["content"]
    prompt, *_, info = env.step(info["admissible_replies"][0])  # the first offered: keep the notes
    assert info["parse"] == "ok" and "Your notes: key in the hall" in prompt[0]["content"]


def test_the_summary_line_is_keyed_as_shown():
    """Where nothing changes, the prompts after two compactions differ only by how many steps
    the summary covers: so do their keys."""
    env = make_agent_env(
        WhiteRoom, prompt_format="chat", response_format="tool_call", history_length=1, **COMPACTION
    )
    env.reset(options={"task_id": 0})
    after = []
    for _ in range(4):
        _, *_, info = env.step(hermes("wait"))
        if info["turn"] == "summary":
            prompt, *_, info = env.step("Nothing changes.")
            after.append((json.dumps(prompt), info["fingerprints"]))
    (first, first_keys), (second, second_keys) = after
    assert first.replace("first 1 step", "first 3 step") == second
    assert first_keys[0] == second_keys[0] and first_keys[1] != second_keys[1]
