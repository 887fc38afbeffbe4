"""Rebuild the shipped WebShop title-noun table (``hgpo_env/envs/webshop/title_nouns.json``).

It covers the titles of WebShop's 1000-product catalog (read from ``--data``, never shipped) and
of the project's generated catalog (seed 0, 1000 products), tagged with en_core_web_sm as the
original reward tags them. Needs the ``webshop-nouns`` extra::

    python scripts/build_webshop_nouns.py --data ../shared/data/webshop
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import spacy

from hgpo_env.envs.webshop import nouns
from hgpo_env.envs.webshop.generated import generate_catalog
from hgpo_env.envs.webshop.sources import SMALL, find_files, load_official

TABLE = Path(nouns.__file__).with_name(nouns.SHIPPED_TABLE)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, required=True, help="folder with items_shuffle_1000.json")
    args = parser.parse_args()
    found = find_files(args.data, SMALL)
    if found is None:
        parser.error(f"{args.data} lacks WebShop's small catalog files")
    catalogs = [load_official(*found, SMALL), generate_catalog(SMALL)]
    titles = sorted({product.source.title for catalog in catalogs for product in catalog.products})
    pipeline = nouns.spacy_pipeline()
    meta = pipeline.meta
    tagger = f"{meta['lang']}_{meta['name']} {meta['version']}, spaCy {spacy.__version__}"
    rows = [
        f"{json.dumps(key)}: {json.dumps(found)}" for key, found in sorted(nouns.tag_table(titles).items())
    ]
    body = ",\n".join(rows)  # one title a line, so a rebuild diffs readably
    TABLE.write_text(f'{{"tagger": {json.dumps(tagger)}, "nouns": {{\n{body}\n}}}}\n', encoding="utf-8")
    print(f"{len(titles)} titles -> {TABLE}")


if __name__ == "__main__":
    main()
