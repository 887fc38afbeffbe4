"""ALFWorld's milestones and progress signature, as ``shared/MVPO_SPEC.md`` section 2 defines them.

The place of an observation is ``location|first two objects``: the first (static) receptacle type
it names, ``start`` for the opening room description, ``none`` when it names none; then the first
two distinct object types it names, joined by ``+`` (``none`` when none). Types are ALFWorld's own
lists, lower-case, as whole words; the movable receptacles (mug, pan, bowl...) count as objects,
since the agent carries them (the spec leaves the split open).
"""

from __future__ import annotations

import re
from pathlib import Path

import alfworld.gen.constants as alfred

from hgpo_env.contract.milestones import Progress, Vocabulary

MILESTONES = ("target", "operation", "place", "success", "invalid")
START = "start"
_STATIC_RECEPTACLES = set(alfred.RECEPTACLES) - set(alfred.MOVABLE_RECEPTACLES)
LOCATIONS = Vocabulary(_STATIC_RECEPTACLES)
OBJECTS = Vocabulary(set(alfred.OBJECTS) - _STATIC_RECEPTACLES)
_TAKEN = ("you pick up", "you take")
_PLACED = ("you put", "you move")
_OPERATED = re.compile(r"\b(clean|cool|heat|slice|cleaned|cooled|heated|sliced)\b")
_NOTHING = "nothing happens"


def target_object(game_file: Path, task: str) -> str:
    """The task's target object type: from the game's folder name
    (``<task_type>-<Object>-<MRecep>-<Parent>-<scene>``), else the first object type in the task text."""
    parts = game_file.parent.parent.name.split("-")
    if len(parts) == 5 and parts[1].lower() in OBJECTS.found(parts[1]):
        return parts[1].lower()
    return OBJECTS.first(task)


def place(observation: str, start: bool) -> str:
    """The signature's place of an observation (``start``: the opening room description)."""
    location = START if start else LOCATIONS.first(observation)
    objects = OBJECTS.found(observation)[:2]
    return f"{location}|{'+'.join(objects) or 'none'}"


def progress(observation: str, target: str, reward: float, action_valid: bool, start: bool) -> Progress:
    """The observation's place and its five flags (target taken, an operation done, something
    put down, success, an invalid step)."""
    text = observation.lower()
    taken = any(phrase in text for phrase in _TAKEN) and target in OBJECTS.found(text)
    flags = (
        taken,
        _OPERATED.search(text) is not None,
        any(phrase in text for phrase in _PLACED),
        reward > 0,
        _NOTHING in text or not action_valid,
    )
    return Progress(place(observation, start), flags)
