"""Fingerprints: exact format, the level-equality property, missing levels, cross-process stability."""

from __future__ import annotations

import struct
import subprocess
import sys
import unicodedata

import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from hgpo_env.contract.fingerprint import MISSING, Fingerprinter, canonical_text

# A fixed episode: (state text, parsed action taken in that state).
EPISODE = [
    ("You are in the kitchen.\n You see: red apple.", "take red apple"),
    ("You take the red apple. You are in the kitchen.", "go north"),
    ("You walk north.  You are in the hallway.", None),
    ("You walk north. You are in the hallway.", "go south"),
    ("Caf\u0065\u0301 du monde.", "look"),
]


def spec_fingerprints(family: str, mode: str, episode, t: int, k_max: int) -> tuple[int, ...]:
    """The DESIGN.md definition written out byte by byte, independently of the module."""
    seed = xxhash.xxh3_64_intdigest(f"hgpo-fingerprint|v1|{family}|{mode}".encode())

    def h(data: bytes) -> int:
        return xxhash.xxh3_64_intdigest(data, seed) or 1

    def field(text: str) -> bytes:
        import unicodedata

        data = " ".join(unicodedata.normalize("NFC", text).split()).encode()
        return struct.pack("<Q", len(data)) + data

    def record(i: int) -> int:
        state = h(field(episode[i][0]))
        if mode == "observations":
            return state
        action = episode[i][1]
        action_field = struct.pack("<Q", 2**64 - 1) if action is None else field(action)
        return h(struct.pack("<Q", state) + action_field)

    keys = [h(field(episode[t][0]))]
    for k in range(1, k_max + 1):
        if t - k < 0:
            keys.append(0)
        else:
            keys.append(h(struct.pack("<QQ", keys[-1], record(t - k))))
    return tuple(keys)


def module_fingerprints(family: str, mode: str, episode, t: int, k_max: int) -> tuple[int, ...]:
    fp = Fingerprinter(family, mode)
    records = [fp.record(fp.state(s), a) for s, a in episode[:t]]
    return fp.levels(fp.state(episode[t][0]), records[::-1][:k_max], k_max + 1)


# Computed with spec_fingerprints above and pinned, so that any change of format (or of xxhash)
# fails here and becomes a deliberate version bump.
GOLDEN_LAST_STEP = {
    "observations_actions": (
        7558638359369421866,
        17004361046104332896,
        12790817932690361356,
        18235499071021472994,
        11491164223236008687,
    ),
    "observations": (
        961524062894530486,
        12031227707941462067,
        4601519392680583804,
        1447996409674795343,
        16096149539674547860,
    ),
}


@pytest.mark.parametrize("mode", ["observations_actions", "observations"])
def test_matches_the_written_definition(mode):
    for t in range(len(EPISODE)):
        for k_max in (0, 1, 2, 4):
            assert module_fingerprints("rooms", mode, EPISODE, t, k_max) == spec_fingerprints(
                "rooms", mode, EPISODE, t, k_max
            )


@pytest.mark.parametrize("mode", ["observations_actions", "observations"])
def test_golden_values(mode):
    assert module_fingerprints("rooms", mode, EPISODE, 4, 4) == GOLDEN_LAST_STEP[mode]


def test_canonical_text():
    assert canonical_text("  a\t\n b  ") == "a b"
    assert canonical_text("Cafe\u0301") == "Caf\u00e9"  # NFC
    assert canonical_text("\u00a0x\u2003y ") == "x y"  # unicode whitespace collapses too


def test_cosmetic_whitespace_does_not_split_states():
    fp = Fingerprinter("rooms")
    assert fp.state(EPISODE[2][0]) == fp.state(EPISODE[3][0])


def test_missing_levels_are_zero_and_present_levels_never_are():
    fp = Fingerprinter("rooms")
    keys = fp.levels(fp.state("x"), [fp.record(fp.state("y"), "go")], 5)
    assert keys[2:] == (MISSING,) * 3
    assert all(k != MISSING for k in keys[:2])


def test_salt_separates_families_and_modes():
    a = Fingerprinter("rooms").state("same text")
    assert a != Fingerprinter("webshop").state("same text")
    assert a != Fingerprinter("rooms", "observations").state("same text")


def test_modes_differ_only_in_actions():
    with_actions = Fingerprinter("rooms")
    without = Fingerprinter("rooms", "observations")
    s = with_actions.state("room")
    assert with_actions.record(s, "go north") != with_actions.record(s, "go south")
    assert with_actions.record(s, None) != with_actions.record(s, "")
    assert without.record(s, "go north") == without.record(s, "go south")


