"""Memory kinds (``memory=``): the window unchanged byte for byte, compaction's summary turns and
notes, the keys of what each prompt shows, and bad input in one line each."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import gymnasium as gym
import pytest

import hgpo_env  # noqa: F401  (registers the ids)
from hgpo_env.contract.fingerprint import MISSING, Fingerprinter
from hgpo_env.contract.info import RESET_KEYS, STEP_KEYS
from hgpo_env.prompting.compaction import SummaryRequest
from hgpo_env.prompting.memory import PromptTemplate

WINDOW_DIGESTS = Path(__file__).parent / "data" / "window_prompts.json"
TASK = {"task_id": 10_007}


def window_digests() -> dict[str, str]:
    """sha256 of every prompt, key and ``history_used`` of Rooms episodes under the window, per
    (seed, K, response format, fingerprint mode): expert commands with an invalid or random reply
    now and then. Kept importable without this change's API, so the code before it (commit
    a4de47e) wrote ``tests/data/window_prompts.json`` with this very function."""
    digests = {}
    for seed in range(4):
        for k in (0, 2, 4):
            for response_format in ("plain", "think_action"):
                for mode in ("observations_actions", "observations"):
                    env = gym.make(
                        "HGPO-Rooms-v0",
                        history_length=k,
                        response_format=response_format,
                        fingerprint_mode=mode,
                        max_steps=12,
                    )
                    rng = random.Random(seed)
                    prompt, info = env.reset(seed=seed)
                    digest = hashlib.sha256()
                    for _ in range(12):
                        digest.update(
                            json.dumps([prompt, list(info["fingerprints"]), info["history_used"]]).encode()
                        )
                        roll = rng.random()
                        command = (
                            env.unwrapped.expert_action()
                            if roll < 0.7
                            else rng.choice(info["admissible_actions"])
                        )
                        reply = command if response_format == "plain" else f"<action>{command}</action>"
                        if roll > 0.93:
                            reply = "I do not know"
                        prompt, _, terminated, truncated, info = env.step(reply)
                        if terminated or truncated:
                            break
                    digest.update(
                        json.dumps([prompt, list(info["fingerprints"]), info["history_used"]]).encode()
                    )
                    digests[f"{seed}|{k}|{response_format}|{mode}"] = digest.hexdigest()
    return digests


def test_the_window_is_the_code_before_memory_kinds_byte_for_byte():
    assert window_digests() == json.loads(WINDOW_DIGESTS.read_text())


def test_every_prompt_says_which_turn_it_is():
    env = gym.make("HGPO-Rooms-v0", response_format="plain")
    _, info = env.reset(options=TASK)
    assert info["turn"] == "action" and set(RESET_KEYS) <= set(info)
    *_, info = env.step("look")
    assert info["turn"] == "action" and set(STEP_KEYS) <= set(info)


def compaction(**kwargs):
    return gym.make("HGPO-Rooms-v0", response_format="plain", memory="compaction", **kwargs)


def play(env, replies, options=TASK):
    """Reset, then step: an action turn takes the expert's command, a summary turn the next of
    ``replies`` (the last again once they run out); returns every (prompt, reward, info) and stops
    at the episode's end."""
    prompt, info = env.reset(options=options)
    out, summaries = [(prompt, 0.0, info)], 0
    while True:
        if info["turn"] == "action":
            reply = env.unwrapped.expert_action()
        else:
            reply, summaries = replies[min(summaries, len(replies) - 1)], summaries + 1
        prompt, reward, terminated, truncated, info = env.step(reply)
        out.append((prompt, reward, info))
        if terminated or truncated:
            return out


