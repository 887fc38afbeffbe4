"""Product search: BM25 with the settings of the original's Lucene index (via pyserini).

The original indexes, per product, the lower-cased title, description, first bullet point and
option text, and searches it with Lucene's BM25 (k1 0.9, b 0.4) behind Lucene's English
analyzer: word tokens, possessive ``'s`` removed, Lucene's 33 English stop words dropped, Porter
stemming. Here bm25s scores (its ``lucene`` variant, the same IDF and length normalisation) and
PyStemmer stems with the original Porter algorithm. Documents that match no query term are not
results; equal scores keep catalog order, as Lucene keeps document order.

One index is built per catalog and process and shared by every env in it; it is also saved under
``data_home()/webshop/index`` so later processes load it instead of building it.
"""

from __future__ import annotations

import re
import warnings
from collections import OrderedDict
from pathlib import Path

import bm25s
import numpy as np
import Stemmer

from hgpo_env.envs.webshop.catalog import Catalog
from hgpo_env.envs.webshop.diskcache import cache_path, prune, store, touch

K1 = 0.9
B = 0.4
RESULTS = 50
"""How many results a search returns (the original's SEARCH_RETURN_N)."""
INDEX_FORMAT = 1
"""Bump when tokenisation or scoring changes, so stale disk caches are not loaded."""

LUCENE_ENGLISH_STOP_WORDS = frozenset(
    [
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "but",
        "by",
        "for",
        "if",
        "in",
        "into",
        "is",
        "it",
        "no",
        "not",
        "of",
        "on",
        "or",
        "such",
        "that",
        "the",
        "their",
        "then",
        "there",
        "these",
        "they",
        "this",
        "to",
        "was",
        "will",
        "with",
    ]
)
_WORD = re.compile(r"\w+(?:[.,'’]\w+)*")
_STEMMER = Stemmer.Stemmer("porter")


def analyze(text: str) -> list[str]:
    """Index terms of ``text`` as Lucene's English analyzer makes them."""
    words = []
    for word in _WORD.findall(text.lower()):
        if word.endswith(("'s", "’s")):
            word = word[:-2]
        if word and word not in LUCENE_ENGLISH_STOP_WORDS:
            words.append(word)
    return _STEMMER.stemWords(words)


class SearchEngine:
    """BM25 over a catalog's products; ``search`` returns product indices, best first."""

    def __init__(self, index: bm25s.BM25) -> None:
        self._index = index

    @classmethod
    def build(cls, documents: list[str]) -> SearchEngine:
        index = bm25s.BM25(k1=K1, b=B, method="lucene")
        index.index([analyze(doc) for doc in documents], show_progress=False)
        return cls(index)

    def search(self, query: str, k: int = RESULTS) -> list[int]:
        terms = analyze(query)
        if not terms:
            return []
        scores = self._index.get_scores(terms)
        floor = 0.0
        if len(scores) > k:  # everything tied with the k-th best is a candidate; then order exactly
            floor = max(floor, float(np.partition(scores, len(scores) - k)[len(scores) - k]))
        hits = np.flatnonzero(scores >= floor) if floor > 0 else np.flatnonzero(scores > 0)
        order = np.lexsort((hits, -scores[hits]))
        return hits[order][:k].tolist()

    def save(self, folder: Path) -> None:
        self._index.save(str(folder), show_progress=False)

    @classmethod
    def load(cls, folder: Path) -> SearchEngine:
        return cls(bm25s.BM25.load(str(folder), show_progress=False, verbosity=0))


MAX_ENGINES = 4
"""Search engines a process keeps in memory (the least recently used goes first)."""
MAX_DISK_INDEXES = 16
"""Search indexes kept on disk, least recently used dropped first..."""
MAX_DISK_INDEX_BYTES = 4 * 2**30
"""...and at most this many bytes of them (the full 1.18M-product catalog's index is about 1 GiB)."""


def _load_or_build(catalog: Catalog) -> SearchEngine:
    stop_words = " ".join(sorted(LUCENE_ENGLISH_STOP_WORDS))
    folder = cache_path("index", catalog.key, f"v{INDEX_FORMAT}", f"k1={K1}", f"b={B}", "porter", stop_words)
    if folder.is_dir():
        try:
            engine = SearchEngine.load(folder)
            touch(folder)
            return engine
        except (OSError, ValueError, KeyError) as error:
            warnings.warn(f"ignoring unreadable WebShop index cache {folder}: {error}", stacklevel=3)
    engine = SearchEngine.build([p.search_document() for p in catalog.products])
    store(folder, engine.save)
    prune("index", MAX_DISK_INDEXES, MAX_DISK_INDEX_BYTES, keep=folder)
    return engine


_ENGINES: OrderedDict[str, SearchEngine] = OrderedDict()


def engine_for(catalog: Catalog) -> SearchEngine:
    """The search engine of ``catalog``: built or loaded once, then shared; a process keeps the
    :data:`MAX_ENGINES` used last."""
    engine = _ENGINES.get(catalog.key)
    if engine is None:
        engine = _ENGINES[catalog.key] = _load_or_build(catalog)
        while len(_ENGINES) > MAX_ENGINES:
            _ENGINES.popitem(last=False)
    _ENGINES.move_to_end(catalog.key)
    return engine
