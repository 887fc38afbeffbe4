"""Seeded generation of Rooms tasks: a small house on a grid, items to deliver, maybe a locked door.

A task is a pure function of its integer id and the difficulty knobs, so every process and
machine builds the same house for the same id.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

ROOM_NAMES = (
    "kitchen",
    "hallway",
    "living room",
    "bedroom",
    "bathroom",
    "study",
    "pantry",
    "garage",
    "cellar",
    "attic",
    "laundry room",
    "dining room",
    "office",
    "nursery",
    "porch",
    "library",
)
COLOURS = ("red", "blue", "green", "yellow", "white", "black", "brown", "silver")
OBJECTS = (
    "apple",
    "book",
    "candle",
    "cup",
    "lamp",
    "mug",
    "pen",
    "plate",
    "pillow",
    "spoon",
    "towel",
    "vase",
    "watch",
    "ball",
    "box",
    "coin",
)
KEYS = ("brass key", "iron key", "copper key")
DIRECTIONS = {"north": (0, 1), "south": (0, -1), "east": (1, 0), "west": (-1, 0)}
OPPOSITE = {"north": "south", "south": "north", "east": "west", "west": "east"}


@dataclass(frozen=True)
class Difficulty:
    """Knobs of the task generator (ranges are inclusive)."""

    min_rooms: int = 3
    max_rooms: int = 6
    min_distractors: int = 1
    max_distractors: int = 3
    max_task_items: int = 2
    lock_probability: float = 0.5

    def __post_init__(self) -> None:
        if not 2 <= self.min_rooms <= self.max_rooms <= len(ROOM_NAMES):
            raise ValueError(f"need 2 <= min_rooms <= max_rooms <= {len(ROOM_NAMES)}")
        if not 0 <= self.min_distractors <= self.max_distractors:
            raise ValueError("need 0 <= min_distractors <= max_distractors")
        if not 1 <= self.max_task_items <= 3:
            raise ValueError("max_task_items must be 1, 2 or 3")
        if self.max_task_items + self.max_distractors > len(COLOURS) * len(OBJECTS):
            raise ValueError("too many items for the item vocabulary")
        if not 0.0 <= self.lock_probability <= 1.0:
            raise ValueError("lock_probability must be within [0, 1]")


@dataclass(frozen=True)
class Task:
    """A generated task. Rooms are indices into ``rooms``; ``exits[r]`` maps direction -> room."""

    rooms: tuple[str, ...]
    exits: tuple[dict[str, int], ...]
    start: int
    items: dict[str, int]
    goal_items: tuple[str, ...]
    goal_room: int
    lock: tuple[int, str] | None
    """Room and direction of the locked door (locked from both sides), if any."""
    key: str | None

    @property
    def text(self) -> str:
        names = " and the ".join(self.goal_items)
        return f"put the {names} in the {self.rooms[self.goal_room]}."

    @property
    def task_type(self) -> str:
        kind = "deliver" if len(self.goal_items) == 1 else "deliver_many"
        return kind + ("_locked" if self.lock else "")


def _layout(rng: random.Random, num_rooms: int) -> tuple[list[dict[str, int]], list[int]]:
    """A random spanning tree of rooms on a grid; returns exits and each room's parent."""
    cells = {(0, 0): 0}
    exits: list[dict[str, int]] = [{}]
    parent = [-1]
    while len(exits) < num_rooms:
        frontier = [
            (cell, direction)
            for cell in cells
            for direction, (dx, dy) in DIRECTIONS.items()
            if (cell[0] + dx, cell[1] + dy) not in cells
        ]
        (x, y), direction = rng.choice(frontier)
        dx, dy = DIRECTIONS[direction]
        here, new = cells[(x, y)], len(exits)
        cells[(x + dx, y + dy)] = new
        exits[here][direction] = new
        exits.append({OPPOSITE[direction]: here})
        parent.append(here)
    return exits, parent


def _subtree(parent: list[int], root: int) -> set[int]:
    members = {root}
    for room in range(root + 1, len(parent)):  # parents always precede children
        if parent[room] in members:
            members.add(room)
    return members


def generate_task(task_id: int, difficulty: Difficulty = Difficulty()) -> Task:
    """Build task ``task_id``: deterministic in the id and the knobs."""
    rng = random.Random(task_id)
    num_rooms = rng.randint(difficulty.min_rooms, difficulty.max_rooms)
    exits, parent = _layout(rng, num_rooms)
    names = rng.sample(ROOM_NAMES, num_rooms)
    num_goal = rng.randint(1, difficulty.max_task_items)
    num_distractors = rng.randint(difficulty.min_distractors, difficulty.max_distractors)
    item_names = rng.sample([f"{c} {o}" for c in COLOURS for o in OBJECTS], num_goal + num_distractors)
    goal_items = tuple(item_names[:num_goal])

    lock = key = None
    locked_region: set[int] = set()
    if rng.random() < difficulty.lock_probability:
        door_child = rng.randrange(1, num_rooms)
        locked_region = _subtree(parent, door_child)
        door_room = parent[door_child]
        direction = next(d for d, r in exits[door_room].items() if r == door_child)
        lock, key = (door_room, direction), rng.choice(KEYS)
    open_rooms = [r for r in range(num_rooms) if r not in locked_region]

    start = rng.choice(open_rooms)
    # With a lock, at least one goal item or the goal room lies behind it, so the key matters.
    goal_room = rng.randrange(num_rooms)
    items = {name: rng.randrange(num_rooms) for name in item_names}
    if lock and goal_room not in locked_region and all(items[g] not in locked_region for g in goal_items):
        items[goal_items[0]] = rng.choice(sorted(locked_region))
    for name in goal_items:  # a goal item never starts delivered
        while items[name] == goal_room:
            items[name] = rng.randrange(num_rooms)
    if key is not None:
        items[key] = rng.choice(open_rooms)
    return Task(tuple(names), tuple(exits), start, items, goal_items, goal_room, lock, key)