def test_a_compaction_asks_for_a_summary_of_the_steps_leaving_and_shows_it_after():
    env = compaction(history_length=2, compact_every=3)
    turns = play(env, ["the key is red", "plate and book are in the kitchen"])
    kinds = [info["turn"] for _, _, info in turns]
    # steps 3 and 6 are due: every third env step the steps beyond the last two leave
    assert kinds[:9] == ["action"] * 3 + ["summary"] + ["action"] * 3 + ["summary", "action"], kinds
    request, _, info = turns[3]
    assert "[Step 1]" in request and "[Step 2]" not in request and "Steps leaving your context:" in request
    assert info["history_used"] == 1 and info["fingerprints"][1:] == (MISSING, MISSING)
    # the summary turn: no env action (the step count and observation stand still), reward 0
    after, reward, info = turns[4]
    assert reward == 0.0 and info["action_valid"] and info["parsed_action"] == "the key is red"
    assert "You have taken 3 step(s)" in after and "Summary of your first 1 step(s): the key is red" in after
    assert "[Step 1]" not in after and "[Step 2]" in after and "[Step 3]" in after
    assert after.endswith(turns[3][0].split("\n")[-1]) is False  # the action prompt, not the request again
    # the second compaction folds the first summary in: the request shows it, the prompt the new one
    second_request = turns[7][0]
    assert "Summary of your first 1 step(s): the key is red" in second_request
    assert "[Step 2]" in second_request and "[Step 4]" in second_request and "[Step 5]" not in second_request
    assert "Summary of your first 4 step(s): plate and book are in the kitchen" in turns[8][0]
    assert env.unwrapped.elapsed_steps == sum(k == "action" for k in kinds[:-1])


def test_compaction_keys_cover_the_summary_at_level_k():
    """Levels below K are the window's; level K chains every shown step and then the summary."""
    turns = play(compaction(history_length=2, compact_every=3), ["the key is red", "plate and book"])
    fp = Fingerprinter("rooms")
    # each env step: the state its action turn showed and the command it executed
    steps = [
        (fp.state(turns[i - 1][2]["state_text"]), turns[i][2]["parsed_action"])
        for i in range(1, len(turns))
        if turns[i - 1][2]["turn"] == "action"
    ]
    records = [fp.record(state, action) for state, action in steps]
    after = turns[4][2]  # after the first summary turn: steps 2 and 3 shown, and the summary
    state = fp.state(after["state_text"])
    window = fp.levels(state, [records[2], records[1]], 3)
    summary = fp.text("summary", "the key is red")
    top = fp.levels(fp.levels(window[2], [summary], 2)[1], [], 1)[0]
    assert after["fingerprints"] == (state, window[1], top) and top != window[2]
    assert fp.covering_levels(state, [records[2], records[1], summary], 3) == after["fingerprints"]
    # three steps and the summary shown (after step 4): level 2 chains all four
    later = turns[5][2]
    state = fp.state(later["state_text"])
    chain = fp.levels(state, [records[3], records[2]], 3)[2]
    for item in (records[1], summary):
        chain = fp.levels(chain, [item], 2)[1]
    assert later["fingerprints"] == (state, fp.levels(state, [records[3]], 2)[1], chain)
    # the request's level 0 hashes what it shows: the old summary and the leaving steps
    assert turns[3][2]["fingerprints"][0] == fp.text("summary-request", turns[3][2]["state_text"])


def test_equal_prompts_equal_keys_and_a_different_summary_splits_level_k_only():
    a = play(compaction(compact_every=3), ["red key", "x"])
    b = play(compaction(compact_every=3), ["red key", "x"])
    c = play(compaction(compact_every=3), ["blue key", "x"])
    assert [t[0] for t in a] == [t[0] for t in b]
    assert [t[2]["fingerprints"] for t in a] == [t[2]["fingerprints"] for t in b]
    assert a[4][0] != c[4][0]
    assert a[4][2]["fingerprints"][:2] == c[4][2]["fingerprints"][:2]
    assert a[4][2]["fingerprints"][2] != c[4][2]["fingerprints"][2]
    # the summary turn's action key is its summary's
    assert a[4][2]["action_key"] == Fingerprinter("rooms").action("red key") != c[4][2]["action_key"]


def test_a_summary_turn_offers_the_facts_it_was_shown():
    turns = play(compaction(compact_every=3), ["the first fact", "x"])
    sentences = turns[0][2]["state_text"].replace(". ", ".|").split("|")
    assert turns[3][2]["admissible_actions"] == sentences  # step 1's observation, sentence by sentence
    offered_again = turns[7][2]["admissible_actions"]
    assert offered_again[0] == "the first fact"  # the old summary comes first


