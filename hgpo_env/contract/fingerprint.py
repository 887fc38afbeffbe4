"""Context fingerprints: one 64-bit key per level of context a prompt shares with another.

Definition (format version 1):

* Canonical text: Unicode NFC, every run of whitespace collapsed to one space, stripped.
* Every hash is xxh3-64 seeded with ``xxh3_64("hgpo-fingerprint|v1|<family>|<mode>")``, so keys
  of different environment families, modes or format versions never meet.
* A text field is its UTF-8 bytes prefixed by their length (8 bytes, little endian); a missing
  action (an unparseable response) is the prefix ``2**64 - 1`` with no bytes.
* ``state = H(field(state_text))`` for each step (with state source ``text_and_actions``,
  ``H(field(state_text) + field(a_1) + ... + field(a_n))`` over the sorted admissible actions, and
  the salt ends in ``|text_and_actions``); ``record = H(u64(state) + field(action))`` in
  mode ``observations_actions`` (what the prompt shows) and ``record = state`` in mode
  ``observations`` (the grouping of the released HGPO code).
* Level 0 of step t is ``state_t``; level k is ``H(u64(level_{k-1}) + u64(record_{t-k}))``.
* A digest that comes out 0 is replaced by 1: 0 is reserved for "level not shown".
* Memory beyond the window (:mod:`hgpo_env.prompting.kinds`): a summary or notes text the prompt
  shows is an item ``H(b"<kind>|" + field(text))`` after the shown steps, oldest last; when a
  prompt shows more items than K, level K chains all of them (it covers everything shown).
* The action key of a step is ``H(field(lower(action)))`` seeded with
  ``xxh3_64("hgpo-action|v1|<family>")`` (whatever the mode and state source), or ``H`` of the
  missing-action prefix when the response held no action: one key for every unparseable
  response, apart from every command.

So two steps share level k exactly when their current states and their k previous steps agree
(up to 64-bit collisions), each step's text is hashed once, and a step costs O(K) hash calls.
"""

from __future__ import annotations

import re
import struct
import unicodedata
from collections.abc import Sequence

import xxhash

FORMAT_VERSION = 1
FINGERPRINT_MODES = ("observations_actions", "observations")
STATE_SOURCES = ("text", "text_and_actions")
"""What a state key hashes: its ``state_text``, or that and its sorted admissible actions (the
graph nodes of GraphGPO's ALFWorld recipe, where the same answer text can hide different
states)."""
MISSING = 0

_U64 = struct.Struct("<Q")
_U64_PAIR = struct.Struct("<QQ")
_NO_ACTION = _U64.pack(2**64 - 1)
_DOUBLE_BLANK = re.compile("  ")


def _has_ascii_space_but_blank(text: str) -> bool:
    """Whether ``text`` holds ASCII whitespace that ``str.split`` splits on, other than " ": one
    memchr scan per character, spelt out (2x faster than a loop over them on 1 KB)."""
    return (
        "\n" in text
        or "\t" in text
        or "\r" in text
        or "\x0b" in text
        or "\x0c" in text
        or "\x1c" in text
        or "\x1d" in text
        or "\x1e" in text
        or "\x1f" in text
    )


def canonical_text(text: str) -> str:
    """NFC-normalise and collapse whitespace, so cosmetic differences do not split groups."""
    if not isinstance(text, str):
        raise TypeError(f"canonical_text takes a str, got {type(text).__name__}")
    if text.isascii():
        # no whitespace but single blanks: printable ASCII has none (a fast scan of short text);
        # on long text nine memchr scans are faster, and re finds "  " faster than str does in
        # text full of single blanks
        if len(text) <= 64:
            clean = text.isprintable() and "  " not in text
        else:
            clean = not _has_ascii_space_but_blank(text) and not _DOUBLE_BLANK.search(text)
        if clean:  # canonical but for blanks at its ends: the common case, far cheaper than split
            return text.strip(" ")
    else:
        text = unicodedata.normalize("NFC", text)
    return " ".join(text.split())


def _field(text: str) -> bytes:
    data = canonical_text(text).encode("utf-8", "surrogatepass")
    return _U64.pack(len(data)) + data


