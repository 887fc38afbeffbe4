"""HGPO-WebShop-v0: WebShop's text mode on a pure-Python engine.

Commands are ``search[keywords]`` (only on the search page, which has the search box; on any page
under ``protocol="verl-agent"``, as in the original text env) and
``click[label]`` (only a clickable of the current page, matched case-insensitively). Anything
else is rejected without touching the state: an unknown label, a search without a search box,
malformed brackets, an empty argument, or a command longer than :data:`MAX_COMMAND_CHARS`.

Admissible actions are the page's clickables as ``click[label]`` and, on the search page, the one
entry ``search[<your query>]``, which stands for every search: any non-empty query is accepted
there, except the placeholder itself.

Buying ends the episode. ``info["score"]`` is WebShop's 0..1 purchase score and the reward is
``success_reward`` when it is exactly 1. ``info`` also has ``data_source`` (``"official"`` or
``"generated"``) and, after a purchase, ``purchase`` (asin, chosen options and the score parts).
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any

from hgpo_env.contract.fingerprint import canonical_text
from hgpo_env.contract.milestones import Progress
from hgpo_env.envs.webshop.goals import SPLITS, VERL_AGENT_SPLITS, Goal, shuffled_goals, split_goals
from hgpo_env.envs.webshop.nouns import learn_catalog
from hgpo_env.envs.webshop.progress import MILESTONES, progress
from hgpo_env.envs.webshop.reward import REWARDS, ScoreDetails, score_purchase
from hgpo_env.envs.webshop.search import engine_for
from hgpo_env.envs.webshop.site import (
    BACK_TO_SEARCH,
    BUY_NOW,
    NEXT_PAGE,
    PAGE_SIZE,
    PREV_PAGE,
    Clickable,
    Page,
    Session,
    Site,
)
from hgpo_env.envs.webshop.sources import SMALL, load_catalog
from hgpo_env.prompting.calling import ToolSet, one_argument_tool
from hgpo_env.textenv.core import TextEnv

SEARCH_PLACEHOLDER = "search[<your query>]"
MAX_COMMAND_CHARS = 512
EXPERT_QUERY_CHARS = 200
"""The expert's queries stay short enough for the response parser's default action limit."""
_COMMAND = re.compile(r"(search|click)\[(.*)\]", re.IGNORECASE | re.DOTALL)


def parse_command(command: str) -> tuple[str, str] | None:
    """``(verb, argument)`` of ``search[...]`` or ``click[...]``, or None when malformed."""
    match = _COMMAND.fullmatch(command)
    if match is None or not match.group(2).strip():
        return None
    return match.group(1).lower(), match.group(2).strip()


def _shorten(text: str) -> str:
    """``text`` as a search command would carry it: canonical, lower case, cut at a word boundary
    to at most :data:`EXPERT_QUERY_CHARS` characters."""
    text = canonical_text(text).lower()
    return text if len(text) <= EXPERT_QUERY_CHARS else text[:EXPERT_QUERY_CHARS].rsplit(" ", 1)[0]


class WebShopEnv(TextEnv):
    """WebShop's text mode: ``options={"task_id": i}`` selects goal ``i`` of ``split``.

    ``split`` is ``"train"`` (goals 1500 on), ``"eval"`` (500-1499) or ``"test"`` (0-499) of the
    shuffled goal list; ``human_goals`` uses the human-written instructions instead of the
    templated ones. ``data_path`` and ``num_products`` choose the catalog
    (:mod:`~hgpo_env.envs.webshop.sources`). ``reward`` is ``"original"`` (WebShop's score, bit for
    bit, as papers report it) or ``"corrected"`` (:mod:`~hgpo_env.envs.webshop.reward`).

    ``protocol="verl-agent"`` (the papers' rules, :mod:`hgpo_env.contract.protocol`) also takes the papers'
    split (``"test"``: goals 0-499, ``"train"``: 500 onwards) and, as the original text env does,
    accepts a search with a non-empty query on any page. ``info`` reports the milestones
    (:mod:`~hgpo_env.envs.webshop.progress`: the page types reached).
    """

    env_family = "webshop"
    milestones = MILESTONES
    prompt_intro = (
        "You are an expert autonomous agent shopping in WebShop, an online store. Pages list their "
        "text separated by [SEP]. Search for products on the search page, and click a button to "
        "press it, a product to open it or an option to choose it; clicking Buy Now buys the open "
        "product with the chosen options and ends the episode."
    )
    agent_tools = ToolSet(
        (
            one_argument_tool("search", "Search the store (on the search page).", "query", "The keywords."),
            one_argument_tool(
                "click", "Press a button, open a product or choose an option.", "target", "Its label."
            ),
        ),
        {"search": ("query", "search[{}]"), "click": ("target", "click[{}]")},
    )
    """The tools of ``response_format="tool_call"``: ``search(query)`` and ``click(target)``."""

    def __init__(
        self,
        *,
        max_steps: int = 15,
        success_reward: float = 10.0,
        split: str = "train",
        human_goals: bool = False,
        data_path: str | os.PathLike[str] | None = None,
        num_products: int | None = SMALL,
        reward: str = "original",
        render_mode: str | None = None,
        protocol: str = "strict",
    ) -> None:
        if reward not in REWARDS:
            raise ValueError(f"reward must be one of {REWARDS}, got {reward!r}")
        super().__init__(
            max_steps=max_steps, success_reward=success_reward, render_mode=render_mode, protocol=protocol
        )
        self.reward = reward
        self.catalog = load_catalog(data_path, num_products)
        self.split = split
        splits = VERL_AGENT_SPLITS if protocol == "verl-agent" else SPLITS
        self.splits = tuple(splits)  # what a server's Task API offers
        self.goals = split_goals(shuffled_goals(self.catalog, human_goals), split, splits)
        if not self.goals:
            kind = "human" if human_goals else "synthetic"
            raise ValueError(f"the {split!r} split of the {kind} goals of {self.catalog.origin} is empty")
        self.site = Site(self.catalog, engine_for(self.catalog))
        learn_catalog(self.catalog)
        self.session = Session()
        self._goal: Goal | None = None
        self._purchase: ScoreDetails | None = None
        self._searches: list[str] = []
        self._state_text = ""
        self._clickables: dict[str, Clickable] = {}

    # ----------------------------------------------------------------- task
    @property
    def num_tasks(self) -> int:
        return len(self.goals)

    @property
    def goal(self) -> Goal:
        if self._goal is None:
            raise RuntimeError("call reset() first")
        return self._goal

    @property
    def task(self) -> str:
        return self.goal.instruction_text

    @property
    def task_type(self) -> str:
        return self.goal.category

    def task_identity(self) -> str:
        """The goal (product, instruction, attributes, options, price bound) and the catalog's digest."""
        return f"{self.catalog.key}\n{self.goal!r}"

    @property
    def score(self) -> float:
        return self._purchase.score if self._purchase is not None else 0.0

    @property
    def won(self) -> bool:
        return self._purchase is not None and self._purchase.score == 1.0

    @property
    def done(self) -> bool:
        return self.session.page is Page.DONE

    @property
    def state_text(self) -> str:
        return self._state_text

    @property
    def admissible_actions(self) -> list[str]:
        if self.session.page is Page.SEARCH:
            return [SEARCH_PLACEHOLDER]
        return [f"click[{label}]" for label in self._clickables]

    # ----------------------------------------------------------------- stepping
    def _start_task(self, task_id: int) -> str:
        self._goal = self.goals[task_id]
        self.session = Session()
        self._purchase = None
        self._searches = []
        return self._refresh()

    def _accept(self, action: str) -> str | None:
        command = canonical_text(action)
        if len(command) > MAX_COMMAND_CHARS:
            return None
        parsed = parse_command(command)
        if parsed is None:
            return None
        verb, argument = parsed
        if verb == "search":
            if self.protocol == "verl-agent":
                return f"search[{argument}]"
            ok = self.session.page is Page.SEARCH and command.lower() != SEARCH_PLACEHOLDER
            return f"search[{argument}]" if ok else None
        label = argument.lower()
        return f"click[{label}]" if label in self._clickables else None

    def _apply(self, command: str) -> str:
        verb, argument = parse_command(command)  # type: ignore[misc]  # _accept made it
        if verb == "search":
            self._searches.append(argument.lower())
            self.site.search(self.session, argument)
        else:
            self.site.click(self.session, argument)
        if self.session.page is Page.DONE:
            assert self.session.product is not None
            product = self.catalog.products[self.session.product]
            price = self.catalog.prices[self.session.product]
            self._purchase = score_purchase(
                product, price, self.session.options, self.goal, reward=self.reward
            )
        return self._refresh()

    def _refresh(self) -> str:
        """Render the current page and remember its clickables."""
        observation, self._state_text = self.site.render(self.session, self.goal.instruction_text, self.score)
        self._clickables = self.site.clickables(self.session)
        return observation

    def progress(self, reward: float, action_valid: bool) -> Progress:
        return progress(self.session.page, self.observation, reward, action_valid)

    def _info(self, action_valid: bool) -> dict[str, Any]:
        info = super()._info(action_valid)
        info["data_source"] = self.catalog.source
        if self._purchase is not None:
            assert self.session.product is not None
            info["purchase"] = {
                "asin": self.catalog.products[self.session.product].asin,
                "options": dict(self.session.options),
                **dataclasses.asdict(self._purchase),
            }
        return info

    # ----------------------------------------------------------------- expert
    def expert_action(self) -> str:
        """The oracle's next command: it knows the goal product and its options.

        It searches the instruction (without the price clause), pages through the results to the
        goal product, or searches the product's title when the first search missed it; then it
        chooses each goal option and buys.
        """
        session, goal = self.session, self.goal
        target = self.catalog.index_of[goal.asin]
        if session.page is Page.DONE:
            raise RuntimeError("the episode is over: nothing left to do")
        if session.page is Page.SEARCH:
            query = _shorten(goal.search_text)
            if query in self._searches:
                query = _shorten(self.catalog.products[target].title)
            return f"search[{query}]"
        if session.page is Page.RESULTS:
            if target not in session.results:
                return f"click[{BACK_TO_SEARCH}]"
            wanted_page = session.results.index(target) // PAGE_SIZE + 1
            if wanted_page == session.page_number:
                return f"click[{goal.asin.lower()}]"
            return f"click[{NEXT_PAGE if wanted_page > session.page_number else PREV_PAGE}]"
        if session.page is not Page.ITEM or session.product != target:
            return f"click[{PREV_PAGE}]"
        for value in goal.options:
            option = self._clickables.get(value)
            if option is not None and option.kind == "option" and session.options.get(option.group) != value:
                return f"click[{value}]"
        return f"click[{BUY_NOW}]"
