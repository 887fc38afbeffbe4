"""Per-game work that does not depend on the episode, done once and cached.

Resetting a game with TextWorld's ``PddlEnv`` parses the grammar and translates the PDDL
problem with fast_downward twice on ``load`` and twice again on ``reset``: over a second of
pure recomputation per episode. A :class:`CompiledGame` keeps the results (the parsed grammar,
the SAS task, the initial facts, the entities with ALFWorld's display names) and
:class:`CompileCache` keeps compiled games in memory (LRU) and, optionally, on disk, keyed by
the content of the game, so any process that meets the same game again skips the work.
"""

from __future__ import annotations

import contextlib
import copyreg
import gc
import hashlib
import importlib.metadata
import os
import pickle
import threading
import zlib
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fast_downward
from alfworld.agents.utils.misc import Demangler
from textworld.envs.pddl.logic import Atom, GameLogic
from textworld.generator.game import EntityInfo
from textworld.logic import Placeholder, Proposition, Signature, Type, Variable

from hgpo_env.envs.alfworld.containment import contained
from hgpo_env.envs.alfworld.narrate import game_logic

FORMAT = 3
"""Version of the cached layout; part of every cache key."""

# TextWorld's logic objects keep hash((name, ...)) in a slot, and str hashes differ between
# processes (PYTHONHASHSEED): pickled as they are, they would carry hashes that are stale in the
# process that loads them, and fact lookups would silently fail. Pickle them by their
# constructor arguments instead, so every load computes fresh hashes.
copyreg.pickle(Variable, lambda v: (Variable, (v.name, v.type)))
copyreg.pickle(Placeholder, lambda p: (Placeholder, (p.name, p.type)))
copyreg.pickle(Signature, lambda s: (Signature, (s.name, s.types)))
copyreg.pickle(Proposition, lambda p: (Proposition, (p.name, p.arguments)))

_VERSIONS = "|".join(
    f"{dist}={importlib.metadata.version(dist)}"
    for dist in ("textworld", "fast-downward-textworld", "alfworld")
)


@dataclass(frozen=True)
class GameSource:
    """The three texts that define a game (the fields of a ``game.tw-pddl`` file)."""

    domain: str
    grammar: str
    problem: str

    @property
    def key(self) -> str:
        """Content hash: equal games share one compiled form, whatever their path."""
        digest = hashlib.sha256(f"{FORMAT}|{_VERSIONS}".encode())
        for text in (self.domain, self.grammar, self.problem):
            digest.update(len(text).to_bytes(8, "little") + text.encode())
        return digest.hexdigest()


@dataclass(frozen=True)
class CompiledGame:
    """Everything a reset needs besides loading ``sas`` into a planner library."""

    logic: GameLogic
    sas: bytes
    parameters: dict[str, tuple[tuple[str, str], ...]]
    """PDDL action name -> its parameters as (name without '?', type)."""
    name2type: dict[str, str]
    initial_facts: tuple[Proposition, ...]
    entities: dict[str, EntityInfo]
    """Logic id -> entity, named the way ALFWorld's demangler names it ("drawer 3")."""


def _init_facts(task: Any, name2type: dict[str, str]) -> Iterable[Proposition]:
    """The PDDL ``:init`` as propositions, without equality, costs and numeric fluents."""
    for atom in task.init:
        if isinstance(atom, fast_downward.translate.pddl.conditions.Atom):
            if atom.predicate != "=":
                yield Proposition(atom.predicate, [Variable(arg, name2type[arg]) for arg in atom.args])
        elif isinstance(atom, fast_downward.translate.pddl.f_expression.Assign):
            value = str(atom.expression.value)
            if atom.fluent.symbol != "total-cost" and not value.isdigit():
                yield Proposition(value, [Variable(arg, name2type[arg]) for arg in atom.fluent.args])


def state_facts(lib: Any, name2type: dict[str, str]) -> list[Proposition]:
    """The positive facts of the planner library's current state."""
    atoms = (Atom * lib.get_state_size())()
    lib.get_state(atoms)
    facts = (atom.get_fact(name2type) for atom in atoms)
    return [fact for fact in facts if not fact.is_negation]