def test_state_with_actions_follows_the_written_definition():
    """``text_and_actions``: the text and each sorted admissible action as fields, its own salt."""
    seed = xxhash.xxh3_64_intdigest(b"hgpo-fingerprint|v1|alfworld|observations_actions|text_and_actions")

    def field(text: str) -> bytes:
        return struct.pack("<Q", len(text)) + text.encode()

    actions = ["open fridge 1", "go to desk 1", "look"]
    expected = xxhash.xxh3_64_intdigest(
        field("You arrive at fridge 1.") + field("go to desk 1") + field("look") + field("open fridge 1"),
        seed,
    )
    fp = Fingerprinter("alfworld", state_source="text_and_actions")
    assert fp.state("You arrive at  fridge 1.", actions) == expected
    assert fp.state("You arrive at fridge 1.", actions[::-1]) == expected  # order does not matter
    assert fp.state("You arrive at fridge 1.", actions[:2]) != expected  # the set does
    plain = Fingerprinter("alfworld")
    assert plain.state("You arrive at fridge 1.", actions) == plain.state("You arrive at fridge 1.")


def test_action_key_follows_the_written_definition():
    """Lower-cased canonical command as a field, its own salt; one key for "no command"."""
    seed = xxhash.xxh3_64_intdigest(b"hgpo-action|v1|alfworld")
    command = "go to desk 1"
    expected = xxhash.xxh3_64_intdigest(struct.pack("<Q", len(command)) + command.encode(), seed)
    for mode, source in (("observations_actions", "text"), ("observations", "text_and_actions")):
        fp = Fingerprinter("alfworld", mode, source)
        assert fp.action("Go  to DESK 1 ") == fp.action("go to desk 1") == expected
        assert fp.action(None) == xxhash.xxh3_64_intdigest(struct.pack("<Q", 2**64 - 1), seed)
    fp = Fingerprinter("alfworld")
    assert len({fp.action(None), fp.action(""), fp.action("go to desk 1"), fp.action("go to desk 2")}) == 4
    assert fp.action("look") != Fingerprinter("rooms").action("look")
    assert fp.action("look") not in (fp.state("look"), fp.record(fp.state("x"), "look"))


def test_bad_arguments():
    with pytest.raises(ValueError, match="fingerprint mode"):
        Fingerprinter("rooms", "actions")
    with pytest.raises(ValueError, match="state source"):
        Fingerprinter("rooms", state_source="actions")
    with pytest.raises(ValueError, match="family"):
        Fingerprinter("")


def test_stable_across_processes():
    code = (
        "from hgpo_env.contract.fingerprint import Fingerprinter as F\n"
        "f = F('rooms')\n"
        "print(f.levels(f.state('s'), [f.record(f.state('p'), 'go')], 3))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "12345", "PATH": ""},
    )
    fp = Fingerprinter("rooms")
    assert out.stdout.strip() == str(fp.levels(fp.state("s"), [fp.record(fp.state("p"), "go")], 3))


# ---------------------------------------------------------------- the grouping property
STATES = st.sampled_from(["kitchen", "hall", "hall ", "attic"])
ACTIONS = st.sampled_from(["go north", "go south", None])
STEPS = st.lists(st.tuples(STATES, ACTIONS), min_size=1, max_size=6)


@settings(max_examples=300, deadline=None)
@given(a=STEPS, b=STEPS, k=st.integers(0, 4), mode=st.sampled_from(["observations_actions", "observations"]))
def test_level_k_equal_iff_last_k_steps_agree(a, b, k, mode):
    """Level k of the last steps of a and b agree exactly when both show k past steps and those
    steps (state, and action in the default mode) and the current states agree."""

    def key(step):
        state, action = step
        return (canonical_text(state), action if mode == "observations_actions" else None)

    level = module_fingerprints("rooms", mode, a, len(a) - 1, k)[k]
    other = module_fingerprints("rooms", mode, b, len(b) - 1, k)[k]
    shown = len(a) > k and len(b) > k
    same = (
        shown
        and canonical_text(a[-1][0]) == canonical_text(b[-1][0])
        and [key(s) for s in a[-1 - k : -1]] == [key(s) for s in b[-1 - k : -1]]
    )
    if not shown:
        assert MISSING in (level, other)
    else:
        assert (level == other) == same


@settings(max_examples=500, deadline=None)
@given(
    st.text(alphabet=st.characters(codec="utf-8"), max_size=60)
    | st.text(alphabet=" \t\n\x1cab", max_size=20)
    | st.builds(  # text as envs write it, past the 64 characters where the fast path scans otherwise
        lambda words, sep, ends: ends + sep.join(words) + ends,
        st.lists(st.text(alphabet="abcxyz.,", min_size=1, max_size=12), max_size=40),
        st.sampled_from([" ", "  ", " \n", "\t"]),
        st.sampled_from(["", " ", "  ", "\n"]),
    )
)
def test_canonical_text_fast_path_agrees_with_the_definition(text):
    assert canonical_text(text) == " ".join(unicodedata.normalize("NFC", text).split())