@pytest.mark.parametrize(
    ("response_format", "layout"), [("plain", "{}"), ("think_action", "<summary>{}</summary>")]
)
def test_a_summary_turns_replies_are_its_facts_in_the_reply_format(response_format, layout):
    env = gym.make("HGPO-Rooms-v0", memory="compaction", compact_every=3, response_format=response_format)
    _, info = env.reset(options=TASK)
    while info["turn"] == "action":
        command = env.unwrapped.expert_action()
        *_, info = env.step(command if response_format == "plain" else f"<action>{command}</action>")
    facts = info["admissible_actions"]
    assert len(facts) > 1 and info["admissible_replies"] == [layout.format(fact) for fact in facts]
    prompt, _, _, _, after = env.step(info["admissible_replies"][-1])
    assert after["action_valid"] and after["parsed_action"] == facts[-1]
    assert f"step(s): {facts[-1]}" in prompt


def test_a_summarizer_writes_the_summary_and_the_agent_sees_no_summary_turn():
    asked = []

    def rule(request: SummaryRequest) -> str:
        asked.append(request)
        return f"{len(request.leaving)} step(s) folded"

    turns = play(compaction(compact_every=3, summarizer=rule), [])
    assert all(info["turn"] == "action" for _, _, info in turns)
    assert [len(r.leaving) for r in asked][:2] == [1, 3] and asked[0].previous is None
    assert asked[1].previous == "1 step(s) folded" and "[Step 1]" in asked[0].prompt
    assert "Summary of your first 1 step(s): 1 step(s) folded" in turns[3][0]


class WordTokenizer:
    def encode(self, text):
        return text.split()


def test_compact_at_tokens_compacts_before_a_prompt_would_pass_it():
    window = gym.make("HGPO-Rooms-v0", response_format="plain", history_length=20)
    full = play(window, [])
    budget = len(full[4][0].split()) - 1  # the prompt after step 4 would be one word too long
    turns = play(compaction(compact_at_tokens=budget, tokenizer=WordTokenizer()), ["facts"] * 10)
    kinds = [info["turn"] for _, _, info in turns]
    assert kinds.index("summary") == 4  # after step 4, before its prompt is shown
    assert len(turns[5][0].split()) <= budget < len(full[4][0].split())
    with pytest.raises(
        ValueError, match=r"compact_at_tokens=5 is below the prompt without history \(\d+ tokens\)"
    ):
        compaction(compact_at_tokens=5, tokenizer=WordTokenizer()).reset(options=TASK)


def to_first_summary_turn(env):
    """Reset ``env`` (think_action replies) and play the expert's commands up to the first summary
    turn; its prompt."""
    prompt, info = env.reset(options=TASK)
    while info["turn"] == "action":
        prompt, *_, info = env.step(f"<action>{env.unwrapped.expert_action()}</action>")
    return prompt


def test_a_think_action_summary_needs_its_tags():
    env = gym.make("HGPO-Rooms-v0", memory="compaction", compact_every=3)
    assert "inside <summary> </summary> tags" in to_first_summary_turn(env)
    prompt, reward, _, _, info = env.step("<think>hm</think> the key is red")
    assert reward == 0.0 and not info["action_valid"] and info["parsed_action"] is None
    assert info["parse_error"] == "no summary: no <summary> </summary> block"
    assert "Summary of your first 1 step(s): (empty)" in prompt
    to_first_summary_turn(env)
    prompt, *_, info = env.step("<think>keep the key</think><summary> the key   is red </summary>")
    assert info["action_valid"] and info["parsed_action"] == "the key is red" and "parse_error" not in info
    assert "Summary of your first 1 step(s): the key is red" in prompt


def test_no_summary_turn_after_the_last_step():
    turns = play(compaction(compact_every=1, history_length=1), ["s"] * 50)
    assert turns[-1][2]["turn"] == "action" and turns[-1][2]["won"]


def notes(**kwargs):
    return gym.make("HGPO-Rooms-v0", response_format="plain", memory="notes", **kwargs)


def test_notes_replace_the_history_and_stay_out_of_the_env_command():
    env = notes()
    prompt, info = env.reset(options=TASK)
    assert "Your notes: (empty)" in prompt and "<notes> </notes>" in prompt
    command = env.unwrapped.expert_action()
    prompt, _, _, _, info = env.step(f"<notes>kitchen has the plate</notes> {command}")
    assert info["action_valid"] and info["parsed_action"] == command
    assert "Your notes: kitchen has the plate" in prompt and "[Step" not in prompt
    assert info["history_used"] == 0 and "You have taken 1 step(s) so far." in prompt
    # a reply without notes empties them: the reply is the agent's whole memory
    prompt, *_, info = env.step(env.unwrapped.expert_action())
    assert "Your notes: (empty)" in prompt


