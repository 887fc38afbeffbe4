"""The shop's pages and how clicks move between them, in the original's text ("simple") mode.

A page is the visible text of the original's HTML page joined with ``" [SEP] "``; the clickables
are its buttons, product links and option values, lower-cased as the original's text env keys
them. Pages:

* search: ``WebShop [SEP] Instruction: [SEP] <instruction> [SEP] Search`` (the only page with a
  search box);
* results: ``Back to Search``, ``Page p (Total results: n)``, ``< Prev`` (after page 1),
  ``Next >`` (while more results follow), then asin, title and price of up to 10 of the top 50;
* item: ``Back to Search``, ``< Prev``, each option group and its values, title, price, rating,
  ``Description``, ``Features``, ``Reviews``, ``Buy Now``; which options are chosen is not shown,
  as in the original's simple mode;
* description / features / reviews: ``Back to Search``, ``< Prev`` and that text;
* done, after Buy Now: the thanks line and the score.

``< Prev`` goes to the previous results page, from an item back to its results page (options
reset), and from a sub-page back to the item (options kept). ``Back to Search`` always returns
to the search page.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import NamedTuple

from hgpo_env.envs.webshop.catalog import Catalog, Product
from hgpo_env.envs.webshop.search import SearchEngine

SEP = " [SEP] "
PAGE_SIZE = 10
BACK_TO_SEARCH = "back to search"
NEXT_PAGE = "next >"
PREV_PAGE = "< prev"
BUY_NOW = "buy now"


class Page(enum.Enum):
    SEARCH = "search"
    RESULTS = "results"
    ITEM = "item"
    DESCRIPTION = "description"
    FEATURES = "features"
    REVIEWS = "reviews"
    DONE = "done"


SUB_PAGES = {"description": Page.DESCRIPTION, "features": Page.FEATURES, "reviews": Page.REVIEWS}


class Clickable(NamedTuple):
    """What a label does: a ``button``, opens a ``product`` (its index) or chooses an ``option``."""

    kind: str
    product: int | None = None
    group: str | None = None


BUTTON = Clickable("button")


@dataclass
class Session:
    """Where the shopper is: page, last search, results page, open product and chosen options."""

    page: Page = Page.SEARCH
    keywords: str = ""
    results: tuple[int, ...] = ()
    page_number: int = 1
    product: int | None = None
    options: dict[str, str] = field(default_factory=dict)


class Site:
    """Renders pages and applies searches and clicks to a :class:`Session`."""

    def __init__(self, catalog: Catalog, engine: SearchEngine) -> None:
        self.catalog = catalog
        self.engine = engine

    # ----------------------------------------------------------------- what can be done
    def clickables(self, session: Session) -> dict[str, Clickable]:
        """Lower-cased label -> what clicking it means, in page order."""
        page = session.page
        if page in (Page.SEARCH, Page.DONE):
            return {}
        found = {BACK_TO_SEARCH: BUTTON}
        if page is Page.RESULTS:
            if session.page_number > 1:
                found[PREV_PAGE] = BUTTON
            if session.page_number * PAGE_SIZE < len(session.results):
                found[NEXT_PAGE] = BUTTON
            for index in self._page_results(session):
                found.setdefault(self.catalog.products[index].asin.lower(), Clickable("product", index))
            return found
        found[PREV_PAGE] = BUTTON
        if page is Page.ITEM:
            for label in (*SUB_PAGES, BUY_NOW):
                found[label] = BUTTON
            for group, values in self._product(session).options.items():
                for value in values:
                    if found.get(value) != BUTTON:  # buttons win; a value in two groups: the last
                        found[value] = Clickable("option", group=group)
        return found

    # ----------------------------------------------------------------- transitions
    def search(self, session: Session, query: str) -> None:
        session.page = Page.RESULTS
        session.keywords = query.lower()
        session.results = tuple(self.engine.search(session.keywords))
        session.page_number = 1
        session.product = None
        session.options = {}

    def click(self, session: Session, label: str) -> None:
        """Follow a clickable ``label`` (lower case, one of :meth:`clickables`)."""
        target = self.clickables(session)[label]
        page = session.page
        if target.kind == "product":
            session.page, session.product = Page.ITEM, target.product
        elif target.kind == "option":
            session.options[target.group] = label
        elif label == BACK_TO_SEARCH:
            session.page, session.keywords, session.results = Page.SEARCH, "", ()
            session.product, session.options = None, {}
        elif label == NEXT_PAGE:
            session.page_number += 1
        elif label == PREV_PAGE:
            if page is Page.RESULTS:
                session.page_number -= 1
            elif page is Page.ITEM:
                session.page, session.options = Page.RESULTS, {}
            else:
                session.page = Page.ITEM
        elif label == BUY_NOW:
            session.page = Page.DONE
        else:
            session.page = SUB_PAGES[label]

    # ----------------------------------------------------------------- text
    def render(self, session: Session, instruction: str, score: float | None = None) -> tuple[str, str]:
        """``(page text, page text without the instruction header)``."""
        page = session.page
        header = ["Instruction:", instruction]
        if page is Page.SEARCH:
            return _join(["WebShop", *header, "Search"]), _join(["WebShop", "Search"])
        if page is Page.DONE:
            text = _join(["Thank you for shopping with us!", "Your score (min 0.0, max 1.0)", f"{score}"])
            return text, text
        body = ["Back to Search"]
        if page is Page.RESULTS:
            body += self._results_body(session)
        else:
            body += ["< Prev", *self._product_body(session)]
        return _join(header + body), _join(body)

    def _results_body(self, session: Session) -> list[str]:
        parts = [f"Page {session.page_number} (Total results: {len(session.results)})"]
        if session.page_number > 1:
            parts.append("< Prev")
        if session.page_number * PAGE_SIZE < len(session.results):
            parts.append("Next >")
        for index in self._page_results(session):
            product = self.catalog.products[index]
            parts += [product.asin, product.title, product.price_tag]
        return parts

    def _product_body(self, session: Session) -> list[str]:
        product = self._product(session)
        if session.page is Page.DESCRIPTION:
            return [product.description or "No Description"]
        if session.page is Page.FEATURES:
            return list(product.bullet_points) or ["No Features"]
        if session.page is Page.REVIEWS:
            return ["No reviews found"]
        parts = []
        for group, values in product.options.items():
            parts += [group, *values]
        parts += [product.title, f"Price: {product.price_tag}", f"Rating: {product.rating}"]
        return parts + ["Description", "Features", "Reviews", "Buy Now"]

    def _page_results(self, session: Session) -> tuple[int, ...]:
        start = (session.page_number - 1) * PAGE_SIZE
        return session.results[start : start + PAGE_SIZE]

    def _product(self, session: Session) -> Product:
        if session.product is None:
            raise RuntimeError(f"no product is open on the {session.page.value} page")
        return self.catalog.products[session.product]


def _join(parts: list[str]) -> str:
    return SEP.join(part for part in parts if part)
