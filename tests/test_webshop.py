"""HGPO-WebShop-v0 mechanics on the generated catalog (offline): pages, navigation, invalid
commands, reward rules on hand-made products, search, data lookup and download."""

from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import hgpo_env  # noqa: F401
from hgpo_env.envs.webshop import (
    SEARCH_PLACEHOLDER,
    GeneratedCatalogWarning,
    WebShopEnv,
    generate_catalog,
    load_catalog,
    parse_command,
    score_purchase,
    shuffled_goals,
    sources,
)
from hgpo_env.envs.webshop import search as search_module
from hgpo_env.envs.webshop.search import SearchEngine, analyze
from hgpo_env.envs.webshop.site import Page


@pytest.fixture(autouse=True)
def _private_data_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HGPO_DATA", str(tmp_path_factory.getbasetemp() / "hgpo-data"))
    monkeypatch.delenv("WEBSHOP_DATA", raising=False)


def make_env(**kwargs) -> WebShopEnv:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GeneratedCatalogWarning)
        return WebShopEnv(data_path="generated", **kwargs)


def snapshot(env: WebShopEnv) -> tuple:
    return dataclasses.astuple(env.session), env.observation, env.state_text, env.admissible_actions


def go_to_item(env: WebShopEnv) -> None:
    while env.session.page is not Page.ITEM:
        env.step(env.expert_action())


# ----------------------------------------------------------------- API and pages
def test_gymnasium_check_env_passes():
    check_env(make_env(), skip_render_check=True)


def test_make_wraps_the_env_and_labels_generated_data():
    with pytest.warns(GeneratedCatalogWarning, match="GENERATED"):
        env = gym.make("HGPO-WebShop-v0", data_path="generated", max_steps=30)
    assert isinstance(env.unwrapped, WebShopEnv) and env.unwrapped.max_steps == 30
    assert WebShopEnv.__init__.__kwdefaults__["max_steps"] == 15
    prompt, info = env.reset(seed=0)
    assert prompt.startswith(WebShopEnv.prompt_intro) and info["data_source"] == "generated"
    assert info["admissible_actions"] == [SEARCH_PLACEHOLDER] and info["state_text"] == "WebShop [SEP] Search"


def test_pages_follow_the_original_text_layout():
    env = make_env(split="test")
    obs, _ = env.reset(options={"task_id": 3})
    instruction = env.goal.instruction_text
    assert obs == f"WebShop [SEP] Instruction: [SEP] {instruction} [SEP] Search"
    obs, *_ = env.step(env.expert_action())
    assert obs.startswith(
        f"Instruction: [SEP] {instruction} [SEP] Back to Search [SEP] Page 1 (Total results: "
    )
    assert env.state_text == obs.removeprefix(f"Instruction: [SEP] {instruction} [SEP] ")
    first = env.catalog.products[env.session.results[0]]
    assert f"Next > [SEP] {first.asin} [SEP] {first.title} [SEP] {first.price_tag}" in obs
    go_to_item(env)
    product = env.catalog.products[env.session.product]
    assert env.observation.endswith(
        f"{product.title} [SEP] Price: {product.price_tag} [SEP] Rating: {product.rating} "
        "[SEP] Description [SEP] Features [SEP] Reviews [SEP] Buy Now"
    )
    actions = env.admissible_actions
    assert actions[:6] == [
        "click[back to search]",
        "click[< prev]",
        "click[description]",
        "click[features]",
        "click[reviews]",
        "click[buy now]",
    ]
    assert {f"click[{v}]" for vs in product.options.values() for v in vs} <= set(actions)
    env.step("click[Features]")
    assert env.state_text == " [SEP] ".join(["Back to Search", "< Prev", *product.bullet_points])