def test_notes_keys_level_one_holds_the_notes():
    fp = Fingerprinter("rooms")
    a, b = notes(), notes()
    _, first = a.reset(options=TASK)
    b.reset(options=TASK)
    assert first["fingerprints"] == fp.levels(fp.state(first["state_text"]), [fp.text("notes", "")], 3)
    command = a.unwrapped.expert_action()
    *_, same = a.step(f"<notes>red key</notes>{command}")
    *_, other = b.step(f"<notes>blue key</notes>{command}")
    state = fp.state(same["state_text"])
    assert same["fingerprints"] == (state, fp.levels(state, [fp.text("notes", "red key")], 2)[1], MISSING)
    assert other["fingerprints"][0] == state and other["fingerprints"][1] != same["fingerprints"][1]


@pytest.mark.parametrize(
    ("response_format", "layout"),
    [("plain", "<notes>{}</notes> {}"), ("think_action", "<notes>{}</notes><action>{}</action>")],
)
def test_notes_prompts_offer_each_note_to_keep_with_each_command(response_format, layout):
    """For constrained decoding: the notes so far or a sentence of the observation, then a command."""
    env = gym.make("HGPO-Corridor-v0", memory="notes", response_format=response_format)
    _, info = env.reset(options={"task_id": 1})
    sign = "A sign on the wall reads: the vault opens with the blue key."
    hall = ["You are in the hall.", sign, "You see: red key, blue key.", "Exits: east."]
    commands = info["admissible_actions"]
    assert info["admissible_replies"] == [layout.format(note, c) for note in hall for c in commands]
    prompt, _, _, _, info = env.step(layout.format(sign, "take blue key"))
    assert (
        info["action_valid"] and info["parsed_action"] == "take blue key" and f"Your notes: {sign}" in prompt
    )
    prompt, _, _, _, info = env.step(layout.format(sign, "go east"))
    corridor = ["You walk east.", "You are in the corridor.", "Exits: east, west."]
    assert info["admissible_replies"] == [
        layout.format(n, c) for n in [sign, *corridor] for c in ("go east", "go west")
    ]


@pytest.mark.parametrize(("kind", "options"), [("notes", {}), ("compaction", {"compact_every": 2})])
@pytest.mark.parametrize(("k", "prompt_format"), [(1, "text"), (2, "text"), (2, "chat")])
def test_action_prompts_carry_the_prompt_the_window_would_show(kind, options, k, prompt_format):
    """``info["window_prompt"]`` is what memory="window" shows after the same commands (the
    trainer's prompt tokens saved); a summary turn has none."""
    plain = {"response_format": "plain", "history_length": k, "prompt_format": prompt_format}
    env = gym.make("HGPO-Rooms-v0", memory=kind, **plain, **options)
    window = gym.make("HGPO-Rooms-v0", **plain)
    _, info = env.reset(options=TASK)
    shown, _ = window.reset(options=TASK)
    assert info["window_prompt"] == shown
    turns = set()
    for _ in range(10):
        turns.add(info["turn"])
        if info["turn"] == "summary":
            _, _, terminated, truncated, info = env.step(info["admissible_replies"][0])
            assert info["window_prompt"] == shown  # the same observation, shown after the summary
            continue
        command = env.unwrapped.expert_action()
        _, _, terminated, truncated, info = env.step(
            f"<notes>x</notes> {command}" if kind == "notes" else command
        )
        shown, *_ = window.step(command)
        if terminated or truncated:
            break
        if info["turn"] == "summary":
            assert "window_prompt" not in info
        else:
            assert info["window_prompt"] == shown
    assert turns == ({"action", "summary"} if kind == "compaction" else {"action"})
    assert "window_prompt" not in window.reset(options=TASK)[1]


