"""Score purchases with the original WebShop code and with ours, and report every difference.

Needs a checkout of princeton-nlp/WebShop (its code is imported from there, never copied), the
small catalog files, and the ``webshop`` and ``webshop-nouns`` extras::

    python scripts/check_webshop_reward.py --webshop ~/src/WebShop --data ../shared/data/webshop

For every synthetic goal it buys: the goal product as asked (perfect), the goal product with other
options, a product of the same query or category, and a random product, the last three with
random options and one in five over the price cap. The original's products and goals come from its own
``load_products`` and ``get_synthetic_goals`` (its unseeded price caps replaced by ours), its
score from ``get_reward(..., verbose=True)``. It also checks that both shuffle the goals alike.
Exits non-zero on any difference.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import types
from collections import Counter
from pathlib import Path
from typing import Any

from hgpo_env.envs.webshop import score_purchase, shuffled_goals
from hgpo_env.envs.webshop.catalog import Catalog, Product
from hgpo_env.envs.webshop.goals import Goal
from hgpo_env.envs.webshop.nouns import MODELS
from hgpo_env.envs.webshop.sources import SMALL, find_files, load_official

UNUSED_BY_THE_REWARD = (
    "flask",
    "pyserini",
    "pyserini.search",
    "pyserini.search.lucene",
    "rank_bm25",
    "cleantext",
)
"""Imported by the original engine module for its web server and search, never by scoring."""


class _Stub(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        return None


def import_original(checkout: Path, data: Path, human_file: Path | None) -> tuple[Any, Any]:
    """The original ``engine`` and ``goal`` modules, with their data paths pointed at ``data``."""
    import spacy

    load = spacy.load
    installed = next(name for name in MODELS if spacy.util.is_package(name))
    spacy.load = lambda name, *args, **kwargs: load(
        installed if name == "en_core_web_sm" else name, *args, **kwargs
    )
    for name in UNUSED_BY_THE_REWARD:
        sys.modules.setdefault(name, _Stub(name))
    sys.path.insert(0, str(checkout))
    from web_agent_site import utils

    utils.DEFAULT_FILE_PATH = str(data / "items_shuffle_1000.json")
    utils.DEFAULT_ATTR_PATH = str(data / "items_ins_v2_1000.json")
    utils.HUMAN_ATTR_PATH = str(human_file or data / "items_ins_v2_1000.json")
    from web_agent_site.engine import engine, goal

    return engine, goal


def as_original_pricing(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The shared catalog lists prices as numbers; the original parses its ``"$12.99 - $20.0"`` text."""
    for record in records:
        if isinstance(record.get("pricing"), list):
            record["pricing"] = " - ".join(f"${price}" for price in record["pricing"])
    return records


def option_key(options: Any) -> tuple:
    return tuple(sorted(options.items()))


def purchases(
    catalog: Catalog, goal: Goal, rng: random.Random
) -> list[tuple[str, int, dict[str, str], float]]:
    """``(kind, product index, chosen options as shown, price)`` bought for ``goal``."""
    target = catalog.index_of[goal.asin]
    same = [
        i
        for i, p in enumerate(catalog.products)
        if i != target and (p.query == goal.query or p.category == goal.category)
    ]
    picks = [
        ("perfect", target, dict(zip(sorted(catalog.products[target].options), goal.options))),
        ("other options", target, None),
        ("same query or category", rng.choice(same) if same else rng.randrange(len(catalog)), None),
        ("random product", rng.randrange(len(catalog)), None),
    ]
    bought = []
    for kind, index, chosen in picks:
        product: Product = catalog.products[index]
        if chosen is None:
            chosen = {g: rng.choice(values) for g, values in product.options.items() if rng.random() < 0.8}
        over_cap = kind != "perfect" and rng.random() < 0.2
        price = goal.price_upper + rng.uniform(0.01, 50) if over_cap else catalog.prices[index]
        bought.append((kind, index, chosen, price))
    return bought


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--webshop", type=Path, required=True, help="a checkout of princeton-nlp/WebShop")
    parser.add_argument("--data", type=Path, required=True, help="folder with the small catalog files")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    found = find_files(args.data, SMALL)
    if found is None:
        parser.error(f"{args.data} lacks WebShop's small catalog files")
    catalog = load_official(*found, SMALL)
    engine, original = import_original(args.webshop, args.data, found[2])
    with tempfile.TemporaryDirectory() as folder:
        products_file = Path(folder) / found[0].name
        products_file.write_text(json.dumps(as_original_pricing(json.loads(found[0].read_text("utf-8")))))
        products = engine.load_products(str(products_file), SMALL, human_goals=False)[0]
    by_asin = {p["asin"]: p for p in products}
    prices = {p.asin: price for p, price in zip(catalog.products, catalog.prices)}
    their_goals = original.get_synthetic_goals(products, prices)
    random.Random(233).shuffle(their_goals)  # what the original text env does with the global RNG
    ours = shuffled_goals(catalog)
    if [(g["asin"], option_key(g["goal_options"])) for g in their_goals] != [
        (g.asin, tuple(sorted(g.scored_options))) for g in ours
    ]:
        print("goal order differs from the original's")
        return 1
    rng = random.Random(args.seed)
    counts, differences = Counter(), []
    for goal, theirs in zip(ours, their_goals):
        theirs = {**theirs, "price_upper": goal.price_upper}
        for kind, index, chosen, price in purchases(catalog, goal, rng):
            product = catalog.products[index]
            source_options = {g: product.source_option(g, v) for g, v in chosen.items()}
            expected, info = original.get_reward(
                by_asin[product.asin], theirs, price=price, options=source_options, verbose=True
            )
            got = score_purchase(product, price, chosen, goal)
            mine = (got.score, got.r_type, got.r_attribute, got.r_option, got.r_price, got.title_score)
            want = (
                expected,
                info["r_type"],
                info["r_att"],
                info.get("r_option"),
                info["r_price"],
                info["title_score"],
            )
            counts[kind] += 1
            counts["below 1 (perfect)"] += kind == "perfect" and expected < 1
            if mine != want:
                differences.append((kind, goal.asin, product.asin, chosen, price, mine, want))
    for row in differences[:20]:
        print("DIFFERS", *row)
    print(
        f"{sum(counts[k] for k in counts if 'below' not in k)} purchases over {len(ours)} goals: {dict(counts)}"
    )
    print(
        f"{len(differences)} differ from the original (score, r_type, r_att, r_option, r_price, title_score)"
    )
    return 1 if differences else 0


if __name__ == "__main__":
    sys.exit(main())
