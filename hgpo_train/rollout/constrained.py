"""Choice-constrained decoding (``generation.constrained``): a response that must be one command.

A constrained response is one of the prompt's replies (:func:`reply_choices`) followed by the
end-of-turn token: the replies are tokenised and put in a token prefix tree (:class:`ChoiceTrie`);
at each position only the tokens that keep the response on some choice may be sampled. A reply
is an admissible command: in the ``plain`` response format the bare command, in ``think_action``
``<action>command</action>`` (no reasoning: reasoning cannot be constrained to a finite set).
Memory turns offer whole replies of their own: a summary turn the facts it showed, a notes
prompt each note it may keep with each command (:mod:`hgpo_env.prompting.notes`).

A reply whose free-text argument is a ``<placeholder>`` is a template with a slot
(:data:`SLOT_KINDS`): WebShop's ``search[<your query>]`` as a command, or its ``search`` call
with ``"<your query>"`` as a JSON string (``hermes``, ``llama3``) or as an XML parameter's text
(``qwen_xml``). The response is the reply's text up to the slot (token by token, as the tree),
then free text of at least one character, then the slot's closing character (``]``, ``"`` or a
newline), the rest of the reply and the end token. The text never holds the closing character,
a newline or ``]`` (the env's command would end there), nor what its kind could not hold
unescaped (a backslash or a control character in JSON, ``<`` in XML). Which vocabulary tokens
may write that text, and which close it (text then the closing character, or that character
alone), is worked out once per tokenizer and kind (:class:`SlotVocabulary`); the text is only
bounded by ``generation.max_new_tokens``, where the response is cut (and the env rejects it).

The trained policy is the constrained distribution: the update renormalises log-probabilities
over the same allowed tokens (:func:`allowed_tokens` recomputes the sampler's sets, slot
positions as vocabulary masks). vLLM gets the same language as a structured-output ``choice``
list, or as a ``regex`` when a command has a slot.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
from transformers import LogitsProcessor

from hgpo_env.prompting.memory import action_reply

_CLASS_ESCAPES = {chr(c): f"\\x{c:02x}" for c in range(32)} | {
    "\n": r"\n",
    "]": r"\]",
    "\\": r"\\",
    "^": r"\^",
    "-": r"\-",
}
"""How a character is written inside a regex's character class (every dialect reads these)."""


@dataclass(frozen=True)
class SlotKind:
    """Where a free-text slot may sit: after ``opening`` (a regex), a ``<placeholder>``, then
    ``closing`` (the one character that ends the text); ``excluded`` are the characters its text
    never holds, ``closing`` among them."""

    opening: str
    closing: str
    excluded: str

    @property
    def text_regex(self) -> str:
        """The text the slot stands for, as a regular expression."""
        return "[^" + "".join(_CLASS_ESCAPES.get(c, c) for c in self.excluded) + "]+"

    def holds(self, text: str) -> bool:
        return bool(text) and not any(c in text for c in self.excluded)


COMMAND_SLOT = SlotKind(r"\[", "]", "]\n")
"""A command's whole bracketed argument: ``search[<your query>]``."""
SLOT_KINDS = (
    COMMAND_SLOT,
    SlotKind(r'"', '"', ']"\\' + "".join(map(chr, range(32)))),  # a JSON string: nothing to escape
    SlotKind(r"<parameter=[^<>\n]+>\n", "\n", "]\n<"),  # a qwen_xml parameter's text
)
_PLACEHOLDER = r"<[^<>\[\]\n]+>"
SLOT = re.compile(
    "|".join(f"{kind.opening}({_PLACEHOLDER})(?={re.escape(kind.closing)})" for kind in SLOT_KINDS)
)
"""A free-text slot: a ``<placeholder>`` in one of the :data:`SLOT_KINDS`' places (the group of
its kind)."""


class SlotSplit(NamedTuple):
    """A reply around its slot: ``prefix`` up to the placeholder, ``suffix`` from the closing
    character on."""

    prefix: str
    suffix: str
    kind: SlotKind


def split_slot(text: str) -> SlotSplit | None:
    """``text`` around its slot; None when ``text`` has no slot."""
    slots = list(SLOT.finditer(text))
    if not slots:
        return None
    if len(slots) > 1:
        raise ValueError(f"a choice may have at most one free-text slot <...>, got {text!r}")
    slot, group = slots[0], slots[0].lastindex
    return SlotSplit(text[: slot.start(group)], text[slot.end(group) :], SLOT_KINDS[group - 1])


@dataclass(frozen=True, eq=False)
class SlotVocabulary:
    """Bool masks over token ids of the tokens that may write a slot's text.

    A slot holds at least one character, so its first token is ``opening``: text without ``]``
    or a newline, possibly followed by the closing ``]``. Later tokens are ``continuing``: those
    and a bare ``]``. ``closing`` marks the tokens (of either) that end the slot.
    """

    opening: torch.Tensor
    continuing: torch.Tensor
    closing: torch.Tensor


