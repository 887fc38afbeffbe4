"""WebShop search latency at 1k and 100k products.

    python benchmarks/webshop_search.py [--queries 500] [--large 100000]

The 1k catalog is WebShop's small setting when its files are found (``../shared/data/webshop``,
``$WEBSHOP_DATA`` or the data home), else the generated one; the large catalog is generated.
Queries are goal instructions without the price clause, as an agent types them. Index build
and load times are reported too (the index is cached on disk under the data home; pass
``--no-disk-cache`` to time a cold build into a temporary folder).
"""

from __future__ import annotations

import os
import tempfile
import time
import warnings

from command_line import options
from webshop_common import data_path, median_p95

from hgpo_env.envs.webshop import Catalog, generate_catalog, load_catalog, shuffled_goals
from hgpo_env.envs.webshop import search as search_module
from hgpo_env.envs.webshop.sources import GeneratedCatalogWarning


def measure(name: str, catalog: Catalog, num_queries: int) -> None:
    started = time.perf_counter()
    engine = search_module.engine_for(catalog)
    ready = time.perf_counter() - started
    queries = [goal.search_text for goal in shuffled_goals(catalog)[:num_queries]]
    for query in queries[:20]:  # warm-up
        engine.search(query)
    times = []
    for query in queries:
        start = time.perf_counter()
        engine.search(query)
        times.append(time.perf_counter() - start)
    median, p95 = median_p95(times)
    print(
        f"{name:<34} products {len(catalog):>7}  index ready {ready:6.2f} s  "
        f"search median {median * 1e3:6.3f} ms  p95 {p95 * 1e3:6.3f} ms  ({len(times)} queries)"
    )


def main() -> None:
    args = options(
        __doc__,
        queries=500,
        large=(100_000, "products in the generated large catalog"),
        no_disk_cache=(False, "build indexes in a fresh temporary data home"),
    )
    if args.no_disk_cache:
        os.environ["HGPO_DATA"] = tempfile.mkdtemp(prefix="hgpo-bench-")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GeneratedCatalogWarning)
        small = load_catalog(data_path())
    measure(f"1k ({small.source})", small, args.queries)
    started = time.perf_counter()
    large = generate_catalog(args.large)
    print(f"(generated {args.large} products in {time.perf_counter() - started:.1f} s)")
    measure(f"{args.large // 1000}k (generated)", large, args.queries)


if __name__ == "__main__":
    main()
