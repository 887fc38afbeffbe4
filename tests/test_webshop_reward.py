"""WebShop's purchase score on hand-made products.

Every expected value is worked out by hand from the original ``get_reward`` (princeton-nlp/WebShop,
``web_agent_site/engine/goal.py``); the comment beside each case follows its steps. Title nouns
are pinned per test, so the cases do not depend on the tagger (its table has its own test in
``test_webshop_data.py``).
"""

from __future__ import annotations

import dataclasses
import sys
import warnings

import gymnasium as gym
import pytest
from hypothesis import given
from hypothesis import strategies as st
from thefuzz import fuzz

import hgpo_env  # noqa: F401
from hgpo_env.envs.webshop import nouns as nouns_module
from hgpo_env.envs.webshop import score_purchase
from hgpo_env.envs.webshop.catalog import Catalog, build_catalog
from hgpo_env.envs.webshop.goals import Goal, human_goals, synthetic_goals
from hgpo_env.envs.webshop.reward import normalize_colour, token_set_ratio
from hgpo_env.envs.webshop.sources import GeneratedCatalogWarning

ASIN = "H000000001"
KITCHEN = "Home & Kitchen › Kitchen & Dining › Kitchen Linens › Kitchen Towels"
TITLE_NOUNS = {"Cotton Kitchen Towel": ("cotton", "kitchen", "towel")}


@pytest.fixture(autouse=True)
def _pinned_nouns(monkeypatch: pytest.MonkeyPatch) -> None:
    pin_nouns(monkeypatch, TITLE_NOUNS)


def pin_nouns(monkeypatch: pytest.MonkeyPatch, table: dict[str, tuple[str, ...]]) -> None:
    known = {nouns_module.title_key(title): found for title, found in table.items()}
    monkeypatch.setattr(nouns_module, "_KNOWN", known)


def catalog_of(
    *,
    options: dict[str, list[str]] | None = None,
    bullets: list[str] | None = None,
    attributes: tuple[str, ...] = ("cotton",),
    asked: tuple[str, ...] = ("cotton",),
    human_options: list[str] | None = None,
) -> Catalog:
    """A one-product catalog in the official raw format, with a templated instruction (and a
    human one asking for ``human_options`` when given)."""
    record = {
        "asin": ASIN,
        "name": "Cotton Kitchen Towel",
        "full_description": "Soft towels. Paraben free dye.",
        "small_description": bullets if bullets is not None else ["Absorbent", "Machine washable"],
        "pricing": "$20.00",
        "customization_options": {
            name: [{"value": v} for v in values] for name, values in (options or {}).items()
        },
        "category": "garden",
        "query": "kitchen towels",
        "product_category": KITCHEN,
    }
    instruction = {
        "attributes": list(attributes),
        "instruction": "i need kitchen towels",
        "instruction_attributes": list(asked),
    }
    human = None
    if human_options is not None:
        human = {
            ASIN: [
                {
                    "instruction": "towels please",
                    "instruction_attributes": list(asked),
                    "instruction_options": human_options,
                }
            ]
        }
    return build_catalog([record], {ASIN: instruction}, human, source="official", origin="test")


def goal_with(catalog: Catalog, **shown: str) -> Goal:
    """The synthetic goal asking for the options ``shown`` (group -> value as the page shows it)."""
    return next(g for g in synthetic_goals(catalog) if g.options == tuple(shown[n] for n in sorted(shown)))


def score(
    catalog: Catalog, goal: Goal, chosen: dict[str, str], reward: str = "original", price: float = 20.0
):
    return score_purchase(catalog.products[0], price, chosen, goal, reward=reward)


# ----------------------------------------------------------------- options
def test_synthetic_goal_options_are_name_value_pairs():
    catalog = catalog_of(options={"Color": ["Dark Red", "Red"], "Size": ["Large", "X-Large"]})
    goal = goal_with(catalog, color="dark red", size="large")
    assert goal.scored_options == (("color", "dark red"), ("size", "large"))
    # Original: ("color", "dark red") has no element equal to a colour, so it stays a pair and is
    # scored as "('color', 'dark red')" -> words {color, dark, red}; the chosen "red" stays "red",
    # whose only word is among them: token_set_ratio 100. ("size", "large") vs "large": 100.
    # (1 attribute + 2 options + price) / (1 + 2 + 1) * r_type 1 (same query).
    bought_red = score(catalog, goal, {"color": "red", "size": "large"})
    assert bought_red.score == 1.0 and bought_red.r_option == 1.0
    # Corrected: the goal's "dark red" normalises to "dark" (before "red" in the colour list), the
    # chosen "red" to "red": ratio 29, and "red" is not in the product's text; "large" == "large".
    corrected = score(catalog, goal, {"color": "red", "size": "large"}, "corrected")
    assert corrected.r_option == 0.5 and corrected.score == (1 + 1 + 1) / (1 + 2 + 1)