def _entities(facts: Iterable[Proposition]) -> dict[str, EntityInfo]:
    entities = {var.name: EntityInfo(var.name, var.type) for fact in facts for var in fact.arguments}
    demangler = Demangler(game_infos=entities)
    for entity in entities.values():
        entity.name = demangler.demangle_alfred_name(entity.id)
        entity.definite, entity.indefinite = "the", "a"
    return entities


@contextlib.contextmanager
def _cyclic_gc_paused() -> Iterator[None]:
    """Keep CPython's cycle collector (process-wide, as it is) from running during a translation.

    Translating a game allocates about a million objects that reference counting frees, and
    their allocations keep starting collections that walk the whole heap: in a process holding an
    env's modules and a few games, that was half of a cold reset (200 of 420 ms). Cycles made
    meanwhile are collected by the first collection after it.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def translate(source: GameSource, optimize: bool = False) -> tuple[Any, str]:
    """fast_downward's PDDL task and SAS text for ``source`` (``optimize``: pruned for search)."""
    with contained(), _cyclic_gc_paused():
        return fast_downward.pddl2sas(source.domain, source.problem, optimize=optimize)


def compile_game(source: GameSource, lib: Any) -> CompiledGame:
    """Parse and translate ``source``; ``lib`` (a planner library) is left holding its task."""
    task, sas = translate(source)
    with contained():
        logic = game_logic(source.domain, source.grammar)
        for pddl_type in task.types:
            try:
                logic.types.add(Type(pddl_type.name, pddl_type.supertype_names))
            except ValueError:  # already known
                pass
        name2type = {obj.name: obj.type_name for obj in task.objects}
        sas_bytes = sas.encode("utf-8")
        lib.load_sas(sas_bytes)
        # Not deduplicated: TextWorld's PDDL state adds both lists, so a fact in both counts its
        # variables twice, and its store decrements those counts even when deleting an absent
        # fact. Matching the counts keeps deletes (e.g. of "inventory") from dropping variables.
        facts = [*_init_facts(task, name2type), *state_facts(lib, name2type)]
    parameters = {
        action.name: tuple((p.name.strip("?"), p.type_name) for p in action.parameters)
        for action in task.actions
    }
    return CompiledGame(logic, sas_bytes, parameters, name2type, tuple(facts), _entities(facts))


class CompileCache:
    """Compiled games by content key: an in-memory LRU over an optional on-disk store.

    The disk store holds zlib-compressed pickles (about 60 kB a game) under ``directory``;
    like any pickle cache it must only be shared with users you trust.
    """

    def __init__(self, directory: Path | None, max_in_memory: int = 16) -> None:
        self.directory = directory
        self.max_in_memory = max_in_memory
        self._memory: OrderedDict[str, CompiledGame] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, source: GameSource, lib: Any) -> CompiledGame:
        """The compiled game, compiled now with ``lib`` if no cache has it."""
        key = source.key
        with self._lock:
            game = self._memory.get(key)
            if game is not None:
                self._memory.move_to_end(key)
                return game
        game = self._load(key)
        if game is None:
            game = compile_game(source, lib)
            self._store(key, game)
        with self._lock:
            self._memory[key] = game
            while len(self._memory) > self.max_in_memory:
                self._memory.popitem(last=False)
        return game

    def _path(self, key: str) -> Path | None:
        return None if self.directory is None else self.directory / key[:2] / f"{key}.pkl.z"

    def _load(self, key: str) -> CompiledGame | None:
        path = self._path(key)
        if path is None or not path.is_file():
            return None
        try:
            return pickle.loads(zlib.decompress(path.read_bytes()))
        except Exception:  # noqa: BLE001 (unpickling a damaged file can raise anything): recompile
            return None

    def _store(self, key: str, game: CompiledGame) -> None:
        path = self._path(key)
        if path is None:
            return
        partial = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            partial.write_bytes(zlib.compress(pickle.dumps(game, protocol=pickle.HIGHEST_PROTOCOL), 1))
            partial.replace(path)  # atomic: concurrent workers never read half a file
        except OSError:  # a read-only or full disk only costs a recompilation next time
            partial.unlink(missing_ok=True)
