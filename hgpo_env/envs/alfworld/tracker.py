"""The household notes GraphGPO's ALFWorld shows and groups by: where the agent is, what it holds,
and which items it processed or moved.

GraphGPO's recipe (verl-agent ``recipe/GraphGPO``, ``alfworld_envs.py`` and its env manager)
appends these notes to every observation and builds its graph nodes from them, because ALFWorld's
answer to a step ("You arrive at fridge 1. ...") says nothing of what the agent carries or did
before. The rules below are the recipe's, quirks included, so the notes read the same:

* a command updates the notes only when the game's answer does not contain "Nothing happens";
* ``heat|cool|clean|slice <item> [with <tool>]`` marks the item heated, cooled, cleaned or sliced
  when the verb occurs in the answer (``toggle`` never matches the recipe's pattern);
* ``go to <place>`` moves the agent; ``take <item> from <place>`` picks up an item named in the
  answer; ``drop``, ``put|place <item> in|on <place>`` and ``move <item> to <place>`` put it down;
* an item's first pick-up records where it came from; putting it down records where it went;
  picking it up again sets "went to" back to "came from";
* the held item's status collects the flags of every processed item whose name is a substring of
  the held item's name (so ``mug 1`` counts for ``mug 10``, as in the recipe).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

NOTHING = "nothing"
START = "middle of a room"
FLAGS = {"heat": "heated", "cool": "cooled", "clean": "cleaned", "slice": "sliced"}
"""Processing verbs and the flag each sets, in the order the recipe lists flags."""

_PROCESS = re.compile(r"^(heat|cool|clean|slice)\s+([\w\s\d]+?)(?:\s+with\s+[\w\s\d]+)?$")
_GO_TO = re.compile(r"^go to\s+(.+)$")
_TAKE = re.compile(r"^take\s+(.+?)(?:\s+from\s+.+)?$")
_DROP = re.compile(r"^drop\s+(.+)$")
_PUT = re.compile(r"^(?:put|place)\s+(.+?)\s+(?:in|on)\s+.+$")
_MOVE = re.compile(r"^move\s+(.+?)(?:\s+to\s+.+)?$")


@dataclass
class HouseholdNotes:
    """What the recipe's ALFWorld worker remembers of one episode."""

    location: str = START
    holding: str = NOTHING
    flags: dict[str, set[str]] = field(default_factory=dict)
    """Processed items (first processing first) and the flags they carry."""
    moves: dict[str, list[str]] = field(default_factory=dict)
    """Picked-up items (first pick-up first) and their [came from, went to] places."""

    def update(self, command: str, answer: str) -> None:
        """Take in one command the game answered with ``answer``."""
        if "Nothing happens" in answer:
            return
        command = command.lower().strip()
        self._process(command, answer)
        if (match := _GO_TO.match(command)) is not None:
            self.location = match.group(1).strip()
        self._carry(command, answer)

    def _process(self, command: str, answer: str) -> None:
        match = _PROCESS.match(command)
        if match is not None and match.group(1) in answer:
            self.flags.setdefault(match.group(2).strip(), set()).add(FLAGS[match.group(1)])

    def _carry(self, command: str, answer: str) -> None:
        before = self.holding
        if (match := _TAKE.match(command)) is not None and match.group(1).strip() in answer:
            self.holding = match.group(1).strip()
        for pattern in (_DROP, _PUT, _MOVE):
            if (match := pattern.match(command)) is not None and match.group(1).strip() in answer:
                self.holding = NOTHING
        if before == self.holding:
            return
        item = self.holding if before == NOTHING else before
        if item not in self.moves:
            self.moves[item] = [self.location, self.location]
        elif before == item:
            self.moves[item][1] = self.location
        else:
            self.moves[item][1] = self.moves[item][0]

    def _status(self, item: str) -> str:
        names = [flag for flag in FLAGS.values() if flag in self.flags.get(item, ())]
        return f"({' '.join(names)})" if names else "(unprocessed)"

    def describe(self) -> str:
        """The notes as the recipe appends them to an observation (location, hand, moved items)."""
        held = [
            flag
            for item, item_flags in self.flags.items()
            if item in self.holding
            for flag in FLAGS.values()
            if flag in item_flags
        ]
        if held:
            hand = f"({' '.join(held)})"
        else:
            hand = "" if self.holding == NOTHING else "(unprocessed)"
        moved = ""
        for item, (came_from, went_to) in self.moves.items():
            status = self._status(item)
            if came_from != went_to or (status != "(unprocessed)" and self.holding != item):
                moved += f"{item}{status} from {came_from} move to {went_to};"
        if moved:
            moved = f"History moving list by you: {moved}"
        return f"Location: {self.location}. Items in hand (status): {self.holding}{hand}. {moved}"