def test_an_option_with_a_non_breaking_space_never_matches_in_the_original():
    catalog = catalog_of(options={"Size": ["10\xa0oz", "20 oz"]})
    product = catalog.products[0]
    assert product.options["size"] == ("10 oz", "20 oz") and product.source.options["size"][0] == "10\xa0oz"
    goal = goal_with(catalog, size="10 oz")
    assert goal.scored_options == (("size", "10\xa0oz"),)
    # The chosen "10\xa0oz" loses the character ("10oz"); the pair's str() escapes it:
    # "('size', '10\\xa0oz')" -> words {size, 10, xa0oz}: no shared word, ratio 47.
    # (1 attribute + 0 options + price) / (1 + 1 + 1).
    bought_as_asked = score(catalog, goal, {"size": "10 oz"})
    assert bought_as_asked.r_option == 0.0 and bought_as_asked.score == 2 / 3
    assert score(catalog, goal, {"size": "10 oz"}, "corrected").score == 1.0


def test_human_goal_options_are_plain_values_without_a_size_rule_or_cap():
    catalog = catalog_of(
        options={"Color": ["Navy Blue", "Blue"], "Size": ["Large", "X-Large"]},
        human_options=["blue", "navy blue", "large"],
    )
    (goal,) = human_goals(catalog)
    assert goal.scored_options == ("blue", "navy blue", "large")
    # Chosen "navy blue" normalises to "blue", and so do both goal values: each goal option counts
    # once, so one chosen value matches two of them. "x-large" -> words {x, large} contain "large":
    # token_set_ratio 100 (no exact rule for sizes). 3 of 3; (1 + 3 + 1) / (1 + 3 + 1).
    original = score(catalog, goal, {"color": "navy blue", "size": "x-large"})
    assert original.r_option == 1.0 and original.score == 1.0
    # Corrected loops over the two chosen values: "blue" matches, "x-large" is not "large" exactly.
    corrected = score(catalog, goal, {"color": "navy blue", "size": "x-large"}, "corrected")
    assert corrected.r_option == 1 / 3 and corrected.score == (1 + 1 + 1) / (1 + 3 + 1)


def test_options_get_no_fallback_to_the_product_text_in_the_original():
    catalog = catalog_of(options={"Color": ["White", "Absorbent"]})
    goal = goal_with(catalog, color="white")
    # "absorbent" is in the bullet points, but only the corrected variant looks there.
    assert score(catalog, goal, {"color": "absorbent"}).r_option == 0.0
    assert score(catalog, goal, {"color": "absorbent"}, "corrected").r_option == 1.0


_TEXT = st.text(alphabet="ab c-1|\xa0é'\"/字", max_size=12)


@given(st.one_of(_TEXT, st.tuples(_TEXT, _TEXT)), st.one_of(_TEXT, st.tuples(_TEXT, _TEXT)))
def test_cached_fuzzy_ratio_is_thefuzz(a, b):
    assert token_set_ratio(a, b) == fuzz.token_set_ratio(a, b)


def test_normalize_colour_tests_membership_on_a_pair_and_substrings_on_a_string():
    assert normalize_colour("jet black") == "black" and normalize_colour("navy blue") == "blue"
    assert normalize_colour("dark red") == "dark"  # the first colour of the original's list
    assert normalize_colour(("color", "black")) == "black"  # an element is a colour
    assert normalize_colour(("color", "jet black")) == ("color", "jet black")  # none is
    assert normalize_colour("mystery") == "mystery"


# ----------------------------------------------------------------- attributes and price
def test_attributes_read_the_text_as_the_original_keeps_it():
    catalog = catalog_of(
        bullets=["Long\xa0lasting scent", "Tea  tree oil"], asked=("long lasting", "tea tree oil")
    )
    (goal,) = synthetic_goals(catalog)
    # Neither phrase is a fuzzy match of the attribute "cotton"; the bullet points joined and
    # lower-cased are "long\xa0lasting scent tea  tree oil": neither phrase occurs literally.
    # (0 + 0 options + price) / (2 + 0 + 1).
    assert score(catalog, goal, {}).score == 1 / 3
    # As shown (whitespace collapsed) both occur.
    assert score(catalog, goal, {}, "corrected").score == 1.0


