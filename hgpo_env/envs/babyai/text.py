"""BabyAI's egocentric grid view in words.

The agent sees ``agent_view_size`` cells ahead and to each side; it stands at the bottom middle of
its view, facing up. Each visible object is placed by steps forward and left/right of the agent;
walls only as the nearest one straight ahead, to the left and to the right (enough to know where
one can walk). Nothing here counts steps or time, so equal views give equal text.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from minigrid.core.constants import IDX_TO_COLOR, IDX_TO_OBJECT, STATE_TO_IDX

_STATES = {index: name for name, index in STATE_TO_IDX.items()}
_SCENERY = {"unseen", "empty", "floor", "wall", "agent"}


def _steps(count: int, direction: str) -> str:
    return f"{count} step{'s' if count != 1 else ''} {direction}"


def _place(forward: int, right: int) -> str:
    parts = [_steps(forward, "forward")] if forward else []
    if right:
        parts.append(_steps(abs(right), "right" if right > 0 else "left"))
    return " and ".join(parts)


def _name(cell: np.ndarray) -> str:
    kind, color, state = (int(v) for v in cell)
    name = IDX_TO_OBJECT[kind]
    if name in ("goal", "lava"):
        return f"the {name}" if name == "goal" else "lava"
    if name == "door":
        return f"a {_STATES[state]} {IDX_TO_COLOR[color]} door"
    return f"a {IDX_TO_COLOR[color]} {name}"


def describe_view(image: np.ndarray, carrying: Any = None) -> str:
    """Sentences for a minigrid ``image`` observation (width x height x 3) and the carried object."""
    width, height = image.shape[:2]
    me_x, me_y = width // 2, height - 1
    seen: list[tuple[int, int, int, str]] = []
    for x in range(width):
        for y in range(height):
            if (x, y) == (me_x, me_y):
                continue  # the agent's own cell holds what it carries
            if IDX_TO_OBJECT[int(image[x, y, 0])] not in _SCENERY:
                forward, right = me_y - y, x - me_x
                seen.append((forward + abs(right), forward, right, _name(image[x, y])))
    lines = [f"You see {name} {_place(forward, right)}." for _, forward, right, name in sorted(seen)]
    for label, cells in (
        ("ahead", [(me_x, me_y - d) for d in range(1, height)]),
        ("to your left", [(me_x - d, me_y) for d in range(1, me_x + 1)]),
        ("to your right", [(me_x + d, me_y) for d in range(1, width - me_x)]),
    ):
        for distance, (x, y) in enumerate(cells, start=1):
            if IDX_TO_OBJECT[int(image[x, y, 0])] == "wall":
                lines.append(f"There is a wall {_steps(distance, label.removeprefix('to your '))}.")
                break
    if not seen:
        lines.insert(0, "You see no objects.")
    if carrying is not None:
        lines.append(f"You carry a {carrying.color} {carrying.type}.")
    else:
        lines.append("You carry nothing.")
    return " ".join(lines)
