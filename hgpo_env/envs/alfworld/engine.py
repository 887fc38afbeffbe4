"""Playing one ALFWorld game on TextWorld's PDDL machinery, without its per-episode overhead.

This is the game loop of TextWorld's ``PddlEnv`` wrapped by ALFWorld's demangler (what
alfworld's ``AlfredTWEnv`` runs): the same planner library decides which actions apply and what
they change, and the same grammar words observations and commands, so the text is identical.
What differs is the cost: the episode-independent work comes from a :class:`CompileCache`,
templates are parsed once (:mod:`.narrate`), and each :class:`Engine` keeps one private copy of
the planner library for its whole life instead of loading a new one per game.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import fast_downward
from textworld.envs.pddl.logic import Atom
from textworld.logic import Placeholder, Proposition, State, Variable

from hgpo_env.envs.alfworld.compiled import CompileCache, CompiledGame, GameSource
from hgpo_env.envs.alfworld.containment import contained
from hgpo_env.envs.alfworld.narrate import Bindings, Narrator

NOTHING_HAPPENS = "Nothing happens."
"""The engine's answer to a command that matches no applicable action."""

_IDLE_LIBRARIES: list[Any] = []


def acquire_library() -> Any:
    """A private copy of fast_downward's planner library (its state is process-global per copy).

    Copies are recycled rather than unloaded: loading a copy costs a file copy and a
    ``dlopen``, unloading one leaks nothing worth saving, and loading after an unload crashes
    the library.
    """
    with contained():
        return _IDLE_LIBRARIES.pop() if _IDLE_LIBRARIES else fast_downward.load_lib()


def release_library(lib: Any) -> None:
    """Return a copy from :func:`acquire_library` for reuse in this process."""
    with contained():
        _IDLE_LIBRARIES.append(lib)


class _FactState(State):
    """TextWorld's fact store and rule matcher over a PDDL game's logic.

    ``State.__init__`` only accepts TextWorld's own logic class; the PDDL logic provides the
    same ``types`` the matcher needs, so the store is set up here as TextWorld's PDDL state does.
    """

    def __init__(self, logic: Any, facts: Iterable[Proposition]) -> None:
        self._logic = logic
        self._facts = defaultdict(set)
        self._vars_by_name = {}
        self._vars_by_type = defaultdict(set)
        self._var_counts = Counter()
        self.add_facts(facts)


@dataclass(frozen=True)
class _Option:
    """An applicable grounded action and the command that selects it."""

    command: str
    operator: int
    effects: int
    name: str
    bindings: Bindings


class Engine:
    """Runs one game at a time; reuse one engine per worker rather than one per game."""

    def __init__(self, cache: CompileCache) -> None:
        self.cache = cache
        self._lib: Any = acquire_library()
        self._game: CompiledGame | None = None
        self._options: list[_Option] = []
        self.won = False

    def start(self, source: GameSource) -> str:
        """Load the game in its initial state and return the opening text."""
        game = self.cache.get(source, self._lib)
        with contained():
            self._lib.load_sas(game.sas)
            self._game = game
            self._state = _FactState(game.logic, game.initial_facts)
            self._narrator = Narrator(game.logic.grammar, game.entities, self._state)
            self._refresh()
            return self._narrator.derive("#intro#")

    @property
    def entity_names(self) -> dict[str, str]:
        """Logic id -> the name the game shows ("drawer 3"), for the current game."""
        if self._game is None:
            raise RuntimeError("start a game first")
        return {entity_id: entity.name for entity_id, entity in self._game.entities.items()}

    @property
    def commands(self) -> list[str]:
        """Every command that does something now, sorted (``help`` included, as in ALFWorld)."""
        return sorted({option.command for option in self._options})

    def step(self, command: str) -> str:
        """Execute ``command``; an unknown one changes nothing and returns "Nothing happens."."""
        if self._game is None:
            raise RuntimeError("start a game before stepping")
        command = command.strip()
        option = next((o for o in self._options if o.command == command), None)
        if option is None:
            return NOTHING_HAPPENS
        with contained():
            effects = (Atom * option.effects)()
            self._lib.apply_operator(option.operator, effects)
            for effect in effects:
                fact = effect.get_fact(self._game.name2type)
                self._state.remove_fact(fact.negate())
                self._state.add_fact(fact)
            feedback = self._narrator.derive(
                self._game.logic.actions[option.name].feedback_rule, option.bindings
            )
            self._refresh()
        return feedback

    def close(self) -> None:
        """Hand this engine's planner library back for reuse; the engine is unusable after."""
        if self._lib is not None:
            release_library(self._lib)
            self._lib = None
            self._game = None

    def _refresh(self) -> None:
        """Recompute the applicable actions, their commands, and the win flag."""
        assert self._game is not None
        count = self._lib.get_applicable_operators_count()
        operators = (fast_downward.Operator * count)()
        self._lib.get_applicable_operators(operators)
        options, seen = [], set()
        for operator in operators:
            grounded = operator.name
            if grounded in seen:
                continue
            seen.add(grounded)
            name, *arguments = grounded.split()
            mapping = {
                Placeholder(param, kind): Variable(arg, kind)
                for (param, kind), arg in zip(self._game.parameters[name], arguments)
            }
            bindings = self._narrator.bindings(mapping)
            command = self._narrator.derive(self._game.logic.actions[name].template, bindings)
            options.append(_Option(command, operator.id, operator.nb_effect_atoms, name, bindings))
        self._options = options
        self.won = bool(self._lib.check_goal())
