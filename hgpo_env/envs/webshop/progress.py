"""WebShop's milestones and progress signature, as ``shared/MVPO_SPEC.md`` section 2 defines them.

The place of an observation is its page type, tested in this order: ``bought`` (the env's done
page: its text says neither of the paper's keywords, spec A16), ``item_sub`` (an item page that
offers options: "buy now" and the word size or color), ``item_detail`` ("buy now"),
``search_result`` (any other page past the search box: results, and, read literally, an item's
description, features and reviews pages), ``init`` (the search page).
"""

from __future__ import annotations

import re

from hgpo_env.contract.milestones import Progress
from hgpo_env.envs.webshop.site import Page

MILESTONES = ("search", "item", "option", "success", "invalid")
PAGE_TYPES = ("init", "search_result", "item_detail", "item_sub", "bought")
"""In order of progress: each milestone flag is a page type at or past its own."""
_OPTIONS = re.compile(r"\b(size|color)\b")


def page_type(page: Page, observation: str) -> str:
    if page is Page.DONE:
        return "bought"
    text = observation.lower()
    if "buy now" in text:
        return "item_sub" if _OPTIONS.search(text) else "item_detail"
    return "init" if page is Page.SEARCH else "search_result"


def progress(page: Page, observation: str, reward: float, action_valid: bool) -> Progress:
    """The observation's page type and its five flags (searched, on an item, on its options,
    success, an invalid step)."""
    kind = page_type(page, observation)
    reached = PAGE_TYPES.index(kind)
    flags = (reached >= 1, reached >= 2, reached >= 3, reward > 0 or kind == "bought", not action_valid)
    return Progress(kind, flags)