class Fingerprinter:
    """Hashes states and step records for one environment family and mode."""

    __slots__ = ("_action_seed", "_with_actions", "family", "mode", "seed", "state_source")

    def __init__(self, family: str, mode: str = "observations_actions", state_source: str = "text") -> None:
        if mode not in FINGERPRINT_MODES:
            raise ValueError(f"fingerprint mode must be one of {FINGERPRINT_MODES}, got {mode!r}")
        if state_source not in STATE_SOURCES:
            raise ValueError(f"fingerprint state source must be one of {STATE_SOURCES}, got {state_source!r}")
        if not family:
            raise ValueError("an environment family name is required to salt fingerprints")
        self.family = family
        self.mode = mode
        self.state_source = state_source
        salt = f"hgpo-fingerprint|v{FORMAT_VERSION}|{family}|{mode}"
        if state_source != "text":
            salt += f"|{state_source}"
        self.seed = xxhash.xxh3_64_intdigest(salt.encode())
        self._action_seed = xxhash.xxh3_64_intdigest(f"hgpo-action|v{FORMAT_VERSION}|{family}".encode())
        self._with_actions = mode == "observations_actions"

    def _hash(self, data: bytes) -> int:
        return xxhash.xxh3_64_intdigest(data, self.seed) or 1

    def state(self, state_text: str, admissible_actions: Sequence[str] = ()) -> int:
        """Level-0 key of a state: the hash of its canonical text (and, with state source
        ``text_and_actions``, of its sorted admissible actions)."""
        data = _field(state_text)
        if self.state_source == "text_and_actions":
            data += b"".join(_field(action) for action in sorted(admissible_actions))
        return self._hash(data)

    def record(self, state: int, action: str | None) -> int:
        """Key of a finished step (its state and, in the default mode, its parsed action)."""
        if not self._with_actions:
            return state
        action_field = _NO_ACTION if action is None else _field(action)
        return self._hash(_U64.pack(state) + action_field)

    def action(self, action: str | None) -> int:
        """Key of the command a step executed, case and spacing aside (None: no command parsed)."""
        data = _NO_ACTION if action is None else _field(action.lower())
        return xxhash.xxh3_64_intdigest(data, self._action_seed) or 1

    def levels(self, state: int, past_records: Sequence[int], num_levels: int) -> tuple[int, ...]:
        """Keys of levels 0..num_levels-1 for the current state.

        ``past_records`` holds the records of the steps the prompt shows, most recent first;
        levels beyond them are :data:`MISSING`.
        """
        if len(past_records) >= num_levels:
            past_records = past_records[: num_levels - 1]
        keys, key, seed = [state], state, self.seed
        for record in past_records:  # self._hash, inlined: this runs K times a step
            key = xxhash.xxh3_64_intdigest(_U64_PAIR.pack(key, record), seed) or 1
            keys.append(key)
        keys.extend([MISSING] * (num_levels - len(keys)))
        return tuple(keys)

    def covering_levels(self, state: int, shown: Sequence[int], num_levels: int) -> tuple[int, ...]:
        """Keys of levels 0..num_levels-1 of a prompt that may show more items than levels
        (``shown``: step records and memory texts, most recent first): as :meth:`levels`, but the
        top level chains every item, so it covers all the prompt shows."""
        keys = self.levels(state, shown, num_levels)
        if num_levels < 2 or len(shown) < num_levels:
            return keys
        top = keys[-1]
        for record in shown[num_levels - 1 :]:
            top = self._hash(_U64_PAIR.pack(top, record))
        return (*keys[:-1], top)

    def text(self, kind: str, text: str) -> int:
        """Key of a memory text the prompt shows (``kind``: ``summary``, ``notes``, a request)."""
        return self._hash(kind.encode() + b"|" + _field(text))

    def fields(self, *texts: str) -> int:
        """Key of a sequence of text fields, each length-prefixed: what chat prompts hash
        (:mod:`hgpo_env.prompting.chat`)."""
        return self._hash(b"".join(_field(text) for text in texts))

    def initial(self, task: str, state_text: str) -> int:
        """Key of a task's start: task text and initial state, to verify a task group."""
        return self._hash(b"task" + _field(task) + _field(state_text))


def task_key(family: str, identity: str | bytes) -> int:
    """Stable 64-bit identity of a task: ``identity`` (text or bytes naming the task and its hidden
    initial configuration) hashed with xxh3-64 seeded by ``xxh3_64("hgpo-task|v1|<family>")``;
    0 is replaced by 1. Equal across processes and machines for equal identities."""
    data = identity.encode("utf-8", "surrogatepass") if isinstance(identity, str) else bytes(identity)
    seed = xxhash.xxh3_64_intdigest(f"hgpo-task|v{FORMAT_VERSION}|{family}".encode())
    return xxhash.xxh3_64_intdigest(data, seed) or 1
