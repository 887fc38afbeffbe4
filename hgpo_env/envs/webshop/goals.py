"""Goals (what to buy) and the standard split, following WebShop's rules.

Synthetic goals: every product with a templated instruction yields one goal per combination of
its option values (option groups in sorted order), each with the instruction, the options asked
for and a price cap. Human goals: one per human-written instruction that names an attribute.
The cap is the larger of two values drawn from the first four multiples of $10 above the
product's price (no cap, 1,000,000, when fewer than two exist); it is drawn once per product,
seeded by asin, where the original used an unseeded global generator.

The goal list is shuffled with ``random.Random(233)`` exactly as the original shuffles it, so
index ``i`` names the same product and options as goal ``i`` of the original; the standard split
is test = goals 0-499, eval = 500-1499, train = 1500 onwards.
"""

from __future__ import annotations

import functools
import itertools
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass

from hgpo_env.envs.webshop.catalog import Catalog, Product

PRICE_STEPS = tuple(10.0 * i for i in range(1, 100))
NO_PRICE_CAP = 1_000_000.0
SHUFFLE_SEED = 233
SPLITS = {"test": (0, 500), "eval": (500, 1500), "train": (1500, None)}
VERL_AGENT_SPLITS = {"test": (0, 500), "train": (500, None)}
"""The papers' split (verl-agent): evaluation on goals 0-499, training on all the rest."""

_PRICE_CLAUSE = re.compile(r", and price lower than [\d.]+ dollars$")


@dataclass(frozen=True, slots=True)
class Goal:
    """One shopping task."""

    asin: str
    name: str
    """Title of the goal product as the original keeps it; its nouns define the product type."""
    category: str
    query: str
    product_category: str
    instruction_text: str
    attributes: tuple[str, ...]
    options: tuple[str, ...]
    """Option values asked for, as the pages show them (synthetic goals: one per option group, in
    sorted group order)."""
    scored_options: tuple[str | tuple[str, str], ...]
    """The options as the original reward iterates them, text as the original keeps it: ``(group,
    value)`` pairs for synthetic goals (it is handed the goal dict's items), the written values
    for human goals (a list there)."""
    price_upper: float

    @property
    def search_text(self) -> str:
        """The instruction without its price clause: what a shopper would type in the search box."""
        return _PRICE_CLAUSE.sub("", self.instruction_text).lower()


def _goal(
    product: Product,
    text: str,
    attributes: tuple[str, ...],
    options: tuple[str, ...],
    scored_options: tuple[str | tuple[str, str], ...],
    upper: float,
) -> Goal:
    """The goal of buying ``product`` as the instruction ``text`` asks."""
    return Goal(
        product.asin,
        product.source.title,
        product.category,
        product.query,
        product.product_category,
        text,
        attributes,
        options,
        scored_options,
        upper,
    )


def price_cap(asin: str, price: float) -> tuple[float, str]:
    """The cap and the clause the instruction gets for it (empty without a cap)."""
    steps = [p for p in PRICE_STEPS if p > price][:4]
    if len(steps) < 2:
        return NO_PRICE_CAP, ""
    upper = max(random.Random(f"price-cap:{asin}").sample(steps, 2))
    return upper, f", and price lower than {upper:.2f} dollars"


def synthetic_goals(catalog: Catalog) -> list[Goal]:
    """The templated goals, in catalog order before shuffling (6910 for the official small setting)."""
    goals = []
    for product, price in zip(catalog.products, catalog.prices):
        instruction = catalog.synthetic_instructions.get(product.asin)
        if instruction is None:
            continue
        upper, price_text = price_cap(product.asin, price)
        names = sorted(product.options)
        groups = [zip(product.options[name], product.source.options[name]) for name in names]
        for combination in itertools.product(*groups):
            shown = tuple(value for value, _ in combination)
            scored = tuple((name, source) for name, (_, source) in zip(names, combination))
            option_text = ", and ".join(f"{name}: {value}" for name, value in zip(names, shown))
            option_text = f" with {option_text}" if option_text else ""
            text = f"{instruction.text}{option_text}{price_text}"
            goals.append(_goal(product, text, instruction.attributes, shown, scored, upper))
    return goals


def human_goals(catalog: Catalog) -> list[Goal]:
    """Goals from human-written instructions; those naming no attribute are skipped, as in the original."""
    goals = []
    for product, price in zip(catalog.products, catalog.prices):
        for instruction in catalog.human_instructions.get(product.asin, ()):
            if not instruction.attributes:
                continue
            upper, price_text = price_cap(product.asin, price)
            text = instruction.text.strip(".") + price_text
            options = instruction.options
            goals.append(_goal(product, text, instruction.attributes, options, options, upper))
    return goals


@functools.lru_cache(maxsize=8)
def shuffled_goals(catalog: Catalog, human: bool = False) -> tuple[Goal, ...]:
    """All goals in the original's fixed shuffled order (computed once per catalog)."""
    goals = human_goals(catalog) if human else synthetic_goals(catalog)
    random.Random(SHUFFLE_SEED).shuffle(goals)
    return tuple(goals)


def split_goals(
    goals: tuple[Goal, ...], split: str, splits: Mapping[str, tuple[int, int | None]] = SPLITS
) -> tuple[Goal, ...]:
    """The goals of one split of ``splits`` (the standard split by default)."""
    if split not in splits:
        raise ValueError(f"split must be one of {tuple(splits)}, got {split!r}")
    start, stop = splits[split]
    return goals[start:stop]