def classify_slot_tokens(
    texts: Sequence[str], special_ids: Collection[int], kind: SlotKind = COMMAND_SLOT
) -> SlotVocabulary:
    """The masks of a ``kind`` slot over a vocabulary whose token ``i`` decodes to ``texts[i]``
    on its own.

    Special tokens never write text: they end turns or carry markup the env never sees.
    """
    special = set(special_ids)
    inside = torch.zeros(len(texts), dtype=torch.bool)
    closes_text = torch.zeros(len(texts), dtype=torch.bool)
    closes_bare = torch.zeros(len(texts), dtype=torch.bool)
    for i, text in enumerate(texts):
        if i in special:
            continue
        if text == kind.closing:
            closes_bare[i] = True
        elif text.endswith(kind.closing):
            closes_text[i] = kind.holds(text[:-1])
        else:
            inside[i] = kind.holds(text)
    if not (inside | closes_text).any() or not (closes_text | closes_bare).any():
        raise ValueError(
            f"the vocabulary cannot write a free-text slot: it needs text tokens and a {kind.closing!r}"
        )
    opening = inside | closes_text
    return SlotVocabulary(opening, opening | closes_bare, closes_text | closes_bare)


def slot_vocabulary(tokenizer: Any, kind: SlotKind = COMMAND_SLOT) -> SlotVocabulary:
    """The ``kind`` slot's masks over ``tokenizer``'s vocabulary, each token decoded on its own."""
    texts = tokenizer.batch_decode(
        [[i] for i in range(len(tokenizer))], skip_special_tokens=False, clean_up_tokenization_spaces=False
    )
    special = set(tokenizer.all_special_ids)
    special.update(i for i, token in tokenizer.added_tokens_decoder.items() if token.special)
    return classify_slot_tokens(texts, special, kind)


@dataclass(frozen=True)
class SlotChoice:
    """A choice with a free-text slot: ``prefix`` tokens (up to ``[``), slot text whose last token
    closes it with ``]`` (tokens of ``vocabulary``), then ``suffix`` tokens (after the ``]``)."""

    prefix: tuple[int, ...]
    suffix: tuple[int, ...]
    vocabulary: SlotVocabulary = field(compare=False, repr=False)


Choice = tuple[int, ...] | SlotChoice
Choices = tuple[Choice, ...]
"""What a constrained response must be one of: token sequences (each without the end token) and
slot choices."""


@dataclass(frozen=True, eq=False)
class AllowedSet:
    """The tokens allowed at one position: ``ids`` and every token set in one of ``masks``.

    Slot positions allow most of the vocabulary; a mask keeps them cheap to store and to write.
    """

    ids: tuple[int, ...]
    masks: tuple[torch.Tensor, ...] = ()

    def __contains__(self, token: int) -> bool:
        return token in self.ids or any(token < len(mask) and bool(mask[token]) for mask in self.masks)

    def mark(self, row: torch.Tensor) -> None:
        """Set the allowed tokens of ``row`` (a bool row over the model's vocabulary) to True.

        Token ids the model does not have (a tokenizer larger than the model) are left out.
        """
        row[list(self.ids)] = True
        for mask in self.masks:
            n = min(len(mask), len(row))
            row[:n] |= mask[:n]


@dataclass(eq=False)
class _Node:
    """A node of the token tree: the next tokens, and the slots that open here."""

    children: dict[int, _Node] = field(default_factory=dict)
    slots: list[_Slot] = field(default_factory=list)


@dataclass(eq=False)
class _Slot:
    """A slot that opens at a tree node."""

    vocabulary: SlotVocabulary
    after: _Node
    """Where the closing token leads: the choice's suffix tokens, then the end token."""


@dataclass(frozen=True)
class _InSlot:
    """A position inside a slot."""

    slot: _Slot
    filled: bool
    """The slot already has text, so a bare ``]`` may close it."""

    @property
    def mask(self) -> torch.Tensor:
        vocabulary = self.slot.vocabulary
        return vocabulary.continuing if self.filled else vocabulary.opening


State = frozenset[_Node | _InSlot]
"""Where a response prefix may be: tree nodes and slot positions (one choice may share its first
tokens with another's slot text, so there can be several)."""