def test_think_action_notes():
    env = gym.make("HGPO-Rooms-v0", memory="notes", notes_tag="memo")
    prompt, _ = env.reset(options=TASK)
    assert "<memo> </memo>" in prompt and "<action> </action>" in prompt
    command = env.unwrapped.expert_action()
    prompt, *_, info = env.step(f"<think>go</think><memo>door east</memo><action>{command}</action>")
    assert info["action_valid"] and "Your notes: door east" in prompt


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"memory": "summary"}, "memory must be one of"),
        ({"compact_every": 3}, "compact_every is an option of memory='compaction', not of memory='window'"),
        ({"memory": "notes", "compact_every": 3}, "not of memory='notes'"),
        ({"memory": "compaction", "notes_tag": "n"}, "notes_tag is an option of memory='notes'"),
        ({"memory": "compaction"}, "needs compact_every or compact_at_tokens"),
        ({"memory": "compaction", "compact_every": 3, "history_length": 0}, "history_length >= 1"),
        ({"memory": "compaction", "compact_at_tokens": 100}, "pass the tokenizer too"),
        ({"memory": "compaction", "compact_every": 0}, "compact_every must be positive"),
        ({"memory": "notes", "history_length": 0}, "history_length >= 1"),
        ({"memory": "notes", "notes_tag": "my notes"}, "notes_tag must be a tag name"),
        ({"memory": "notes", "max_prompt_tokens": 10}, "max_prompt_tokens is an option of memory='window'"),
    ],
)
def test_bad_memory_arguments_are_one_line(kwargs, message):
    with pytest.raises(ValueError, match=message) as raised:
        gym.make("HGPO-Rooms-v0", **kwargs)
    assert "\n" not in str(raised.value)


def test_a_notes_template_must_ask_for_the_tag():
    from hgpo_env.prompting.notes import NotesMemory

    env = gym.make("HGPO-Rooms-v0").env  # the parsed env under the memory wrapper
    with pytest.raises(ValueError, match="reads the notes from <notes> tags, which the template's"):
        NotesMemory(env.env, template=PromptTemplate("intro"))


def test_a_bring_your_own_env_takes_every_kind():
    import byo_envs  # noqa: F401  (registers TestDial-v0)

    for kwargs in ({"memory": "notes"}, {"memory": "compaction", "compact_every": 2}):
        env = gym.make("TestDial-v0", response_format="plain", **kwargs)
        prompt, info = env.reset(seed=0)
        turns = [info["turn"]]
        for _ in range(5):
            reply = "<notes>going up</notes> up" if info["turn"] == "action" else "the dial was at 0"
            prompt, _, terminated, truncated, info = env.step(reply)
            turns.append(info["turn"])
            if terminated or truncated:
                break
        shown = "Your notes: going up" if kwargs["memory"] == "notes" else "Summary of your first"
        assert shown in prompt or terminated, (kwargs, prompt)
        assert ("summary" in turns) == (kwargs["memory"] == "compaction")


@pytest.mark.parametrize("prompt_format", ["text", "chat"])
def test_a_served_env_plays_summary_turns_as_gym_make_does(prompt_format):
    from serve_helpers import running_server

    from hgpo_env.serve.client import RemoteEnv

    options = {
        "memory": "compaction",
        "compact_every": 3,
        "response_format": "plain",
        "prompt_format": prompt_format,
    }
    with running_server("HGPO-Rooms-v0", *(f"{k}={v}" for k, v in options.items())) as (url, _):
        remote, local = RemoteEnv([url], **options), gym.make("HGPO-Rooms-v0", **options)
        try:
            first = remote.reset(seed=1, options=TASK)
            assert first == local.reset(seed=1, options=TASK)
            turns = [first[1]["turn"]]
            for _ in range(8):
                reply = local.unwrapped.expert_action() if turns[-1] == "action" else "the kitchen is north"
                answer = remote.step(reply)
                assert answer == local.step(reply)
                turns.append(answer[-1]["turn"])
            assert "summary" in turns
        finally:
            remote.close()


