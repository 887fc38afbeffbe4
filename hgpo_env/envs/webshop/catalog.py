"""The product catalog: raw WebShop product records processed the way the original engine does.

The official files are ``items_shuffle*.json`` (a list of scraped products), ``items_ins_v2*.json``
(asin -> attributes, plus a templated instruction for some products) and optionally
``items_human_ins*.json`` (asin -> human-written instructions). :func:`build_catalog` turns such
records into :class:`Product` objects: title, description, bullet points, a price range and its
price tag, lower-cased options, attributes, category, query and category path. Each product also
gets one sampled price (uniform within its range), seeded by its asin so every process agrees.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import xxhash

DEFAULT_PRICE = 100.0
MISSING_ATTRIBUTE = "DUMMY_ATTR"
"""The original's placeholder attribute for products without any."""


@dataclass(frozen=True, slots=True)
class SourceText:
    """A product's text as the original engine keeps it, whitespace and non-breaking spaces included.

    The pages show :class:`Product`'s cleaned text; the original reward (:mod:`.reward`) reads
    this, because its substring and fuzzy tests see exactly these characters.
    """

    title: str
    bullet_points: str
    """The bullet points joined by one space and lower-cased, as the original's attribute test reads them."""
    description: str
    """Lower-cased, as the original's attribute test reads it."""
    options: Mapping[str, tuple[str, ...]]
    """Group -> values, parallel to :attr:`Product.options`: stripped, lower case, ``/`` as `` | ``."""


@dataclass(frozen=True, slots=True)
class Product:
    """One product as the shop shows it and the reward reads it."""

    asin: str
    title: str
    description: str
    bullet_points: tuple[str, ...]
    pricing: tuple[float, ...]
    """One price, or the low and high end of a range."""
    price_tag: str
    """The price as the pages show it: ``$12.5`` or ``$12.5 to $20.0``."""
    options: Mapping[str, tuple[str, ...]]
    """Option group (lower case) -> values (lower case, ``/`` shown as `` | ``), in page order."""
    attributes: tuple[str, ...]
    category: str
    query: str
    """The search that found the product when the catalog was scraped (lower case, stripped)."""
    product_category: str
    """Category path, ``›``-separated, as the original keeps it."""
    rating: str
    source: SourceText

    def source_option(self, group: str, value: str) -> str:
        """The original's text of the option ``value`` (as shown) of ``group``."""
        return self.source.options[group][self.options[group].index(value)]

    def search_document(self) -> str:
        """The text the search index holds: what the original put in its Lucene documents."""
        option_text = ", and ".join(f"{name}: {', '.join(values)}" for name, values in self.options.items())
        first_bullet = self.bullet_points[0] if self.bullet_points else ""
        return f"{self.title} {self.description} {first_bullet} {option_text}".lower()


@dataclass(frozen=True, slots=True)
class Instruction:
    """A goal template attached to a product: the text and the attributes it asks for."""

    text: str
    attributes: tuple[str, ...]
    options: tuple[str, ...] = ()
    """Option values a human instruction asks for (synthetic goals take every combination)."""