class ChoiceTrie:
    """Token prefix tree of the allowed responses, each terminated by ``end_id``; a slot choice's
    path ends in a slot, whose closing token leads to the rest of the choice.

    ``max_length`` is the longest allowed response (end token included), None when a slot leaves
    it open.
    """

    def __init__(self, choices: Choices, end_id: int) -> None:
        if not choices:
            raise ValueError("constrained decoding needs at least one admissible choice")
        self.end_id = end_id
        self.root = _Node()
        for choice in choices:
            if isinstance(choice, SlotChoice):
                after = _Node()
                self._insert(after, (*choice.suffix, end_id))
                self._insert(self.root, choice.prefix).slots.append(_Slot(choice.vocabulary, after))
            else:
                self._insert(self.root, (*choice, end_id))
        fixed = not any(isinstance(choice, SlotChoice) for choice in choices)
        self.max_length = 1 + max(len(choice) for choice in choices) if fixed else None

    @staticmethod
    def _insert(node: _Node, tokens: Sequence[int]) -> _Node:
        for token in tokens:
            node = node.children.setdefault(token, _Node())
        return node

    @staticmethod
    def _enter(node: _Node) -> list[_Node | _InSlot]:
        return [node, *(_InSlot(slot, filled=False) for slot in node.slots)]

    def start(self) -> State:
        """The state before the first response token."""
        return frozenset(self._enter(self.root))

    def advance(self, state: State, token: int) -> State:
        """The state after ``token``; empty once the response has left every choice."""
        out: set[_Node | _InSlot] = set()
        for place in state:
            if isinstance(place, _Node):
                child = place.children.get(token)
                if child is not None:
                    out.update(self._enter(child))
            elif token < len(place.mask) and place.mask[token]:
                closes = bool(place.slot.vocabulary.closing[token])
                out.update(self._enter(place.slot.after) if closes else [_InSlot(place.slot, filled=True)])
        return frozenset(out)

    def allowed(self, state: State) -> AllowedSet:
        """Tokens that may follow in ``state``; after a complete choice (or off the tree) only the end."""
        ids = sorted({token for place in state if isinstance(place, _Node) for token in place.children})
        masks = {id(place.mask): place.mask for place in state if isinstance(place, _InSlot)}
        if not ids and not masks:
            return AllowedSet((self.end_id,))
        return AllowedSet(tuple(ids), tuple(masks.values()))

    def allowed_per_position(self, response: Sequence[int]) -> list[AllowedSet]:
        """Allowed tokens at every position of ``response``; raises if it is not one of the choices."""
        out, state = [], self.start()
        for position, token in enumerate(response):
            allowed = self.allowed(state)
            if token not in allowed:
                raise ValueError(
                    f"the response is not one of the allowed choices: token {token} at position "
                    f"{position} was not allowed there"
                )
            out.append(allowed)
            state = self.advance(state, token)
        return out


def allowed_tokens(choices: Choices, response: Sequence[int], end_id: int) -> list[AllowedSet]:
    """Allowed tokens at each position of a constrained ``response`` (for the update's masks)."""
    return ChoiceTrie(choices, end_id).allowed_per_position(response)


class ChoiceLogitsProcessor(LogitsProcessor):
    """Masks, row by row, every token the row's :class:`ChoiceTrie` does not allow next.

    Each row's state advances by the tokens generated since the last call.
    """

    def __init__(self, tries: Sequence[ChoiceTrie | None], prompt_length: int) -> None:
        self.tries = tries
        self.states = [trie.start() if trie is not None else None for trie in tries]
        self.seen = prompt_length
        """Columns of ``input_ids`` the states have taken in."""

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        new = input_ids[:, self.seen :].tolist()
        self.seen = input_ids.shape[1]
        allowed = torch.ones(scores.shape, dtype=torch.bool)
        for row, trie in enumerate(self.tries):
            if trie is None:
                continue
            for token in new[row]:
                self.states[row] = trie.advance(self.states[row], token)
            allowed[row] = False
            trie.allowed(self.states[row]).mark(allowed[row])
        return scores.masked_fill(~allowed.to(scores.device), float("-inf"))


def reply_choices(info: Mapping[str, Any], response_format: str) -> list[str]:
    """The replies a constrained response to this prompt must be one of: those the env offers
    whole (``info["admissible_replies"]``: a summary turn's facts, notes with a command, calls),
    else each admissible command as ``response_format`` gives it."""
    if "admissible_replies" in info:
        return list(info["admissible_replies"])
    return [action_reply(command, response_format) for command in info["admissible_actions"]]


def _regex_escape(text: str) -> str:
    """``text`` as a regex literal, escaping only what every regex dialect treats as special."""
    return re.sub(r"[\\.^$*+?()\[\]{}|]", r"\\\g<0>", text)


def _choice_regex(text: str) -> str:
    parts = split_slot(text)
    if parts is None:
        return _regex_escape(text)
    return _regex_escape(parts.prefix) + parts.kind.text_regex + _regex_escape(parts.suffix)


def choices_regex(texts: Sequence[str]) -> str:
    """A regular expression that matches exactly the response ``texts`` stand for, slots included."""
    return "|".join(_choice_regex(text) for text in texts)


def on_trie(choices: Choices, response: Sequence[int], end_id: int) -> bool:
    try:
        allowed_tokens(choices, response, end_id)
    except ValueError:
        return False
    return True


CHOICES_KEY, END_KEY = "hgpo_choices", "hgpo_end_id"
"""Keys of a vLLM request's ``extra_args`` that the choice-trie processor reads (:mod:`hgpo_train.rollout.vllm_choices`)."""


def choice_args(choices: Choices, end_id: int) -> dict[str, Any] | None:
    """``extra_args`` that constrain a vLLM request to ``choices``; None when one has a slot."""
    if any(isinstance(choice, SlotChoice) for choice in choices):
        return None
    return {CHOICES_KEY: [list(choice) for choice in choices], END_KEY: end_id}