def test_navigation_between_results_items_and_sub_pages():
    env = make_env(split="test")
    env.reset(options={"task_id": 0})
    env.step("search[yoga pants with pockets]")
    assert len(env.session.results) == 50 and "click[< prev]" not in env.admissible_actions
    env.step("click[Next >]")
    assert env.session.page_number == 2 and "click[< prev]" in env.admissible_actions
    asin = env.catalog.products[env.session.results[10]].asin
    env.step(f"click[{asin}]")
    product = env.catalog.products[env.session.product]
    group, values = next(iter(product.options.items()))
    env.step(f"click[{values[-1]}]")
    before = env.observation
    assert env.session.options == {group: values[-1]} and before == env.observation  # choices are not shown
    env.step("click[description]")
    assert env.session.page is Page.DESCRIPTION and product.description in env.observation
    env.step("click[< prev]")
    assert env.session.page is Page.ITEM and env.session.options == {group: values[-1]}
    env.step("click[< prev]")
    assert env.session.page is Page.RESULTS and env.session.page_number == 2 and env.session.options == {}
    env.step("click[back to search]")
    assert env.session.page is Page.SEARCH and env.admissible_actions == [SEARCH_PLACEHOLDER]


def test_a_search_without_matches_shows_an_empty_results_page():
    env = make_env()
    env.reset(seed=0)
    env.step("search[qqqzzz xxyyzz]")
    assert env.state_text == "Back to Search [SEP] Page 1 (Total results: 0)"
    assert env.admissible_actions == ["click[back to search]"]


def test_seeded_sampling_and_task_selection():
    env = make_env(split="eval")
    env.reset(seed=7)
    first = env.task_id
    env.reset(seed=7)
    assert env.task_id == first and env.num_tasks == 1000
    env.reset(options={"task_id": 999})
    assert env.goal == shuffled_goals(env.catalog)[1499]
    with pytest.raises(ValueError, match="out of range"):
        env.reset(options={"task_id": 1000})
    with pytest.raises(ValueError, match="split must be one of"):
        make_env(split="dev")


def test_episode_truncates_after_max_steps():
    env = make_env(max_steps=3)
    env.reset(seed=1)
    results = [env.step("click[nothing]") for _ in range(3)]
    assert [r[3] for r in results] == [False, False, True] and not any(r[2] for r in results)


# ----------------------------------------------------------------- invalid commands
@pytest.mark.parametrize("page", ["search", "results", "item"])
def test_invalid_commands_change_nothing(page):
    env = make_env(max_steps=100)
    env.reset(options={"task_id": 2})
    if page != "search":
        env.step(env.expert_action())
    if page == "item":
        go_to_item(env)
    bad = [
        "click[no such button]",
        "click[]",
        "search[]",
        "search[laptop",
        "click buy now]",
        "[buy now]",
        "buy now",
        "clickk[buy now]",
        "search [laptop]",
        "x" * 100_000,
        f"search[{'y' * 600}]",
        SEARCH_PLACEHOLDER,
        "",
    ]
    if page != "search":
        bad.append("search[red shoes]")  # no search box here
    else:
        bad.append("click[back to search]")
    for command in bad:
        before = snapshot(env)
        steps = env.elapsed_steps
        _, reward, terminated, _, info = env.step(command)
        assert not info["action_valid"] and reward == 0.0 and not terminated, command
        assert snapshot(env) == before and env.elapsed_steps == steps + 1, command


def test_clicks_match_case_insensitively_and_searches_accept_any_text():
    env = make_env()
    env.reset(seed=3)
    _, _, _, _, info = env.step("SEARCH[Find Me  a [Red] Lamp ]")
    assert info["action_valid"] and env.session.keywords == "find me a [red] lamp"
    _, _, _, _, info = env.step("Click[NEXT >]")
    assert info["action_valid"] and env.session.page_number == 2
    assert parse_command("click[size [pack of 2]]") == ("click", "size [pack of 2]")
    assert parse_command("click[ ]") is None and parse_command("look") is None