def test_the_corridor_shows_its_fact_once_and_punishes_the_wrong_key():
    for task_id, key in enumerate(("red", "blue")):
        env = gym.make("HGPO-Corridor-v0", response_format="plain")
        prompt, info = env.reset(options={"task_id": task_id})
        assert f"the vault opens with the {key} key" in prompt
        prompts, observations = [prompt], [info["state_text"]]
        while True:
            prompt, reward, terminated, truncated, info = env.step(env.unwrapped.expert_action())
            prompts.append(prompt)
            observations.append(info["state_text"])
            if terminated or truncated:
                break
        assert info["won"] and reward == 10.0 and len(prompts) == 8  # take, 5 x east, use
        # the fact is in the hall's two observations only: 5 steps before the vault, where the
        # window of K = 2 shows neither the sign nor the key taken
        assert [f"{key} key" in text for text in observations[:-1]] == [True, True] + [False] * 5
        assert "vault opens with" not in prompts[-2] and "You take" not in prompts[-2]
        env.reset(options={"task_id": task_id})
        other = "blue" if key == "red" else "red"
        for command in (f"take {other} key", *["go east"] * 5):
            env.step(command)
        *_, terminated, _, info = env.step(f"use {other} key")
        assert terminated and not info["won"] and "alarm" in info["state_text"]


@pytest.mark.parametrize("task_id", [0, 1])
def test_with_keys_in_hand_the_vault_is_the_only_choice(task_id):
    """Both keys held from the start: the hall offers only the way east, and at the vault either
    key may be used, the sign's winning; so no policy that forgets the sign beats one half."""
    env = gym.make("HGPO-Corridor-v0", response_format="plain", length=2, keys_in_hand=True)
    right, wrong = ("red", "blue") if task_id == 0 else ("blue", "red")
    for key, wins in ((right, True), (wrong, False)):
        prompt, info = env.reset(options={"task_id": task_id})
        assert info["admissible_actions"] == ["go east"] and "You see: nothing to take" in prompt
        for _ in range(3):
            *_, info = env.step("go east")
        assert info["admissible_actions"] == ["use red key", "use blue key", "go west"]
        assert "key" not in info["state_text"]  # nothing at the vault says which key is right
        _, reward, terminated, _, info = env.step(f"use {key} key")
        assert terminated and info["won"] == wins and reward == (10.0 if wins else 0.0)


def test_the_audit_finds_the_window_forgetting_and_faithful_memories_sound():
    """At K = 2 the window's keys at the vault alias (which key was taken is out of the window);
    notes and a compaction whose summary keeps the facts shown tell the histories apart."""
    from hgpo_env.tools.audit import audit_env

    def audit(**memory):
        return audit_env("HGPO-Corridor-v0", memory, episodes=48, group_size=8, history_length=2)

    window = audit()
    assert not window.levels[2].sound and "no level up to K = 2 tells them apart" in window.verdict
    assert audit(memory="notes").levels[1].sound
    compaction = audit(memory="compaction", compact_every=2)
    assert compaction.levels[2].sound and not window.summary_levels
    # an action's successor is the env's next observation, not the summary turn after it: the
    # levels that show the same steps alias as the window's do
    assert [(level.visits, level.aliased_share) for level in compaction.levels[:2]] == [
        (level.visits, level.aliased_share) for level in window.levels[:2]
    ]
    assert compaction.summary_levels[0].visits > 0  # summary turns, audited on their own keys
    assert "summary turns, on their own keys:" in compaction.format()


def test_the_memory_options_travel_as_one_checked_value():
    """``MemoryOptions`` is what the config, make_agent_env, the pool and the server pass on: taken
    out of a make call's arguments, given back as only the options set, refused when inconsistent."""
    from hgpo_env import MemoryOptions

    kwargs = {"memory": "compaction", "compact_every": 3, "max_steps": 9}
    options = MemoryOptions.pop_from(kwargs)
    assert kwargs == {"max_steps": 9}
    assert options == MemoryOptions("compaction", compact_every=3)
    assert options.as_kwargs() == {"memory": "compaction", "compact_every": 3}
    assert MemoryOptions().as_kwargs() == {}  # a window run's arguments are what old servers take
    with pytest.raises(
        ValueError, match="compact_every is an option of memory='compaction', not of memory='notes'"
    ):
        MemoryOptions("notes", compact_every=2)
    with pytest.raises(ValueError, match="needs compact_every or compact_at_tokens"):
        MemoryOptions("compaction")
    with pytest.raises(ValueError, match="memory must be one of"):
        MemoryOptions("scratchpad")
