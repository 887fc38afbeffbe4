"""WebShop's purchase score (``web_agent_site/engine/goal.py::get_reward``), bit for bit by default.

``score = (attributes matched + options matched + price ok) / (#attributes + #options + 1) * r_type``

``reward="original"`` (the default; what the WebShop, GiGPO and HGPO papers report):

* A goal attribute matches when thefuzz's ``token_set_ratio`` with some product attribute is above
  85, or when it occurs in the lower-cased title, bullet points (joined by a space) or description,
  read as the original keeps them (double spaces and non-breaking spaces included).
* The goal's options are what the original iterates: for synthetic goals the ``(group, value)``
  pairs of its options dict, for human goals the written values. Each counts once when some chosen
  value scores above 85 against it. Both sides first go through ``normalize_color``, which for a
  string returns the first colour name it contains and for a pair acts only when an element *is* a
  colour name (``in`` on a tuple tests membership). thefuzz scores a pair as its ``str()``, so
  the group name is among its words, and a value holding ``\xa0`` appears escaped there while the
  chosen value loses the character: such an option never matches, even when bought as asked. No
  size rule, no fallback to the product's text.
* The price is ok when the charged price is at most the goal's cap.
* ``r_type``: 1 when the query or two category-path levels agree or more than 20% of the goal
  title's nouns are in the bought title; else 0.5; 0.1 below 10% noun overlap and 0 with none
  (the overlap counts as 0.2 when the goal title has no noun). Nouns: :mod:`.nouns`.

``reward="corrected"`` (opt-in) changes only the options and the text: each *chosen* option
counts when it equals a goal value (sizes exactly, others fuzzily) or occurs in the product's
text, the count is capped at the number of goal options, and text is read as the pages show it
(whitespace collapsed). A purchase made as asked then always scores 1.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass

from rapidfuzz.fuzz import token_set_ratio as _token_set_ratio
from thefuzz.utils import full_process

from hgpo_env.envs.webshop.catalog import Product
from hgpo_env.envs.webshop.goals import Goal
from hgpo_env.envs.webshop.nouns import nouns

FUZZY_THRESHOLD = 85
EXACT_MATCH_OPTIONS = frozenset({"size"})
COLOURS = [
    "alabaster",
    "apricot",
    "aqua",
    "ash",
    "asphalt",
    "azure",
    "banana",
    "beige",
    "black",
    "blue",
    "blush",
    "bordeaux",
    "bronze",
    "brown",
    "burgundy",
    "camel",
    "camo",
    "caramel",
    "champagne",
    "charcoal",
    "cheetah",
    "chestnut",
    "chocolate",
    "christmas",
    "coffee",
    "cognac",
    "copper",
    "coral",
    "cranberry",
    "cream",
    "crystal",
    "dark",
    "denim",
    "eggplant",
    "elephant",
    "espresso",
    "fuchsia",
    "gold",
    "granite",
    "grape",
    "graphite",
    "grass",
    "gray",
    "green",
    "grey",
    "heather",
    "indigo",
    "ivory",
    "ivy",
    "khaki",
    "lavender",
    "lemon",
    "leopard",
    "light",
    "lilac",
    "lime",
    "magenta",
    "maroon",
    "mauve",
    "merlot",
    "midnight",
    "mint",
    "mocha",
    "multicolor",
    "mushroom",
    "mustard",
    "natural",
    "navy",
    "nude",
    "olive",
    "orange",
    "peach",
    "pewter",
    "pink",
    "plum",
    "purple",
    "rainbow",
    "red",
    "rose",
    "royal",
    "rust",
    "sand",
    "sapphire",
    "seashell",
    "silver",
    "skull",
    "slate",
    "steel",
    "stone",
    "stonewash",
    "sunflower",
    "tan",
    "taupe",
    "teal",
    "tiger",
    "turquoise",
    "violet",
    "walnut",
    "wheat",
    "white",
    "wine",
    "yellow",
]
"""Colour names in the original's order: the first one found in a value stands for it."""

REWARDS = ("original", "corrected")


@dataclass(frozen=True, slots=True)
class ScoreDetails:
    """A purchase score and its parts (the original's ``verbose`` reward info)."""

    score: float
    r_type: float
    r_attribute: float
    r_option: float | None
    r_price: bool
    query_match: bool
    category_match: bool
    title_score: float