# ----------------------------------------------------------------- reward (rules: test_webshop_reward.py)
def test_generated_goal_products_score_one_with_their_options():
    catalog = generate_catalog(300)
    for goal in shuffled_goals(catalog):
        index = catalog.index_of[goal.asin]
        product = catalog.products[index]
        chosen = dict(zip(sorted(product.options), goal.options))
        assert score_purchase(product, catalog.prices[index], chosen, goal).score == 1.0


# ----------------------------------------------------------------- search
def test_analyzer_mirrors_lucene_english():
    assert analyze("The Women's Running-Shoes, for the RUNNERS") == ["women", "run", "shoe", "runner"]
    assert analyze("usb 3.0 cable and 2 pcs") == ["usb", "3.0", "cabl", "2", "pc"]
    assert analyze("a the of") == []


def test_search_ties_keep_catalog_order_and_the_index_is_cached_on_disk(monkeypatch, tmp_path):
    docs = ["red lamp", "blue lamp", "red lamp", "red red lamp lamp", "green chair"]
    engine = SearchEngine.build(docs)
    assert engine.search("red lamp") == [3, 0, 2, 1]
    assert engine.search("chair") == [4] and engine.search("sofa") == [] and engine.search("the") == []
    assert engine.search("red", k=2) == [3, 0]  # 0 and 2 tie: the earlier one is kept
    monkeypatch.setenv("HGPO_DATA", str(tmp_path))
    catalog = generate_catalog(50)
    monkeypatch.setattr(search_module, "_ENGINES", search_module.OrderedDict())
    built = search_module.engine_for(catalog)
    assert search_module.engine_for(catalog) is built
    cached = list((tmp_path / "webshop" / "index").iterdir())
    assert len(cached) == 1
    loaded = SearchEngine.load(cached[0])
    query = shuffled_goals(catalog)[0].search_text
    assert loaded.search(query) == built.search(query) and built.search(query)


def test_instruction_search_finds_most_generated_goal_products():
    env = make_env()
    goals = shuffled_goals(env.catalog)[:500]
    top50 = sum(env.catalog.index_of[g.asin] in env.site.engine.search(g.search_text) for g in goals)
    assert top50 / len(goals) >= 0.95


def test_oracle_solves_generated_goals():
    env = make_env(split="test")
    for task_id in range(0, env.num_tasks, 5):
        env.reset(options={"task_id": task_id})
        while True:
            _, reward, terminated, truncated, info = env.step(env.expert_action())
            if terminated or truncated:
                break
        assert info["won"] and reward == 10.0, task_id


# ----------------------------------------------------------------- data
def test_generated_catalog_is_deterministic_and_labelled():
    first, second = generate_catalog(200), generate_catalog(200)
    assert first.products == second.products and first.prices == second.prices and first.key == second.key
    assert first.source == "generated" and generate_catalog(200, seed=1).key != first.key
    assert len(shuffled_goals(generate_catalog(1000))) > 1500  # every split has goals


