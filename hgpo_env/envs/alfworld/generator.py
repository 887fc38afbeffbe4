"""A generator of ALFWorld-format games, so the env runs on a fresh offline machine.

Games are built from what the ``alfworld`` package ships: the room layouts of its ALFRED floor
plans (receptacles and where the agent stands to use them, object types per room), its
receptacle/object compatibility and object properties, its goal library (PDDL goals and task
wordings of the six task types), and its PDDL domain and TextWorld grammar. Each game is
checked twice before it is written: fast_downward's planner must find a plan, and the
generator's own walkthrough must win it on :class:`~.engine.Engine`.

These are *not* the ALFWorld benchmark: rooms hold fewer receptacles and objects than ALFRED's,
so results on them are not comparable with published numbers.
"""

from __future__ import annotations

import json
import random
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import alfworld.gen.constants as alfred
import alfworld.gen.goal_library as goals
from alfworld.info import ALFRED_PDDL_PATH, ALFRED_TWL2_PATH

from hgpo_env.envs.alfworld.compiled import CompileCache, GameSource, translate
from hgpo_env.envs.alfworld.containment import contained
from hgpo_env.envs.alfworld.engine import Engine, acquire_library, release_library
from hgpo_env.envs.alfworld.games import GAME_FILE, SPLITS, TASK_TYPES, TRAJ_FILE
from hgpo_env.textenv.data import data_home

VERSION = 1
"""Bump when generated games change: they live in a folder named after it."""
MANIFEST = "GENERATED.json"
"""Marker file at the root of generated data."""
GAMES_PER_TYPE = {"train": 3, "valid_seen": 2, "valid_unseen": 2}
MAX_RECEPTACLES = 14
DISTRACTORS = (4, 8)

_LAYOUTS = Path(alfred.__file__).parent / "layouts"
_BASINS = {"Sink": "SinkBasin", "Bathtub": "BathtubBasin"}
_LAMPS = ("DeskLamp", "FloorLamp")
_LAMP_HOSTS = ("Desk", "SideTable", "Dresser", "Shelf", "CoffeeTable", "DiningTable", "TVStand", "CounterTop")
_TREATMENTS = {  # task type -> (object property, appliance receptacle, verb, goal predicate)
    "pick_clean_then_place_in_recep": ("Cleanable", "SinkBasin", "clean", "isClean"),
    "pick_heat_then_place_in_recep": ("Heatable", "Microwave", "heat", "isHot"),
    "pick_cool_then_place_in_recep": ("Coolable", "Fridge", "cool", "isCool"),
}
_PROPERTIES = {
    "Cleanable": "cleanable",
    "Heatable": "heatable",
    "Coolable": "coolable",
    "Sliceable": "sliceable",
}


def generated_root() -> Path:
    """Where generated games live: a folder per generator version under the data home."""
    return data_home() / "alfworld" / "generated" / f"v{VERSION}"


class GenerationError(RuntimeError):
    """A generated game failed its checks (a bug in the generator, never bad luck)."""


def mangle(alfred_id: str) -> str:
    """ALFRED's ``Type|+x|+y|+z`` id in the PDDL spelling that ALFWorld's demangler reads."""
    for old, new in (("|", "_bar_"), ("+", "_plus_"), ("-", "_minus_"), (".", "_dot_")):
        alfred_id = alfred_id.replace(old, new)
    return alfred_id


@dataclass(frozen=True)
class Receptacle:
    alfred_id: str
    kind: str
    location: str

    @property
    def position(self) -> tuple[float, float, float]:
        x, y, z = self.alfred_id.split("|")[1:4]
        return float(x), float(y), float(z)

    def holds(self, kind: str) -> bool:
        return kind in alfred.VAL_RECEPTACLE_OBJECTS.get(self.kind, ())


@dataclass(frozen=True)
class Item:
    alfred_id: str
    kind: str
    host: Receptacle


