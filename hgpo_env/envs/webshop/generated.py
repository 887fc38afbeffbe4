"""The project's own generated catalog: WebShop-shaped products and instructions, no download needed.

Everything here is invented by this module (brands are random syllables, texts come from small
templates) and is a pure function of ``(num_products, seed)``. It exists so the env, its tests
and its benchmarks run offline and at any scale; it is **not** the WebShop benchmark, and envs
built on it say so (``info["data_source"] == "generated"`` and a warning).

The records use the raw format of the official files, so they go through the same processing
(:func:`~hgpo_env.envs.webshop.catalog.build_catalog`) as the real data.
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass
from typing import Any

from hgpo_env.envs.webshop.catalog import Catalog, build_catalog

INSTRUCTION_SHARE = 0.6
"""Fraction of products with a templated instruction: with their option combinations, about as
many goals as the official small setting (415 of 1000 products, 6910 goals)."""


@dataclass(frozen=True)
class ProductType:
    """A kind of product: its search query, category path, title nouns, attributes and options."""

    query: str
    path: str
    nouns: tuple[str, ...]
    attributes: tuple[str, ...]
    options: tuple[tuple[str, tuple[str, ...]], ...]


_COLOURS = ("black", "white", "navy blue", "red", "grey", "beige", "green", "pink", "brown", "silver")
_SIZES = ("x-small", "small", "medium", "large", "x-large", "xx-large")

TYPES: dict[str, tuple[ProductType, ...]] = {
    "beauty": (
        ProductType(
            "shampoo",
            "Beauty & Personal Care › Hair Care › Shampoo & Conditioner › Shampoos",
            ("Shampoo", "Hair Wash"),
            ("sulfate free", "paraben free", "natural ingredients", "dry hair", "argan oil", "cruelty free"),
            (
                ("size", ("8 fl oz", "16 fl oz", "33.8 fl oz")),
                ("scent", ("lavender", "coconut", "unscented")),
            ),
        ),
        ProductType(
            "face moisturizer",
            "Beauty & Personal Care › Skin Care › Face › Creams & Moisturizers",
            ("Face Cream", "Moisturizer"),
            (
                "hyaluronic acid",
                "sensitive skin",
                "fragrance free",
                "anti aging",
                "long lasting",
                "non greasy",
            ),
            (("size", ("1.7 ounce", "3.4 ounce")),),
        ),
        ProductType(
            "lipstick",
            "Beauty & Personal Care › Makeup › Lips › Lipstick",
            ("Lipstick", "Lip Color"),
            ("long lasting", "matte finish", "cruelty free", "vitamin e", "easy apply", "high quality"),
            (("color", ("ruby red", "nude", "coral pink", "plum", "mocha")),),
        ),
        ProductType(
            "body wash",
            "Beauty & Personal Care › Personal Care › Bath & Bathing Accessories › Body Washes",
            ("Body Wash", "Shower Gel"),
            ("tea tree", "essential oils", "natural ingredients", "dry skin", "paraben free", "travel size"),
            (("scent", ("eucalyptus", "citrus", "vanilla", "fresh")), ("size", ("12 fl oz", "24 fl oz"))),
        ),
    ),
    "electronics": (
        ProductType(
            "bluetooth speaker",
            "Electronics › Portable Audio & Video › Portable Speakers & Docks",
            ("Bluetooth Speaker", "Wireless Speaker"),
            (
                "water resistant",
                "long battery life",
                "stereo sound",
                "easy carry",
                "hands free",
                "fast charging",
            ),
            (("color", ("black", "blue", "red", "camo")),),
        ),
        ProductType(
            "usb c cable",
            "Electronics › Computers & Accessories › Cables › USB Cables",
            ("USB C Cable", "Charging Cord"),
            ("fast charging", "high speed", "nylon braided", "durable", "data transfer", "usb type c"),
            (("size", ("3 feet", "6 feet", "10 feet")), ("color", ("black", "white", "grey"))),
        ),
        ProductType(
            "wireless earbuds",
            "Electronics › Headphones, Earbuds & Accessories › Earbud Headphones",
            ("Earbuds", "Headphones"),
            (
                "noise cancelling",
                "hands free",
                "water resistant",
                "long battery life",
                "wireless charging",
                "high fidelity",
            ),
            (("color", ("black", "white", "rose gold")),),
        ),
        ProductType(
            "phone case",
            "Cell Phones & Accessories › Cases, Holsters & Sleeves › Basic Cases",
            ("Phone Case", "Protective Cover"),
            (
                "shockproof",
                "slim fit",
                "wireless charging",
                "easy install",
                "scratch resistant",
                "heavy duty",
            ),
            (("color", ("clear", "black", "navy blue", "purple")), ("size", ("6.1 inch", "6.7 inch"))),
        ),
    ),
    "garden": (
        ProductType(
            "console table",
            "Home & Kitchen › Furniture › Living Room Furniture › Tables › Console Tables",
            ("Console Table", "Sofa Table"),
            ("solid wood", "easy assembly", "living room", "space saving", "storage space", "mid century"),
            (("color", ("walnut", "white", "black", "oak")),),
        ),
        ProductType(
            "throw pillow covers",
            "Home & Kitchen › Home Décor Products › Decorative Pillows & Covers",
            ("Pillow Covers", "Cushion Cases"),
            ("machine washable", "living room", "hidden zipper", "super soft", "double sided", "linen"),
            (
                ("color", ("beige", "grey", "teal", "mustard yellow")),
                ("size", ("18 x 18 inch", "20 x 20 inch")),
            ),
        ),
        ProductType(
            "led floor lamp",
            "Tools & Home Improvement › Lighting & Ceiling Fans › Lamps & Shades › Floor Lamps",
            ("Floor Lamp", "Standing Light"),
            ("dimmable", "energy saving", "living room", "remote control", "easy assembly", "modern design"),
            (("color", ("black", "gold", "silver")),),
        ),
        ProductType(
            "area rug",
            "Home & Kitchen › Home Décor Products › Area Rugs",
            ("Area Rug", "Carpet"),
            ("non slip", "machine washable", "living room", "stain resistant", "high pile", "easy clean"),
            (
                ("color", ("grey", "cream", "navy blue", "multicolor")),
                ("size", ("3 x 5 ft", "5 x 7 ft", "8 x 10 ft")),
            ),
        ),
    ),
    "fashion": (
        ProductType(
            "women's running shoes",
            "Clothing, Shoes & Jewelry › Women › Shoes › Athletic › Running",
            ("Running Shoes", "Sneakers"),
            ("rubber sole", "lightweight", "breathable", "non slip", "arch support", "memory foam"),
            (("color", _COLOURS[:5]), ("size", ("6", "7", "8", "9", "10"))),
        ),
        ProductType(
            "men's t-shirt",
            "Clothing, Shoes & Jewelry › Men › Clothing › Shirts › T-Shirts",
            ("T-Shirt", "Tee"),
            ("machine wash", "cotton", "short sleeve", "classic fit", "relaxed fit", "moisture wicking"),
            (("color", _COLOURS[2:8]), ("size", _SIZES[1:])),
        ),
        ProductType(
            "women's yoga pants",
            "Clothing, Shoes & Jewelry › Women › Clothing › Active › Leggings",
            ("Yoga Pants", "Leggings"),
            ("high waist", "tummy control", "machine wash", "four way stretch", "pockets", "squat proof"),
            (("color", _COLOURS[:6]), ("size", _SIZES[:5])),
        ),
        ProductType(
            "men's hoodie",
            "Clothing, Shoes & Jewelry › Men › Clothing › Fashion Hoodies & Sweatshirts",
            ("Hoodie", "Sweatshirt"),
            (
                "fleece lined",
                "machine wash",
                "long sleeve",
                "drawstring closure",
                "kangaroo pocket",
                "regular fit",
            ),
            (("color", _COLOURS[3:9]), ("size", _SIZES[1:5])),
        ),
    ),
    "grocery": (
        ProductType(
            "green tea",
            "Grocery & Gourmet Food › Beverages › Coffee, Tea & Cocoa › Tea › Green",
            ("Green Tea", "Tea Bags"),
            ("gluten free", "non gmo", "caffeine free", "usda organic", "sugar free", "natural ingredients"),
            (("flavor name", ("jasmine", "mint", "lemon", "original")), ("size", ("20 count", "100 count"))),
        ),
        ProductType(
            "protein bars",
            "Grocery & Gourmet Food › Snack Foods › Bars › Protein Bars",
            ("Protein Bars", "Snack Bars"),
            ("gluten free", "low sugar", "high protein", "plant based", "keto friendly", "non gmo"),
            (
                ("flavor name", ("chocolate chip", "peanut butter", "salted caramel")),
                ("size", ("12 count", "24 count")),
            ),
        ),
        ProductType(
            "coffee beans",
            "Grocery & Gourmet Food › Beverages › Coffee, Tea & Cocoa › Coffee › Whole Coffee Beans",
            ("Coffee Beans", "Whole Bean Coffee"),
            ("usda organic", "fair trade", "dark roast", "low acid", "non gmo", "single origin"),
            (("size", ("12 ounce", "2 pound", "5 pound")),),
        ),
        ProductType(
            "dark chocolate",
            "Grocery & Gourmet Food › Candy & Chocolate › Chocolate › Chocolate Bars",
            ("Dark Chocolate", "Chocolate Bar"),
            ("sugar free", "dairy free", "gluten free", "keto friendly", "individually wrapped", "low carb"),
            (("flavor name", ("sea salt", "almond", "orange", "mint")), ("size", ("3 pack", "12 pack"))),
        ),
    ),
}

_STYLES = (
    "Premium",
    "Classic",
    "Deluxe",
    "Everyday",
    "Pro",
    "Ultra",
    "Essential",
    "Modern",
    "Compact",
    "Original",
)
_INSTRUCTIONS = (
    "i am looking for {attrs} {query}",
    "Find me {query} with {attrs}",
    "i need {query} that is {attrs}",
    "i want to buy {query} which are {attrs}",
    "i would like {attrs} {query}",
)
_DESCRIPTION = (
    "{brand} makes {query} for people who care about {a0}.",
    "This {noun} comes with {a1} and is built to last.",
    "Designed with {a0} in mind, it fits into any routine.",
    "Every {noun} is checked by hand before it ships.",
)


def _brand(rng: random.Random) -> str:
    """A pronounceable made-up brand, so no real company is named."""
    syllables = [rng.choice("bdfgklmnprstvz") + rng.choice("aeiou") for _ in range(rng.randint(2, 3))]
    return "".join(syllables).capitalize() + rng.choice(("", "", "co", "ly", "ra"))


def _asin(rng: random.Random) -> str:
    return "G0" + "".join(rng.choice(string.ascii_uppercase + string.digits) for _ in range(8))


def _join(items: list[str]) -> str:
    return ", ".join(items[:-1]) + " and " + items[-1] if len(items) > 1 else items[0]


def _record(
    rng: random.Random, asin: str, category: str, kind: ProductType
) -> tuple[dict[str, Any], list[str]]:
    """One raw product record (official format) and its attributes."""
    brand, noun = _brand(rng), rng.choice(kind.nouns)
    attributes = rng.sample(kind.attributes, rng.randint(2, 4))
    title = f"{brand} {rng.choice(_STYLES)} {noun} - {attributes[0].title()}, {attributes[-1].title()}"
    fields = {
        "brand": brand,
        "query": kind.query,
        "noun": noun.lower(),
        "a0": attributes[0],
        "a1": attributes[1],
    }
    description = " ".join(t.format(**fields) for t in rng.sample(_DESCRIPTION, 3))
    bullets = [f"{a.upper()}: {brand} {noun.lower()} with {a}." for a in attributes]
    low = round(rng.uniform(4, 150), 2)
    pricing = [low] if rng.random() < 0.85 else [low, round(low * rng.uniform(1.1, 1.8), 2)]
    options = {}
    for name, values in kind.options:
        if rng.random() < 0.9:
            chosen = sorted(rng.sample(range(len(values)), rng.randint(min(3, len(values)), len(values))))
            options[name.title()] = [{"value": values[i]} for i in chosen]
    record = {
        "asin": asin,
        "name": title,
        "full_description": description,
        "small_description": bullets,
        "pricing": pricing,
        "customization_options": options or "",
        "category": category,
        "query": kind.query,
        "product_category": kind.path,
        "average_rating": round(rng.uniform(3, 5), 1),
    }
    return record, attributes


def generate_records(
    num_products: int, seed: int = 0
) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """Raw product records and the asin -> attributes/instruction map, in the official formats."""
    if num_products < 1:
        raise ValueError(f"num_products must be positive, got {num_products}")
    rng = random.Random(f"hgpo-webshop-generated:{seed}")
    kinds = [(category, kind) for category, group in TYPES.items() for kind in group]
    records, attributes = [], {}
    asins: set[str] = set()
    while len(records) < num_products:
        asin = _asin(rng)
        if asin in asins:
            continue
        asins.add(asin)
        category, kind = rng.choice(kinds)
        record, product_attributes = _record(rng, asin, category, kind)
        records.append(record)
        entry: dict[str, Any] = {"attributes": product_attributes}
        if rng.random() < INSTRUCTION_SHARE:
            asked = rng.sample(product_attributes, rng.randint(1, min(3, len(product_attributes))))
            template = rng.choice(_INSTRUCTIONS)
            entry["instruction"] = template.format(attrs=_join(asked), query=kind.query)
            entry["instruction_attributes"] = asked
        attributes[asin] = entry
    return records, attributes


def generate_catalog(num_products: int = 1000, seed: int = 0) -> Catalog:
    """The generated catalog (see the module docstring); deterministic in its arguments."""
    records, attributes = generate_records(num_products, seed)
    return build_catalog(
        records,
        attributes,
        None,
        source="generated",
        origin=f"generated(num_products={num_products}, seed={seed})",
    )