def _official_like(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    records, attributes = [], {}
    for product in generate_catalog(30).products:
        records.append(
            {
                "asin": product.asin,
                "name": product.title,
                "pricing": list(product.pricing),
                "customization_options": "",
                "small_description": list(product.bullet_points),
                "full_description": product.description,
                "category": product.category,
                "query": product.query,
                "product_category": product.product_category,
            }
        )
        attributes[product.asin] = {"attributes": list(product.attributes)}
    (folder / "items_shuffle_1000.json").write_text(json.dumps(records))
    (folder / "items_ins_v2_1000.json").write_text(json.dumps(attributes))
    return folder


def test_data_lookup_order(monkeypatch, tmp_path):
    explicit = _official_like(tmp_path / "explicit")
    from_env = _official_like(tmp_path / "from-env")
    home = tmp_path / "home"
    monkeypatch.setenv("HGPO_DATA", str(home))
    assert load_catalog(explicit).origin == str(explicit)
    monkeypatch.setenv("WEBSHOP_DATA", str(from_env))
    assert load_catalog().origin == str(from_env)
    assert load_catalog(explicit).origin == str(explicit)
    monkeypatch.delenv("WEBSHOP_DATA")
    with pytest.warns(GeneratedCatalogWarning):
        assert load_catalog().source == "generated"
    _official_like(home / "webshop")
    assert load_catalog().origin == str(home / "webshop")
    with pytest.raises(FileNotFoundError, match="data_path"):
        load_catalog(tmp_path / "nowhere")
    monkeypatch.setenv("WEBSHOP_DATA", str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError, match="WEBSHOP_DATA"):
        load_catalog()


def test_download_fetches_verifies_and_rejects_non_json(monkeypatch, tmp_path):
    source = _official_like(tmp_path / "remote")
    (source / "items_human_ins.json").write_text("{}")
    files = {name: (path.as_uri(), None) for name, path in ((p.name, p) for p in source.iterdir())}
    monkeypatch.setattr(sources, "OFFICIAL_FILES", files)
    dest = sources.download(tmp_path / "local")
    assert sorted(p.name for p in dest.iterdir() if not p.name.startswith(".")) == sorted(files)
    assert load_catalog(dest).source == "official"
    (source / "broken.json").write_text("<html>quota exceeded</html>")
    monkeypatch.setattr(sources, "OFFICIAL_FILES", {"broken.json": ((source / "broken.json").as_uri(), None)})
    with pytest.raises(ValueError, match="not JSON"):
        sources.download(tmp_path / "local")
    assert not (tmp_path / "local" / "broken.json").exists()
    monkeypatch.setattr(
        sources, "OFFICIAL_FILES", {"x.json": ((source / "items_human_ins.json").as_uri(), "0" * 64)}
    )
    with pytest.raises(ValueError, match="checksum"):
        sources.download(tmp_path / "local")


def test_title_nouns_are_learned_once_and_cached_on_disk(monkeypatch, tmp_path):
    from hgpo_env.envs.webshop import nouns as nouns_module

    monkeypatch.setenv("HGPO_DATA", str(tmp_path))
    monkeypatch.setattr(nouns_module, "_KNOWN", {})
    catalog = generate_catalog(40, seed=7)  # no shipped table: tagged with spaCy
    title = catalog.products[0].source.title
    assert nouns_module.title_key(title) not in nouns_module.shipped_table()
    nouns_module.learn_catalog(catalog)
    expected = nouns_module.tag_nouns(title)
    assert expected and nouns_module.nouns(title) == expected
    monkeypatch.setattr(nouns_module, "_KNOWN", {})

    def no_tagger(title: str) -> tuple[str, ...]:
        raise AssertionError("the tagger must not run: the table is cached")

    monkeypatch.setattr(nouns_module, "tag_nouns", no_tagger)
    nouns_module.learn_catalog(catalog)
    assert nouns_module.nouns(title) == expected


def test_the_shipped_table_covers_the_default_generated_catalog(monkeypatch):
    from hgpo_env.envs.webshop import nouns as nouns_module

    def no_tagger(title: str) -> tuple[str, ...]:
        raise AssertionError(f"the shipped table should know {title!r}")

    monkeypatch.setattr(nouns_module, "tag_nouns", no_tagger)
    monkeypatch.setattr(nouns_module, "_KNOWN", {})
    nouns_module.learn_catalog(generate_catalog(1000))


def test_oracle_searches_the_title_when_the_instruction_misses():
    env = make_env(split="test")
    env.reset(options={"task_id": 0})
    engine = env.site.engine

    class FirstSearchMisses:
        calls = 0

        def search(self, query: str) -> list[int]:
            self.calls += 1
            return [] if self.calls == 1 else engine.search(query)

    env.site.engine = FirstSearchMisses()
    commands = []
    while True:
        commands.append(env.expert_action())
        _, _, terminated, truncated, info = env.step(commands[-1])
        if terminated or truncated:
            break
    title = env.catalog.products[env.catalog.index_of[env.goal.asin]].title.lower()
    assert commands[:3] == [f"search[{env.goal.search_text}]", "click[back to search]", f"search[{title}]"]
    assert info["won"]