@dataclass
class Room:
    """A floor plan's receptacles and object types, and the items placed so far."""

    scene: int
    receptacles: list[Receptacle]
    kinds: set[str]
    items: list[Item] = field(default_factory=list)

    @classmethod
    def load(cls, scene: int) -> Room:
        poses = json.loads((_LAYOUTS / f"FloorPlan{scene}-openable.json").read_text())
        kinds = set(json.loads((_LAYOUTS / f"FloorPlan{scene}-objects.json").read_text()))
        receptacles = []
        for alfred_id, (x, z, rotation, horizon) in sorted(poses.items()):
            kind = alfred_id.split("|")[0]
            if kind in _BASINS:
                alfred_id, kind = f"{alfred_id}|{_BASINS[kind]}", _BASINS[kind]
            if kind in alfred.VAL_RECEPTACLE_OBJECTS and kind not in alfred.MOVABLE_RECEPTACLES:
                location = f"loc|{round(x / 0.25)}|{round(z / 0.25)}|{int(rotation) // 90 % 4}|{int(horizon)}"
                receptacles.append(Receptacle(alfred_id, kind, location))
        return cls(scene, receptacles, kinds)

    def hosts(self, kind: str, exclude: tuple[str, ...] = ()) -> list[Receptacle]:
        return [r for r in self.receptacles if r.holds(kind) and r.kind not in exclude]

    def place(self, rng: random.Random, kind: str, host: Receptacle) -> Item:
        taken = {item.alfred_id for item in self.items}
        x, y, z = host.position
        while True:
            alfred_id = f"{kind}|{x + rng.uniform(-0.4, 0.4):+06.2f}|{y + rng.uniform(0, 0.3):+06.2f}|{z + rng.uniform(-0.4, 0.4):+06.2f}"
            if alfred_id not in taken:
                break
        item = Item(alfred_id, kind, host)
        self.items.append(item)
        return item


@dataclass(frozen=True)
class Task:
    task_type: str
    target: Item | None  # the object to carry (look_at: the object to hold)
    second: Item | None  # pick_two's other object
    goal_kind: str | None  # receptacle type to put it in
    lamp: Item | None
    appliance: Receptacle | None

    @property
    def folder(self) -> str:
        obj = self.target.kind if self.target else "None"
        parent = self.lamp.kind if self.lamp else self.goal_kind
        return f"{self.task_type}-{obj}-None-{parent}"


def _choose_task(rng: random.Random, room: Room, task_type: str) -> Task | None:
    """Place the task's objects in ``room``, or None when the room cannot host this type."""
    treatment = _TREATMENTS.get(task_type)
    appliances = [r for r in room.receptacles if treatment and r.kind == treatment[1]]
    if treatment and not appliances:
        return None
    lamp_kinds = [k for k in _LAMPS if k in room.kinds]
    lamp_hosts = [r for r in room.receptacles if r.kind in _LAMP_HOSTS]
    if task_type == "look_at_obj_in_light" and not (lamp_kinds and lamp_hosts):
        return None
    kinds = sorted(k for k in room.kinds if k not in _LAMPS and room.hosts(k))
    if treatment:
        kinds = [k for k in kinds if k in alfred.VAL_ACTION_OBJECTS[treatment[0]]]
    rng.shuffle(kinds)
    for kind in kinds:
        if task_type == "look_at_obj_in_light":
            lamp = room.place(rng, lamp_kinds[0], rng.choice(lamp_hosts))
            target = room.place(rng, kind, rng.choice(room.hosts(kind)))
            return Task(task_type, target, None, None, lamp, None)
        avoid = (treatment[1],) if treatment else ()
        goal_kinds = sorted({r.kind for r in room.hosts(kind, avoid)})
        rng.shuffle(goal_kinds)
        for goal_kind in goal_kinds:
            sources = room.hosts(kind, (goal_kind, *avoid))
            if not sources:
                continue
            target = room.place(rng, kind, rng.choice(sources))
            second = (
                room.place(rng, kind, rng.choice(sources)) if task_type == "pick_two_obj_and_place" else None
            )
            appliance = rng.choice(appliances) if treatment else None
            return Task(task_type, target, second, goal_kind, None, appliance)
    return None


def _trim(rng: random.Random, room: Room, task: Task) -> None:
    """Keep the receptacles the task needs and a random few others, up to MAX_RECEPTACLES."""
    needed = {item.host for item in room.items}
    if task.appliance:
        needed.add(task.appliance)
    needed |= {r for r in room.receptacles if r.kind == task.goal_kind}
    others = [r for r in room.receptacles if r not in needed]
    keep = needed | set(rng.sample(others, max(0, min(len(others), MAX_RECEPTACLES - len(needed)))))
    room.receptacles = [r for r in room.receptacles if r in keep]


def _add_distractors(rng: random.Random, room: Room, task: Task) -> None:
    """Other objects, never of the task's object type, in receptacles that can hold them."""
    task_kind = task.target.kind if task.target else None
    kinds = sorted(k for k in room.kinds if k not in _LAMPS and k != task_kind and room.hosts(k))
    for _ in range(rng.randint(*DISTRACTORS) if kinds else 0):
        kind = rng.choice(kinds)
        room.place(rng, kind, rng.choice(room.hosts(kind)))


