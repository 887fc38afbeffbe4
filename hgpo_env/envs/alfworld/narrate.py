"""ALFWorld grammars: reading them and generating text from them, with the parsing done once.

TextWorld's ``ContextSensitiveGrammar.derive`` re-parses every template with TatSu and
deep-copies its context at every symbol; on ALFWorld that is most of a step's cost, since a
step derives one command per applicable action. :class:`Narrator` expands the same symbol
trees (parsed by TextWorld, cached here by text) under the same rules: the first production
whose condition holds in the state, conditions and lists expanded per matching assignment,
``{...}`` expressions evaluated against the bound entities. Contexts are passed by value and
never mutated, so nothing needs copying. :func:`game_logic` reads a game's grammar document
with the same per-text cache, since the games of a release differ only in their task line.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from typing import Any

from textworld.envs.pddl import logic as pddl_logic
from textworld.envs.pddl import textgen
from textworld.envs.pddl.logic import GameLogic
from textworld.envs.pddl.logic.model import ActionGrammarNode, ActionTypeNode
from textworld.envs.pddl.textgen import (
    ConditionalSymbol,
    ContextSensitiveGrammar,
    EvalSymbol,
    ListSymbol,
    NonterminalSymbol,
    ProductionRule,
    TerminalSymbol,
)
from textworld.generator.game import EntityInfo
from textworld.logic import Placeholder, Rule, State, TypeHierarchy, Variable

Bindings = tuple[Mapping[str, EntityInfo], Mapping[Placeholder, Variable]]
"""Entities by placeholder name (for expressions) and the logic mapping (for conditions)."""

_LIST_EMPTY = NonterminalSymbol("list_empty")
_SEPARATOR = NonterminalSymbol("list_separator")
_LAST_SEPARATOR = NonterminalSymbol("list_last_separator")


@functools.lru_cache(maxsize=8192)
def parse_symbols(text: str) -> tuple[Any, ...]:
    """TextWorld's parse of a grammar text into symbols, once per distinct text and process."""
    return tuple(textgen._parse_and_convert(text, rule_name="symbols"))


@functools.lru_cache(maxsize=4096)
def _query(expression: str) -> Rule:
    return Rule.parse_conjunctive_query(expression)


@functools.lru_cache(maxsize=4096)
def _code(expression: str) -> Any:
    return compile(expression, "<alfworld grammar>", "eval")


class _DocumentConverter(pddl_logic._ModelConverter):
    """TextWorld's reading of a ``.twl2`` document, with each production parsed once per process.

    Games of one release share their grammar but for the task line, and parsing the productions
    is most of the cost of reading a grammar; TextWorld would parse them all again per game.
    """

    def walk_PddlDocumentNode(self, node: Any) -> tuple[dict[str, Any], ContextSensitiveGrammar]:
        actions, rules = {}, {}
        for part in node.parts:
            if isinstance(part, ActionTypeNode):
                action = self.walk(part)
                actions[action.name.lower()] = action
                lines = (line for line in action.grammar.split("\n") if not line.lstrip().startswith("#"))
                rules.update(json.loads("\n".join(lines)))
            elif isinstance(part, ActionGrammarNode):
                rules.update(json.loads(self._unescape_block(part.code)))
        grammar = ContextSensitiveGrammar()
        for name, productions in rules.items():
            for production in productions:
                rhs = list(parse_symbols(production["rhs"]))
                condition = production.get("condition", "")
                grammar.add_rule(ProductionRule(name, rhs, production.get("weight", 1), condition))
        return actions, grammar


def game_logic(domain: str, grammar: str) -> GameLogic:
    """What ``GameLogic(domain, grammar)`` builds, reusing parsed productions across games."""
    logic = GameLogic.__new__(GameLogic)
    logic.domain, logic.types = domain, TypeHierarchy()
    logic.actions, logic.grammar = _DocumentConverter().walk(
        pddl_logic._PARSER.parse(grammar, rule_name="pddlStart")
    )
    return logic


class Narrator:
    """Derives text from ``grammar`` in ``state``; ``entities`` maps logic ids to their infos."""

    def __init__(
        self, grammar: ContextSensitiveGrammar, entities: Mapping[str, EntityInfo], state: State
    ) -> None:
        self.grammar = grammar
        self.entities = entities
        self.state = state

    def bindings(self, mapping: Mapping[Placeholder, Variable]) -> Bindings:
        return {ph.name: self.entities[var.name] for ph, var in mapping.items()}, mapping

    def derive(self, text: str, bindings: Bindings = ({}, {})) -> str:
        """The text generated from ``text`` (a template with ``#rule#``, ``{expr}``, ``[...]``)."""
        stack = [(symbol, bindings) for symbol in reversed(parse_symbols(text))]
        out: list[str] = []
        while stack:
            symbol, bound = stack.pop()
            if isinstance(symbol, TerminalSymbol):
                out.append(str(symbol.symbol))
            elif isinstance(symbol, EvalSymbol):
                out.append(str(self._evaluate(symbol, bound)))
            elif isinstance(symbol, NonterminalSymbol):
                rhs = self._production(str(symbol.symbol), bound)
                stack.extend((child, bound) for child in reversed(rhs))
            elif isinstance(symbol, ConditionalSymbol):
                stack.extend(reversed(self._instances(symbol, bound)))
            elif isinstance(symbol, ListSymbol):
                stack.extend(reversed(self._listed(symbol, bound)))
            else:
                raise TypeError(f"unknown grammar symbol {symbol!r}")
        return "".join(out)

    def _evaluate(self, symbol: EvalSymbol, bound: Bindings) -> Any:
        return eval(_code(symbol.expression), {}, dict(bound[0]))

    def _production(self, name: str, bound: Bindings) -> tuple[Any, ...]:
        """Right-hand side of the first rule for ``name`` whose condition holds."""
        rules = self.grammar._rules.get(name)
        if not rules:
            raise KeyError(f"the grammar has no rule #{name}#")
        for rule in rules:
            if not rule.condition or any(
                True for _ in self.state.all_assignments(_query(rule.condition), bound[1])
            ):
                return tuple(rule.rhs)
        raise ValueError(f"no rule for #{name}# applies in this state")

    def _instances(self, symbol: ConditionalSymbol, bound: Bindings) -> list[tuple[Any, Bindings]]:
        """The expression once per assignment that satisfies the symbol's condition."""
        if not symbol.given:
            return [(symbol.expression, bound)]
        variables, mapping = bound
        instances = []
        for found in self.state.all_assignments(_query(symbol.given), mapping):
            names = {ph.name: self.entities[var.name] for ph, var in found.items()}
            instances.append((symbol.expression, ({**variables, **names}, {**mapping, **found})))
        return instances

    def _listed(self, symbol: ListSymbol, bound: Bindings) -> list[tuple[Any, Bindings]]:
        """Items of a ``[...]`` list joined with the grammar's separators."""
        inner = symbol.symbol
        if isinstance(inner, ConditionalSymbol):
            items = self._instances(inner, bound)
        elif isinstance(inner, EvalSymbol):
            items = [(TerminalSymbol(self._evaluate(inner, bound)), bound)]
        elif isinstance(inner, ListSymbol):
            items = self._listed(inner, bound)
        else:
            raise TypeError(f"cannot list grammar symbol {inner!r}")
        if not items:
            return [(_LIST_EMPTY, bound)]
        if len(items) == 1:
            return items
        joined: list[tuple[Any, Bindings]] = []
        for item in items[:-1]:
            joined += [item, (_SEPARATOR, bound)]
        joined[-1] = (_LAST_SEPARATOR, bound)
        return joined + [items[-1]]