@dataclass(frozen=True, eq=False)
class Catalog:
    """Products in file order, their sampled prices and the instructions goals are made from.

    Compared and hashed by identity: catalogs are loaded once per process and cached.
    """

    products: tuple[Product, ...]
    prices: tuple[float, ...]
    synthetic_instructions: Mapping[str, Instruction]
    human_instructions: Mapping[str, tuple[Instruction, ...]]
    source: str
    """``"official"`` for WebShop's files, ``"generated"`` for the project's own catalog."""
    origin: str
    """Where it came from (a folder, or the generator's settings), for messages."""
    key: str = field(init=False)
    """Digest of the searchable content; keys the search index caches."""
    index_of: Mapping[str, int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        digest = xxhash.xxh3_128()
        for product in self.products:
            digest.update(product.asin.encode())
            digest.update(product.search_document().encode("utf-8", "surrogatepass"))
        object.__setattr__(self, "key", digest.hexdigest())
        object.__setattr__(self, "index_of", {p.asin: i for i, p in enumerate(self.products)})

    def __len__(self) -> int:
        return len(self.products)


def _clean(text: Any) -> str:
    """Collapse whitespace: page text is shown one line per field."""
    return " ".join(str(text).split()) if text else ""


def parse_pricing(raw: Any) -> tuple[float, ...]:
    """Prices from a raw record: a list of numbers, or the original's ``"$12.99 - $20.00"`` text.

    Like the original, an empty price becomes $100 and only the first two values are kept.
    """
    if isinstance(raw, str):
        values = [float(re.sub(r"[^\d.]", "", part)) for part in raw.split("$")[1:] if re.search(r"\d", part)]
    elif isinstance(raw, Sequence):
        values = [float(v) for v in raw]
    else:
        values = []
    return tuple(values[:2]) if values else (DEFAULT_PRICE,)


def price_tag(pricing: Sequence[float]) -> str:
    return f"${pricing[0]}" if len(pricing) == 1 else f"${pricing[0]} to ${pricing[1]}"


def sample_price(asin: str, pricing: Sequence[float]) -> float:
    """The price a purchase is charged: the single price, or uniform in the range (seeded by asin)."""
    if len(pricing) == 1:
        return pricing[0]
    return random.Random(f"price:{asin}").uniform(pricing[0], pricing[1])


def parse_options(raw: Any) -> tuple[dict[str, tuple[str, ...]], dict[str, tuple[str, ...]]]:
    """Option groups from ``customization_options`` (empty groups, ``null``, are dropped), twice:
    as shown, values whitespace-collapsed so they read and click the same as they are typed (some
    hold non-breaking spaces), and as the original keeps them. Group names are lower-cased only,
    as in the original, since goals enumerate them in sorted order."""
    if not isinstance(raw, Mapping):
        return {}, {}
    shown, source = {}, {}
    for name, contents in raw.items():
        if contents is None:
            continue
        values = tuple(c["value"].strip().replace("/", " | ").lower() for c in contents)
        shown[name.lower()] = tuple(_clean(v) for v in values)
        source[name.lower()] = values
    return shown, source


def _product(record: Mapping[str, Any], attributes: Mapping[str, Any]) -> Product:
    bullets = record.get("small_description") or []
    if isinstance(bullets, str):
        bullets = [bullets]
    pricing = parse_pricing(record.get("pricing"))
    rating = record.get("average_rating")
    options, source_options = parse_options(record.get("customization_options"))
    return Product(
        asin=record["asin"],
        title=_clean(record.get("name")),
        description=_clean(record.get("full_description")),
        bullet_points=tuple(_clean(b) for b in bullets if _clean(b)),
        pricing=pricing,
        price_tag=price_tag(pricing),
        options=options,
        attributes=tuple(attributes.get("attributes") or ()) or (MISSING_ATTRIBUTE,),
        category=_clean(record.get("category")),
        query=str(record.get("query") or "").lower().strip(),
        product_category=str(record.get("product_category") or ""),
        rating=str(rating) if rating not in (None, "") else "N.A.",
        source=SourceText(
            title=str(record.get("name") or ""),
            bullet_points=" ".join(str(b) for b in bullets).lower(),
            description=str(record.get("full_description") or "").lower(),
            options=source_options,
        ),
    )


def build_catalog(
    records: Iterable[Mapping[str, Any]],
    attributes: Mapping[str, Mapping[str, Any]],
    human: Mapping[str, Sequence[Mapping[str, Any]]] | None,
    *,
    source: str,
    origin: str,
    num_products: int | None = None,
) -> Catalog:
    """Process raw records as the original engine does.

    ``num_products`` keeps the first N records (the official files are pre-shuffled); records with
    an asin of ``"nan"`` or longer than 10 characters, and repeated asins, are skipped.
    """
    records = list(records)
    if num_products is not None:
        records = records[:num_products]
    products: list[Product] = []
    seen: set[str] = set()
    synthetic: dict[str, Instruction] = {}
    humans: dict[str, tuple[Instruction, ...]] = {}
    for record in records:
        asin = record.get("asin")
        if not isinstance(asin, str) or asin == "nan" or len(asin) > 10 or asin in seen:
            continue
        seen.add(asin)
        product_attributes = attributes.get(asin, {})
        products.append(_product(record, product_attributes))
        if product_attributes.get("instruction"):
            synthetic[asin] = Instruction(
                product_attributes["instruction"],
                tuple(product_attributes.get("instruction_attributes") or ()),
            )
        if human and asin in human:
            humans[asin] = tuple(
                Instruction(
                    h["instruction"],
                    tuple(h.get("instruction_attributes") or ()),
                    tuple(h.get("instruction_options") or ()),
                )
                for h in human[asin]
            )
    if not products:
        raise ValueError(f"no usable products in {origin}")
    prices = tuple(sample_price(p.asin, p.pricing) for p in products)
    return Catalog(tuple(products), prices, synthetic, humans, source, origin)


def _read_json(path: Path) -> Any:
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def load_official(
    products_file: Path, attributes_file: Path, human_file: Path | None, num_products: int | None
) -> Catalog:
    """Read the official files (or files in their format) into a catalog."""
    records = _read_json(products_file)
    attributes = _read_json(attributes_file)
    human = _read_json(human_file) if human_file is not None else None
    if not isinstance(records, list) or not isinstance(attributes, dict):
        raise TypeError(
            f"{products_file} must hold a list of products and {attributes_file} an object keyed by asin"
        )
    return build_catalog(
        records,
        attributes,
        human,
        source="official",
        origin=str(products_file.parent),
        num_products=num_products,
    )