def _problem(name: str, room: Room, task: Task, start: str) -> str:
    receptacles = {mangle(r.alfred_id): r for r in room.receptacles}
    items = {mangle(i.alfred_id): i for i in room.items}
    locations = sorted({mangle(r.location) for r in room.receptacles} | {mangle(start)})
    object_kinds = sorted({i.kind for i in room.items})
    receptacle_kinds = sorted({r.kind for r in room.receptacles})
    facts = [f"(atLocation agent1 {mangle(start)})"]
    for rid, r in receptacles.items():
        facts += [
            f"(receptacleType {rid} {r.kind}Type)",
            f"(receptacleAtLocation {rid} {mangle(r.location)})",
        ]
        if r.kind in alfred.OPENABLE_CLASS_LIST:
            facts.append(f"(openable {rid})")
    for oid, item in items.items():
        facts += [
            f"(objectType {oid} {item.kind}Type)",
            f"(inReceptacle {oid} {mangle(item.host.alfred_id)})",
        ]
        facts.append(f"(objectAtLocation {oid} {mangle(item.host.location)})")
        if item.kind in _LAMPS:
            facts.append(f"(toggleable {oid})")
            continue
        facts.append(f"(pickupable {oid})")
        facts += [
            f"({pred} {oid})"
            for prop, pred in _PROPERTIES.items()
            if item.kind in alfred.VAL_ACTION_OBJECTS[prop]
        ]
        if item.kind in alfred.MOVABLE_RECEPTACLES:
            facts.append(f"(isReceptacleObject {oid})")
    for rk in receptacle_kinds:
        facts += [
            f"(canContain {rk}Type {ok}Type)"
            for ok in object_kinds
            if ok in alfred.VAL_RECEPTACLE_OBJECTS[rk]
        ]
    declarations = ["agent1 - agent"]
    declarations += [f"{k}Type - otype" for k in object_kinds] + [
        f"{k}Type - rtype" for k in receptacle_kinds
    ]
    declarations += [f"{oid} - object" for oid in items] + [f"{rid} - receptacle" for rid in receptacles]
    declarations += [f"{loc} - location" for loc in locations]
    goal = goals.gdict[task.task_type]["pddl"].format(
        obj=task.target.kind if task.target else "",
        recep=task.goal_kind or "",
        toggle=task.lamp.kind if task.lamp else "",
    )
    lines = [
        f"(define (problem {name})",
        "(:domain alfred)",
        "(:objects",
        *declarations,
        ")",
        "(:init",
        *facts,
        ")",
    ]
    return "\n".join(lines) + "\n" + goal.replace("#", "-")


def _walkthrough(task: Task, names: dict[str, str], room: Room) -> list[str]:
    """A winning command sequence, written from where the generator put things."""

    def name(thing: Item | Receptacle) -> str:
        return names[mangle(thing.alfred_id).lower()]

    commands: list[str] = []
    opened: set[Receptacle] = set()
    here = [""]  # the agent's location; "go to" a receptacle where it stands is not a command

    def visit(receptacle: Receptacle, open_it: bool = True) -> None:
        if receptacle.location != here[0]:
            commands.append(f"go to {name(receptacle)}")
            here[0] = receptacle.location
        if open_it and receptacle.kind in alfred.OPENABLE_CLASS_LIST and receptacle not in opened:
            commands.append(f"open {name(receptacle)}")
            opened.add(receptacle)

    assert task.target is not None
    goal = next((r for r in room.receptacles if r.kind == task.goal_kind), None)
    for item in (task.target, task.second):
        if item is None:
            continue
        visit(item.host)
        commands.append(f"take {name(item)} from {name(item.host)}")
        if task.lamp is not None:
            visit(task.lamp.host, open_it=False)
            commands.append(f"use {name(task.lamp)}")
            return commands
        if task.appliance is not None:
            visit(task.appliance, open_it=False)
            commands.append(f"{_TREATMENTS[task.task_type][2]} {name(item)} with {name(task.appliance)}")
        assert goal is not None
        visit(goal)
        commands.append(f"move {name(item)} to {name(goal)}")
    return commands


def planner_solves(source: GameSource) -> bool:
    """Whether fast_downward's search finds a plan for the game."""
    lib = acquire_library()
    try:
        _, sas = translate(source, optimize=True)
        with contained():
            return bool(lib.solve_sas(sas.encode("utf-8"), False))
    finally:
        release_library(lib)


