"""The purchase score, following WebShop's published reward (``web_agent_site/engine/goal.py``).

``score = r_type * (attributes matched + options matched + price ok) / (#attributes + #options + 1)``

* A goal attribute matches when some product attribute is a fuzzy match (token-set ratio above
  85), or when it occurs literally in the lower-cased title, bullet points or description.
* Each chosen option matches when it equals a goal option (``size``: exactly; others: fuzzy
  above 85), or occurs literally in the title, bullet points or description. Option values are
  colour-normalised first (the first known colour name they contain). Unlike the original, the
  count is capped at the number of goal options, so the score never exceeds 1.
* The price is ok when the charged price is at most the goal's cap.
* ``r_type`` checks the product type: 1 when the search query or two category-path levels agree
  or more than 20% of the goal title's nouns are in the bought title; else 0.5; 0.1 below 10%
  noun overlap and 0 with no overlap (0.2 is assumed when the goal title has no noun).

Fuzzy matching uses rapidfuzz's ``token_set_ratio`` with thefuzz's preprocessing (Latin-1
characters dropped, lower case, non-alphanumerics as spaces) and rounding, so it decides exactly
as the original's ``thefuzz.fuzz.token_set_ratio`` does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rapidfuzz import fuzz, utils

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

_LATIN1 = {code: None for code in range(128, 256)}


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


def fuzzy_ratio(a: str, b: str) -> int:
    """thefuzz's ``token_set_ratio(a, b)``: 0..100, 0 when either side has no word."""
    a = utils.default_process(a.translate(_LATIN1))
    b = utils.default_process(b.translate(_LATIN1))
    if not a or not b:
        return 0
    return round(fuzz.token_set_ratio(a, b))


def normalize_colour(value: str) -> str:
    return next((colour for colour in COLOURS if colour in value), value)


def _text_of(product: Product) -> tuple[str, str, str]:
    return product.title.lower(), " ".join(product.bullet_points).lower(), product.description.lower()


def type_match(product: Product, goal: Goal) -> tuple[float, bool, bool, float]:
    """``(r_type, query_match, category_match, title_score)`` for buying ``product`` for ``goal``."""
    query_match = product.query == goal.query
    bought_path = {level.strip() for level in product.product_category.split("›")}
    goal_path = {level.strip() for level in goal.product_category.split("›")}
    category_match = len(bought_path & goal_path) >= 2
    wanted = nouns(goal.name)
    title_score = len(set(nouns(product.title)) & set(wanted)) / len(wanted) if wanted else 0.2
    r_type = 1.0 if (query_match or category_match or title_score > 0.2) else 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return r_type, query_match, category_match, title_score


def attribute_matches(product: Product, goal: Goal) -> int:
    texts = _text_of(product)
    count = 0
    for wanted in goal.attributes:
        if any(fuzzy_ratio(have, wanted) > FUZZY_THRESHOLD for have in product.attributes) or any(
            wanted in text for text in texts
        ):
            count += 1
    return count


def option_matches(product: Product, goal_options: Sequence[str], chosen: Mapping[str, str]) -> int:
    texts = _text_of(product)
    wanted = [normalize_colour(o) for o in goal_options]
    count = 0
    for name, value in chosen.items():
        value = normalize_colour(value)
        if name.lower() in EXACT_MATCH_OPTIONS:
            matched = value in wanted
        else:
            matched = any(fuzzy_ratio(w, value) > FUZZY_THRESHOLD for w in wanted)
        if matched or any(value in text for text in texts):
            count += 1
    return min(count, len(goal_options))


def score_purchase(product: Product, price: float, chosen: Mapping[str, str], goal: Goal) -> ScoreDetails:
    """Score buying ``product`` at ``price`` with options ``chosen`` (group -> value) for ``goal``."""
    r_type, query_match, category_match, title_score = type_match(product, goal)
    attributes = attribute_matches(product, goal)
    options = option_matches(product, goal.options, chosen)
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