@functools.lru_cache(maxsize=1 << 16)
def _processed(text: str | tuple[str, str]) -> str:
    return full_process(text, force_ascii=True)


def token_set_ratio(a: str | tuple[str, str], b: str | tuple[str, str]) -> int:
    """thefuzz's ``fuzz.token_set_ratio(a, b)`` (its processing, then rapidfuzz's scorer, rounded),
    with each side's processing cached: catalog strings recur in almost every purchase."""
    return round(_token_set_ratio(_processed(a), _processed(b)))


def normalize_colour(option: str | tuple[str, str]) -> str | tuple[str, str]:
    """The original's ``normalize_color``: the first colour name ``in`` the option, else the option."""
    return next((colour for colour in COLOURS if colour in option), option)


def type_match(product: Product, goal: Goal) -> tuple[float, bool, bool, float]:
    """``(r_type, query_match, category_match, title_score)`` for buying ``product`` for ``goal``."""
    query_match = product.query == goal.query
    bought_path = {level.strip() for level in product.product_category.split("›")}
    goal_path = {level.strip() for level in goal.product_category.split("›")}
    category_match = len(bought_path & goal_path) >= 2
    wanted = nouns(goal.name)
    title_score = len(set(nouns(product.source.title)) & set(wanted)) / len(wanted) if wanted else 0.2
    r_type = 1.0 if (query_match or category_match or title_score > 0.2) else 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return r_type, query_match, category_match, title_score


def _source_text(product: Product) -> tuple[str, str, str]:
    source = product.source
    return source.title.lower(), source.bullet_points, source.description


def _shown_text(product: Product) -> tuple[str, str, str]:
    return product.title.lower(), " ".join(product.bullet_points).lower(), product.description.lower()


def attribute_matches(product: Product, goal: Goal, texts: tuple[str, ...]) -> int:
    count = 0
    for wanted in goal.attributes:
        if any(token_set_ratio(have, wanted) > FUZZY_THRESHOLD for have in product.attributes) or any(
            wanted in text for text in texts
        ):
            count += 1
    return count


def original_option_matches(product: Product, goal: Goal, chosen: Mapping[str, str]) -> int:
    bought = [normalize_colour(product.source_option(group, value)) for group, value in chosen.items()]
    count = 0
    for wanted in map(normalize_colour, goal.scored_options):
        if any(token_set_ratio(have, wanted) > FUZZY_THRESHOLD for have in bought):
            count += 1
    return count


def corrected_option_matches(product: Product, goal: Goal, chosen: Mapping[str, str]) -> int:
    texts = _shown_text(product)
    wanted = [normalize_colour(o) for o in goal.options]
    count = 0
    for name, value in chosen.items():
        value = normalize_colour(value)
        if name.lower() in EXACT_MATCH_OPTIONS:
            matched = value in wanted
        else:
            matched = any(token_set_ratio(w, value) > FUZZY_THRESHOLD for w in wanted)
        if matched or any(value in text for text in texts):
            count += 1
    return min(count, len(goal.options))


def score_purchase(
    product: Product, price: float, chosen: Mapping[str, str], goal: Goal, *, reward: str = "original"
) -> ScoreDetails:
    """Score buying ``product`` at ``price`` with options ``chosen`` (group -> value as shown) for
    ``goal``, by the ``reward`` variant (see the module docstring)."""
    if reward == "original":
        attributes = attribute_matches(product, goal, _source_text(product))
        options = original_option_matches(product, goal, chosen)
    elif reward == "corrected":
        attributes = attribute_matches(product, goal, _shown_text(product))
        options = corrected_option_matches(product, goal, chosen)
    else:
        raise ValueError(f"reward must be one of {REWARDS}, got {reward!r}")
    r_type, query_match, category_match, title_score = type_match(product, goal)
    r_price = price <= goal.price_upper
    total = (attributes + options + r_price) / (len(goal.attributes) + len(goal.options) + 1)
    return ScoreDetails(
        score=total * r_type,
        r_type=r_type,
        r_attribute=attributes / len(goal.attributes) if goal.attributes else 1.0,
        r_option=options / len(goal.options) if goal.options else None,
        r_price=r_price,
        query_match=query_match,
        category_match=category_match,
        title_score=title_score,
    )