def test_attribute_matches_fuzzily_or_in_the_title_bullets_or_description():
    catalog = catalog_of(
        attributes=("tea tree oil",), asked=("tea tree", "paraben free", "washable", "long lasting")
    )
    (goal,) = synthetic_goals(catalog)
    # "tea tree" vs "tea tree oil": one side's words contain the other's, 100. "paraben free" is
    # in the description, "washable" in the bullet points, "long lasting" nowhere: 3 of 4.
    details = score(catalog, goal, {})
    assert details.r_attribute == 3 / 4 and details.score == (3 + 0 + 1) / (4 + 0 + 1)


def test_price_is_ok_up_to_the_cap():
    catalog = catalog_of()
    goal = dataclasses.replace(synthetic_goals(catalog)[0], price_upper=30.0)
    assert score(catalog, goal, {}, price=30.0).r_price and score(catalog, goal, {}, price=30.0).score == 1.0
    over = score(catalog, goal, {}, price=30.01)
    assert not over.r_price and over.score == (1 + 0 + 0) / (1 + 0 + 1)


# ----------------------------------------------------------------- product type
LONG = tuple(f"noun{i}" for i in range(12))


@pytest.mark.parametrize(
    ("bought", "wanted", "same_query", "r_type"),
    [
        (("noun0", "x"), ("noun0", "noun1", "noun2"), False, 1.0),  # 1/3 > 20%
        (("noun0", "noun1"), LONG, False, 0.5),  # 2/12 = 17%: no match
        (("noun0", "noun1"), LONG, True, 1.0),  # ... unless the query agrees
        (("noun0",), LONG, True, 0.1),  # 1/12 = 8% < 10% overrides the query
        (("x",), LONG, True, 0.0),  # no shared noun
        (("towel",), ("towel",) * 9 + ("kitchen",), False, 0.5),  # repeats count: 1/10, not 1/2
        (("x",), (), False, 0.5),  # no goal noun: title score 0.2, not above 20%
    ],
)
def test_type_reward_thresholds(monkeypatch, bought, wanted, same_query, r_type):
    pin_nouns(monkeypatch, {"Bought Title": bought, "Goal Title": wanted})
    catalog = catalog_of()
    product = dataclasses.replace(
        catalog.products[0],
        source=dataclasses.replace(catalog.products[0].source, title="Bought Title"),
        query="kitchen towels" if same_query else "other",
        product_category="A › B › C",
    )
    goal = dataclasses.replace(synthetic_goals(catalog)[0], name="Goal Title")
    details = score_purchase(product, 20.0, {}, goal)
    assert details.r_type == r_type and details.score == r_type  # attribute and price match


def test_two_shared_category_levels_are_a_type_match_and_the_final_product_keeps_the_original_order(
    monkeypatch,
):
    pin_nouns(monkeypatch, {"Bought Title": ("noun0", "noun1"), "Goal Title": LONG})
    catalog = catalog_of(options={"Color": ["Red", "Blue"], "Size": ["S", "M"]}, asked=("x1", "x2"))
    goal = dataclasses.replace(goal_with(catalog, color="red", size="s"), name="Goal Title")
    product = dataclasses.replace(
        catalog.products[0],
        source=dataclasses.replace(catalog.products[0].source, title="Bought Title"),
        query="other",
        product_category="Home & Kitchen › Bath › Kitchen & Dining",
    )
    assert score_purchase(product, 20.0, {}, goal).r_type == 1.0  # 2 levels shared, 2/12 nouns
    pin_nouns(monkeypatch, {"Bought Title": ("noun0",), "Goal Title": LONG})
    details = score_purchase(product, 20.0, {}, goal)
    # Nothing matches but the price: 1 / (2 + 2 + 1), times r_type 0.1 (1/12 nouns). In floats
    # 1 / 5 * 0.1 is 0.020000000000000004, while 1 * 0.1 / 5 would be 0.02.
    assert details.r_type == 0.1 and details.score == 0.020000000000000004


# ----------------------------------------------------------------- choosing the variant
def test_the_env_scores_by_the_original_unless_asked_otherwise():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GeneratedCatalogWarning)
        assert gym.make("HGPO-WebShop-v0", data_path="generated").unwrapped.reward == "original"
        assert (
            gym.make("HGPO-WebShop-v0", data_path="generated", reward="corrected").unwrapped.reward
            == "corrected"
        )
        with pytest.raises(ValueError, match="reward must be one of"):
            gym.make("HGPO-WebShop-v0", data_path="generated", reward="strict")


def test_tagging_a_title_without_a_table_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "spacy", None)  # spaCy not installed
    nouns_module.spacy_pipeline.cache_clear()
    try:
        with pytest.raises(ImportError, match=r"webshop-nouns"):
            nouns_module.nouns("A Title No Table Has")
    finally:
        nouns_module.spacy_pipeline.cache_clear()
