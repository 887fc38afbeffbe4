"""HGPO-Rooms-v0: deliver items between rooms of a small house, maybe through a locked door.

What the agent carries, and which items it already moved, never appears in a room's
description, so the same observation text follows different histories with different values:
the context inconsistency HGPO corrects, by construction. Steps take microseconds.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections import deque
from typing import Any, Literal

from hgpo_env.contract.milestones import Progress
from hgpo_env.envs.rooms.world import DIRECTIONS, Difficulty, Task, generate_task
from hgpo_env.textenv.core import TextEnv

CARRIED = -1
HELD_OUT_TASKS = 10_000
"""Task ids below this are never drawn by ``reset``: they are the fixed evaluation tasks."""


class RoomsEnv(TextEnv):
    """A procedurally generated house; ``task_id`` selects the house and the task.

    ``split="train"`` draws tasks with ids >= :data:`HELD_OUT_TASKS`, ``split="eval"`` below it;
    ``options={"task_id": i}`` selects any task. Difficulty knobs are those of
    :class:`~hgpo_env.envs.rooms.world.Difficulty`. ``show_carried`` ends every room description
    with what the agent carries, so equal observations no longer hide different inventories (a
    control for studies of context inconsistency).

    Milestones (:mod:`hgpo_env.contract.milestones`): the task's key seen, the key held, its door unlocked,
    the goal room reached with a goal item, an invalid step (the first three never fire on a task
    without a locked door). A place is ``room|carried`` (the carried items, sorted).
    """

    env_family = "rooms"
    milestones = ("key_seen", "key_held", "door_opened", "goal_room", "invalid")
    prompt_intro = (
        "You are an agent in a house of connected rooms. You can walk between rooms, take and drop "
        "items, and unlock doors with the right key. What you carry is not shown in room "
        "descriptions."
    )

    def __init__(
        self,
        *,
        max_steps: int = 30,
        success_reward: float = 10.0,
        split: Literal["train", "eval"] = "train",
        render_mode: str | None = None,
        protocol: str = "strict",
        show_carried: bool = False,
        **difficulty: Any,
    ) -> None:
        super().__init__(
            max_steps=max_steps, success_reward=success_reward, render_mode=render_mode, protocol=protocol
        )
        if split not in ("train", "eval"):
            raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
        self.split = split
        self.show_carried = show_carried
        if show_carried:
            self.prompt_intro = self.prompt_intro.replace(
                "What you carry is not shown in room descriptions.",
                "Room descriptions end with what you carry.",
            )
        unknown = sorted(set(difficulty) - {f.name for f in dataclasses.fields(Difficulty)})
        if unknown:
            knobs = [f.name for f in dataclasses.fields(Difficulty)]
            close = difflib.get_close_matches(unknown[0], knobs, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; Rooms takes {knobs}"
            raise TypeError(f"unknown Rooms argument {unknown[0]!r}{hint}")
        self.difficulty = Difficulty(**difficulty)
        self._task: Task | None = None

    # ----------------------------------------------------------------- task and state
    @property
    def num_tasks(self) -> int | None:
        return None

    def _sample_task_id(self) -> int:
        if self.split == "eval":
            return int(self.np_random.integers(HELD_OUT_TASKS))
        return int(self.np_random.integers(HELD_OUT_TASKS, 2**31 - 1))

    def _start_task(self, task_id: int) -> str:
        self._task = task = generate_task(task_id, self.difficulty)
        self.room = task.start
        self.positions = dict(task.items)
        self.unlocked = task.lock is None
        self._door_sides: tuple[tuple[int, str], ...] = ()
        if task.lock is not None:
            room, direction = task.lock
            other = task.exits[room][direction]
            back = next(d for d, r in task.exits[other].items() if r == room)
            self._door_sides = (task.lock, (other, back))
        return self._describe()

    @property
    def task_spec(self) -> Task:
        if self._task is None:
            raise RuntimeError("call reset() first")
        return self._task

    @property
    def task(self) -> str:
        return self.task_spec.text

    def task_identity(self) -> str:
        """The generated house: rooms, exits, item places, goal, lock and key."""
        return repr(self.task_spec)

    @property
    def task_type(self) -> str:
        return self.task_spec.task_type

    @property
    def won(self) -> bool:
        task = self.task_spec
        return all(self.positions[item] == task.goal_room for item in task.goal_items)

    def progress(self, reward: float, action_valid: bool) -> Progress:
        task = self.task_spec
        carried = self._carried()
        flags = (
            task.key is not None and (task.key in self._here() or task.key in carried),
            task.key in carried,
            task.lock is not None and self.unlocked,
            self.room == task.goal_room and any(item in carried for item in task.goal_items),
            not action_valid,
        )
        return Progress(f"{task.rooms[self.room]}|{'+'.join(sorted(carried)) or 'none'}", flags)

    def _carried(self) -> list[str]:
        return [item for item, where in self.positions.items() if where == CARRIED]

    def _here(self) -> list[str]:
        return [item for item, where in self.positions.items() if where == self.room]

    def _blocked(self, room: int, direction: str) -> bool:
        return not self.unlocked and (room, direction) in self._door_sides

    # ----------------------------------------------------------------- text
    def _describe(self) -> str:
        task = self.task_spec
        items = self._here()
        seen = f"You see: {', '.join(items)}." if items else "You see nothing to take."
        exits = []
        for direction in DIRECTIONS:
            if direction in task.exits[self.room]:
                if self._blocked(self.room, direction):
                    exits.append(f"{direction} (locked door)")
                else:
                    exits.append(f"{direction} to the {task.rooms[task.exits[self.room][direction]]}")
        where = f"You are in the {task.rooms[self.room]}. {seen} Exits: {', '.join(exits)}."
        if self.show_carried:
            carried = self._carried()
            where += f" You carry: {', '.join(carried)}." if carried else " You carry nothing."
        return where

    @property
    def admissible_actions(self) -> list[str]:
        task = self.task_spec
        actions = []
        for direction in DIRECTIONS:
            if direction not in task.exits[self.room]:
                continue
            if not self._blocked(self.room, direction):
                actions.append(f"go {direction}")
            elif task.key in self._carried():
                actions.append(f"unlock {direction} door")
        actions += [f"take {item}" for item in self._here()]
        actions += [f"drop {item}" for item in self._carried()]
        return actions + ["look", "inventory"]

    def _apply(self, command: str) -> str:
        verb, _, argument = command.partition(" ")
        task = self.task_spec
        if verb == "go":
            self.room = task.exits[self.room][argument]
            feedback = f"You walk {argument}."
        elif verb == "take":
            self.positions[argument] = CARRIED
            feedback = f"You take the {argument}."
        elif verb == "drop":
            self.positions[argument] = self.room
            feedback = f"You drop the {argument}."
        elif verb == "unlock":
            self.unlocked = True
            feedback = f"You unlock the door with the {task.key}."
        elif verb == "inventory":
            carried = self._carried()
            feedback = f"You carry: {', '.join(carried)}." if carried else "You carry nothing."
        else:  # look
            feedback = ""
        return f"{feedback} {self._describe()}".lstrip()

    # ----------------------------------------------------------------- expert
    def expert_action(self) -> str:
        """A shortest-path plan's next command from the current state; solves every task."""
        task = self.task_spec
        if self.won:
            return "look"
        carried = self._carried()
        if self.room == task.goal_room:
            for item in task.goal_items:
                if item in carried:
                    return f"drop {item}"
        pending = [g for g in task.goal_items if self.positions[g] not in (CARRIED, task.goal_room)]
        for item in pending:
            if self.positions[item] == self.room:
                return f"take {item}"
        targets = {self.positions[g] for g in pending} or {task.goal_room}
        step = self._first_step(targets)
        if step is not None:
            return f"go {step}"
        # The way is locked: fetch the key, then unlock the door from whichever side we are on.
        assert task.key is not None and task.lock is not None
        if task.key not in carried:
            if self.positions[task.key] == self.room:
                return f"take {task.key}"
            step = self._first_step({self.positions[task.key]})
        else:
            for room, direction in self._door_sides:
                if room == self.room:
                    return f"unlock {direction} door"
            step = self._first_step({task.lock[0]})
        assert step is not None, "generated tasks keep the key outside the locked region"
        return f"go {step}"

    def _first_step(self, targets: set[int]) -> str | None:
        """First direction of a shortest path to any target room (None if none is reachable)."""
        if self.room in targets:
            return None
        exits = self.task_spec.exits
        first: dict[int, str] = {}
        queue = deque([self.room])
        seen = {self.room}
        while queue:
            room = queue.popleft()
            for direction in DIRECTIONS:
                nxt = exits[room].get(direction)
                if nxt is None or nxt in seen or self._blocked(room, direction):
                    continue
                seen.add(nxt)
                first[nxt] = first.get(room, direction)
                if nxt in targets:
                    return first[nxt]
                queue.append(nxt)
        return None