def _replay_wins(engine: Engine, source: GameSource, commands: list[str]) -> bool:
    engine.start(source)
    for command in commands:
        if engine.won or command not in engine.commands:
            return False
        engine.step(command)
    return engine.won


@dataclass(frozen=True)
class GeneratedGame:
    folder: str
    trial: str
    game: dict
    traj: dict


def generate_game(task_type: str, split: str, index: int, engine: Engine) -> GeneratedGame:
    """Game ``index`` of ``task_type`` for ``split``: the same on every machine."""
    if task_type not in TASK_TYPES:
        raise ValueError(f"task_type must be one of {TASK_TYPES}, got {task_type!r}")
    rng = random.Random(f"hgpo-alfworld-v{VERSION}|{split}|{task_type}|{index}")
    scenes = alfred.TEST_SCENE_NUMBERS if split == "valid_unseen" else alfred.TRAIN_SCENE_NUMBERS
    for _ in range(1000):
        room = Room.load(rng.choice(scenes))
        task = _choose_task(rng, room, task_type)
        if task is not None:
            break
    else:
        raise GenerationError(f"no floor plan can host {task_type}")
    _trim(rng, room, task)
    _add_distractors(rng, room, task)
    occupied = {tuple(r.location.split("|")[1:3]) for r in room.receptacles}
    x, z = next(cell for cell in _grid(rng) if (str(cell[0]), str(cell[1])) not in occupied)
    start = f"loc|{x}|{z}|{rng.randrange(4)}|30"
    trial = f"trial_hgpo{VERSION}_{split}_{index:04d}"
    text = goals.gdict[task_type]["templates"][rng.randrange(2)].format(
        obj=task.target.kind.lower(),
        recep=(task.goal_kind or "").lower(),
        toggle=task.lamp.kind.lower() if task.lamp else "",
    )
    source = GameSource(
        Path(ALFRED_PDDL_PATH).read_text(),
        Path(ALFRED_TWL2_PATH).read_text().replace("UNKNOWN GOAL", text),
        _problem(f"plan_{trial}", room, task, start),
    )
    engine.start(source)
    walkthrough = _walkthrough(task, engine.entity_names, room)
    if not _replay_wins(engine, source, walkthrough):
        raise GenerationError(f"{task.folder} (scene {room.scene}): the walkthrough does not win")
    if not planner_solves(source):
        raise GenerationError(f"{task.folder} (scene {room.scene}): the planner finds no plan")
    game = {
        "pddl_domain": source.domain,
        "grammar": source.grammar,
        "pddl_problem": source.problem,
        "solvable": True,
        "walkthrough": walkthrough,
    }
    traj = {"task_type": task_type, "scene": {"scene_num": room.scene}, "generator": f"hgpo-v{VERSION}"}
    return GeneratedGame(f"{task.folder}-{room.scene}", trial, game, traj)


def _grid(rng: random.Random) -> Iterator[tuple[int, int]]:
    """Grid cells to try as the agent's start, nearest the middle first, ties shuffled."""
    cells = [(x, z) for x in range(-12, 13) for z in range(-12, 13)]
    rng.shuffle(cells)
    return iter(sorted(cells, key=lambda c: abs(c[0]) + abs(c[1])))


def generate_split(root: Path, split: str, games_per_type: int, cache: CompileCache) -> Path:
    """Write ``games_per_type`` games of each type under ``root/json_2.1.1/split`` (atomically)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    final = root / "json_2.1.1" / split
    if final.is_dir():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    engine = Engine(cache)
    staging = Path(tempfile.mkdtemp(prefix=f".{split}-", dir=final.parent))
    try:
        for task_type in TASK_TYPES:
            for index in range(games_per_type):
                made = generate_game(task_type, split, index, engine)
                folder = staging / made.folder / made.trial
                folder.mkdir(parents=True)
                (folder / GAME_FILE).write_text(json.dumps(made.game))
                (folder / TRAJ_FILE).write_text(json.dumps(made.traj))
        manifest = root / MANIFEST
        if not manifest.is_file():
            manifest.write_text(json.dumps({"generator": "hgpo", "version": VERSION, "benchmark": False}))
        try:
            staging.rename(final)
        except OSError:  # another process finished first: keep its copy
            if not final.is_dir():
                raise
    finally:
        engine.close()
        shutil.rmtree(staging, ignore_errors=True)
    return final
