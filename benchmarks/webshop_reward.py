"""WebShop purchase scoring: the original reward (default) and the corrected variant.

    python benchmarks/webshop_reward.py [--rounds 3]

For every synthetic goal it scores two purchases: the goal product as asked, and a random product
with random options. The baseline is the original reward calling thefuzz's ``token_set_ratio``
for every comparison, as the original code does (and this project did before it cached each
string's processing). Reports microseconds per purchase (best of the rounds) and ratios. Runs on
WebShop's small setting when its files are found, else on the generated catalog.
"""

from __future__ import annotations

import argparse
import random
import time
import warnings

from thefuzz import fuzz
from webshop_common import data_path

from hgpo_env.envs.webshop import load_catalog, reward, score_purchase, shuffled_goals
from hgpo_env.envs.webshop.nouns import learn_catalog
from hgpo_env.envs.webshop.sources import GeneratedCatalogWarning


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GeneratedCatalogWarning)
        catalog = load_catalog(data_path())
    learn_catalog(catalog)
    rng = random.Random(0)
    purchases = []
    for goal in shuffled_goals(catalog):
        index = catalog.index_of[goal.asin]
        product = catalog.products[index]
        purchases.append(
            (product, catalog.prices[index], dict(zip(sorted(product.options), goal.options)), goal)
        )
        other = rng.randrange(len(catalog))
        options = {g: rng.choice(v) for g, v in catalog.products[other].options.items()}
        purchases.append((catalog.products[other], catalog.prices[other], options, goal))
    cached = reward.token_set_ratio
    variants = {
        "baseline: original, thefuzz per comparison": ("original", fuzz.token_set_ratio),
        "original": ("original", cached),
        "corrected": ("corrected", cached),
    }
    best: dict[str, float] = {}
    for _ in range(args.rounds):
        for name, (variant, ratio) in variants.items():
            reward.token_set_ratio = ratio
            start = time.perf_counter()
            for product, price, chosen, goal in purchases:
                score_purchase(product, price, chosen, goal, reward=variant)
            elapsed = (time.perf_counter() - start) / len(purchases) * 1e6
            best[name] = min(best.get(name, elapsed), elapsed)
    reward.token_set_ratio = cached
    baseline = next(iter(best.values()))
    print(f"{len(purchases)} purchases on the {catalog.source} catalog, best of {args.rounds} rounds")
    for name, micros in best.items():
        print(f"  {name:44s} {micros:6.1f} us per purchase  ({baseline / micros:.2f}x the baseline's speed)")


if __name__ == "__main__":
    main()
