"""Generation backends and rollouts: the choice trie and its free-text slots, constrained decoding,
the vLLM glue, StepBatch.

vLLM cannot be installed on the CPU test machines, so its glue is tested against a stub ``vllm``
module placed in ``sys.modules`` that records what the generator asks of it.
"""

from __future__ import annotations

import copy
import re
import sys
import types
from typing import ClassVar

import gymnasium as gym
import numpy as np
import pytest
import torch
from test_train_loss import step_batch

import hgpo_env
from hgpo_env.envs.webshop import SEARCH_PLACEHOLDER
from hgpo_env.prompting.memory import action_reply
from hgpo_env.prompting.tool_calls import ToolCall, parse_tool_call, write_call
from hgpo_train.config import EnvConfig, GenerationConfig, ModelConfig, TinyModelConfig
from hgpo_train.rollout.collect import collect_rollouts, make_pool
from hgpo_train.rollout.constrained import (
    CHOICES_KEY,
    AllowedSet,
    ChoiceLogitsProcessor,
    ChoiceTrie,
    SlotChoice,
    allowed_tokens,
    choice_args,
    choices_regex,
    classify_slot_tokens,
    reply_choices,
    slot_vocabulary,
    split_slot,
)
from hgpo_train.rollout.episodes import ChatPrompt
from hgpo_train.rollout.generation import (
    CHOICES_PROCESSOR,
    HFGenerator,
    VLLMGenerator,
    merged_state_dict,
    vllm_requests,
)
from hgpo_train.update.modeling import load_policy, load_tokenizer
from hgpo_train.update.ppo import make_micro_batch
from hgpo_train.update.tiny_model import build_tiny_model

ROOMS = {"min_rooms": 2, "max_rooms": 4, "max_distractors": 2, "lock_probability": 0.5}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny Rooms model, loaded back through from_pretrained like any model name."""
    path = build_tiny_model(
        EnvConfig(name="rooms", response_format="plain", max_steps=6, kwargs=ROOMS),
        TinyModelConfig(
            hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2, vocab_size=400, corpus_episodes=6
        ),
        tmp_path_factory.mktemp("tiny") / "m",
    )
    tokenizer = load_tokenizer(str(path))
    model = load_policy(ModelConfig(dtype="float32"), str(path), torch.device("cpu"))
    return model, tokenizer, path


def _prompts(response_format: str, n: int, steps: int = 3):
    """Prompts and their replies (each admissible command in ``response_format``) from states along
    random episodes."""
    env = gym.make("HGPO-Rooms-v0", response_format=response_format, max_steps=50, **ROOMS)
    rng = np.random.default_rng(0)
    prompts, admissible = [], []
    for seed in range(n):
        prompt, info = env.reset(seed=seed)
        for _ in range(seed % steps):
            prompt, _, _, _, info = env.step(str(rng.choice(reply_choices(info, response_format))))
        prompts.append(prompt)
        admissible.append(reply_choices(info, response_format))
    return prompts, admissible


def test_a_tool_calls_free_text_argument_is_a_slot_of_its_call_format():
    """WebShop's search call has its query as a slot: a JSON string (``hermes``, ``llama3``) or an
    XML parameter's text (``qwen_xml``), whose text holds nothing that would end it early."""
    for call_format, kind in [("hermes", '"'), ("llama3", '"'), ("qwen_xml", "\n")]:
        reply = write_call(ToolCall("search", {"query": "<your query>"}), call_format)
        parts = split_slot(reply)
        assert parts.prefix + "<your query>" + parts.suffix == reply
        assert parts.kind.closing == kind and parts.suffix.startswith(kind)
        language = re.compile(choices_regex([reply]))
        assert language.fullmatch(reply.replace("<your query>", "red shoes under $40"))
        for query in ("", "a]b", "a\nb", *(['a"b', "a\\b"] if kind == '"' else ["a<b"])):
            assert not language.fullmatch(reply.replace("<your query>", query)), (call_format, query)
    assert split_slot(write_call(ToolCall("act", {"command": "go north"}), "qwen_xml")) is None


def test_tiny_model_loads_back_through_from_pretrained(tiny):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _, _, path = tiny
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    assert model.config.vocab_size == len(tokenizer) and tokenizer.chat_template
    intro = hgpo_env.envs.rooms.RoomsEnv.prompt_intro
    assert len(tokenizer.encode(intro, add_special_tokens=False)) == 1  # fixed paragraphs are one token
    text = "put the red apple in the kitchen."
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text


def test_trie_allows_exactly_the_choices_and_then_the_end():
    steps = allowed_tokens(((1, 2), (1, 2, 3), (4,)), [1, 2, 3, 9, 9], 9)
    # a choice that is a prefix of another may end; finished rows keep a valid distribution
    assert [step.ids for step in steps] == [(1, 4), (2,), (3, 9), (9,), (9,)]
    assert all(not step.masks for step in steps)
    assert ChoiceTrie(((1, 2), (1, 2, 3), (4,)), 9).max_length == 4
    with pytest.raises(ValueError, match="not one of the allowed choices: token 3 at position 1"):
        allowed_tokens(((1, 2), (4,)), [1, 3, 9], 9)
    with pytest.raises(ValueError, match="at least one"):
        ChoiceTrie((), end_id=9)


SLOT_TEXTS = ["<end>", "a", "b c", "]", "d]", "]e", "\n", "", "f\ng]", "]]", "h", "["]
"""A handcrafted vocabulary: token i decodes to SLOT_TEXTS[i]; token 0 is special."""


def _mask(ids: list[int], width: int = len(SLOT_TEXTS)) -> torch.Tensor:
    mask = torch.zeros(width, dtype=torch.bool)
    mask[ids] = True
    return mask


def _marked(allowed: AllowedSet, width: int = len(SLOT_TEXTS)) -> torch.Tensor:
    row = torch.zeros(width, dtype=torch.bool)
    allowed.mark(row)
    return row


def test_slot_tokens_are_classified_by_their_text():
    vocabulary = classify_slot_tokens(SLOT_TEXTS, special_ids={0})
    # text without "]" or a newline ("[" too), or such text closed by "]"; a bare "]" only after text
    assert torch.equal(vocabulary.opening, _mask([1, 2, 4, 10, 11]))
    assert torch.equal(vocabulary.continuing, _mask([1, 2, 3, 4, 10, 11]))
    assert torch.equal(vocabulary.closing, _mask([3, 4]))
    with pytest.raises(ValueError, match="cannot write a free-text slot"):
        classify_slot_tokens(["a", "b"], special_ids=())


def test_slot_choice_allows_a_prefix_free_text_and_its_closing():
    vocabulary = classify_slot_tokens(SLOT_TEXTS, special_ids={0})
    choices = (SlotChoice((11,), (10,), vocabulary), (11, 1))  # "[<...>]h" and "[a"
    trie = ChoiceTrie(choices, end_id=0)
    assert trie.max_length is None
    steps = allowed_tokens(choices, [11, 1, 2, 3, 10, 0], 0)
    assert [_marked(step).nonzero().flatten().tolist() for step in steps] == [
        [11],
        vocabulary.opening.nonzero().flatten().tolist(),
        [0, 1, 2, 3, 4, 10, 11],  # "[a" may end here, or the slot text go on
        [1, 2, 3, 4, 10, 11],
        [10],
        [0],
    ]
    assert allowed_tokens(choices, [11, 4, 10, 0], 0)[-1].ids == (0,)  # "d]" writes text and closes
    for off in ([11, 3], [11, 1, 5], [11, 1, 6], [11, 1, 3, 0], [10]):  # empty text, "]e", newline, ...
        with pytest.raises(ValueError, match="not one of the allowed choices"):
            allowed_tokens(choices, off, 0)


def test_slots_are_found_and_turned_into_one_regular_expression():
    assert split_slot("search[<your query>]")[:2] == ("search[", "]")
    assert split_slot("<action>search[<your query>]</action>")[:2] == ("<action>search[", "]</action>")
    assert split_slot("click[< prev]") is None and split_slot("click[next >]") is None
    with pytest.raises(ValueError, match="at most one free-text slot"):
        split_slot("a[<x>] b[<y>]")
    regex = re.compile(choices_regex(["<action>search[<your query>]</action>", "click[< prev] (1.5)"]))
    for text in ("<action>search[red shoes]</action>", "<action>search[<your query>]</action>"):
        assert regex.fullmatch(text)
    assert regex.fullmatch("click[< prev] (1.5)") and not regex.fullmatch("click[< prev] (155)")
    for text in (
        "<action>search[]</action>",
        "<action>search[a]b]</action>",
        "<action>search[a\nb]</action>",
    ):
        assert not regex.fullmatch(text)


@pytest.mark.parametrize("response_format", ["plain", "think_action"])
def test_constrained_decoding_always_yields_admissible_actions(tiny, response_format):
    model, tokenizer, _ = tiny
    prompts, admissible = _prompts(response_format, 12)
    torch.manual_seed(0)
    generator = HFGenerator(model, tokenizer, GenerationConfig(max_new_tokens=64, batch_size=5))
    for temperature in (3.0, 0.0):  # near-uniform sampling, and greedy
        for generation, replies in zip(generator.generate(prompts, admissible, temperature), admissible):
            assert generation.text in replies
            commands = [hgpo_env.parse_response(reply, response_format).action for reply in replies]
            assert hgpo_env.parse_response(generation.text, response_format).action in commands
            assert generation.response_ids[-1] == generator.encoder.end_id
            assert generation.choices is not None
            allowed_tokens(generation.choices, generation.response_ids, generator.encoder.end_id)


def test_unconstrained_generation_keeps_token_ids_and_prompts(tiny):
    model, tokenizer, _ = tiny
    prompts, _ = _prompts("plain", 4)
    generator = HFGenerator(model, tokenizer, GenerationConfig(max_new_tokens=5))
    for prompt, generation in zip(prompts, generator.generate(prompts)):
        assert generation.choices is None and 1 <= len(generation.response_ids) <= 5
        assert generation.prompt_ids == generator.encoder.prompt_ids(prompt)
        assert (
            tokenizer.decode(generation.prompt_ids).count("<|im_start|>") == 2
        )  # user turn + assistant header


def test_rollout_records_one_row_per_step_with_the_prompts_fingerprints(tiny):
    model, tokenizer, _ = tiny
    env = EnvConfig(
        name="rooms", response_format="plain", max_steps=5, num_workers=1, history_length=2, kwargs=ROOMS
    )
    generator = HFGenerator(model, tokenizer, GenerationConfig(max_new_tokens=16))
    pool = make_pool(env, 2, 3, seed=0)
    try:
        torch.manual_seed(0)
        batch = collect_rollouts(pool, generator, seeds=[11, 12], constrained=True, response_format="plain")
    finally:
        pool.close()
    assert len(batch.episodes) == 6 and len(batch) == batch.episodes.length.sum()
    assert batch.fingerprints.shape == (len(batch), 3) and batch.fingerprints.dtype == np.uint64
    assert not batch.invalid.any()  # constrained: every action admissible
    first = batch.step == 0
    for group in (0, 1):  # all members of a group start from the same prompt and state
        rows = first & (batch.group_id == group)
        assert len({tuple(batch.prompt_ids[i]) for i in np.flatnonzero(rows)}) == 1
        assert len(set(batch.fingerprints[rows, 0])) == 1
    assert (batch.fingerprints[first, 1:] == 0).all()  # no history shown at step 0
    assert (batch.fingerprints[batch.step >= 2] != 0).all()
    for g, t in {(g, t) for g, t in zip(batch.group_id, batch.traj_id)}:
        rows = np.flatnonzero((batch.group_id == g) & (batch.traj_id == t))
        assert batch.step[rows].tolist() == list(range(len(rows)))  # chronological
        # each step's next state is the state the next step acts in; the last one's is the terminal one
        assert (batch.next_state[rows[:-1]] == batch.fingerprints[rows[1:], 0]).all()
        assert batch.next_state[rows[-1]] != 0
        # every row carries how its rollout ended, as the episode summary says
        (episode,) = np.flatnonzero((batch.episodes.group_id == g) & (batch.episodes.traj_id == t))
        won, truncated = batch.episodes.won[episode], batch.episodes.truncated[episode]
        expected = "won" if won else "truncated" if truncated else "lost"
        assert set(batch.outcome[rows]) == {expected}
    assert set(batch.outcome) >= {"truncated"}  # a tiny random model runs out of its 5 steps
    # one action key per command played, constrained to admissible ones: the key is the command's
    commands = [
        " ".join(tokenizer.decode(ids, skip_special_tokens=True).lower().split())
        for ids in batch.response_ids
    ]
    assert (
        len(set(zip(commands, batch.action_key.tolist()))) == len(set(commands)) == len(set(batch.action_key))
    )
    assert (batch.action_key != 0).all()
    assert set(batch.extras["timing"]) == {"env_s", "generate_s"}
    assert batch.metrics()["rollout/invalid_rate"] == 0.0


# --------------------------------------------------------------------------- free-text slots (WebShop search)

WEBSHOP_SEARCH_PAGE = [[SEARCH_PLACEHOLDER], [SEARCH_PLACEHOLDER, "click[back to search]"]]
"""The search page's admissible list, and one that mixes the slot with a plain command."""


def _closing_biased(model: torch.nn.Module, closing: torch.Tensor, bias: float = 6.0) -> torch.nn.Module:
    """A copy of ``model`` whose LM head favours the tokens that close a slot, so that a random
    model's sampled queries end after a few tokens instead of running into the length cap."""
    biased = copy.deepcopy(model)
    head = biased.get_output_embeddings()
    biased_head = torch.nn.Linear(head.in_features, head.out_features, bias=True)
    with torch.no_grad():
        biased_head.weight.copy_(head.weight)
        biased_head.bias.copy_(bias * closing[: head.out_features].float())
    biased.set_output_embeddings(biased_head)
    return biased


def _recorded_sampler_masks(monkeypatch) -> list[torch.Tensor]:
    """Patches :class:`ChoiceLogitsProcessor` to record, per generation step, which tokens it left
    open: (B, V) bool, True where the sampler could pick the token."""
    masks: list[torch.Tensor] = []
    original = ChoiceLogitsProcessor.__call__

    def recording(self, input_ids, scores):
        out = original(self, input_ids, scores)
        masks.append(torch.isfinite(out))
        return out

    monkeypatch.setattr(ChoiceLogitsProcessor, "__call__", recording)
    return masks


def _search_query(text: str, response_format: str) -> str | None:
    """The query of a response in the slot's language (``search[`` text ``]``), else None."""
    command = r"search\[([^\]\n]+)\]"
    match = re.fullmatch(command if response_format == "plain" else f"<action>{command}</action>", text)
    return match.group(1) if match else None


@pytest.mark.parametrize("response_format", ["plain", "think_action"])
def test_constrained_search_writes_a_query_that_webshop_accepts(
    tiny, shared_data, tmp_path, monkeypatch, response_format
):
    model, tokenizer, _ = tiny
    monkeypatch.setenv("HGPO_DATA", str(tmp_path))  # the env's search index cache
    env = gym.make("HGPO-WebShop-v0", data_path=str(shared_data / "webshop"), response_format=response_format)
    prompt, info = env.reset(options={"task_id": 0})
    assert info["admissible_actions"] == [SEARCH_PLACEHOLDER]
    config = GenerationConfig(max_new_tokens=24, batch_size=16)
    generator = HFGenerator(_closing_biased(model, slot_vocabulary(tokenizer).closing), tokenizer, config)
    end_id = generator.encoder.end_id
    admissible = [[action_reply(c, response_format) for c in WEBSHOP_SEARCH_PAGE[i % 2]] for i in range(16)]
    sampled = _recorded_sampler_masks(monkeypatch)
    torch.manual_seed(0)
    generations = generator.generate([prompt] * 16, admissible)  # one prompt: rows keep their order
    searches = []
    for generation, page in zip(generations, WEBSHOP_SEARCH_PAGE * 8):
        assert isinstance(generation.choices[0], SlotChoice)
        if generation.response_ids[-1] != end_id:  # cut at the length cap, which the env rejects
            assert len(generation.response_ids) == config.max_new_tokens
            continue
        query = _search_query(generation.text, response_format)
        if query is None:
            assert hgpo_env.parse_response(generation.text, response_format).action in page
        else:
            searches.append((generation.text, query))
    assert len(searches) >= 8  # most close their query well before the cap
    # the update's masks are the sampler's, at every position of every response
    batch = step_batch(
        [np.asarray(g.prompt_ids) for g in generations],
        [np.asarray(g.response_ids) for g in generations],
        [g.choices for g in generations],
    )
    micro = make_micro_batch(batch, range(16), generator.pad_id, end_id, len(tokenizer), torch.device("cpu"))
    for row, generation in enumerate(generations):
        for position in range(len(generation.response_ids)):
            assert torch.equal(micro.allowed[row, position], sampled[position][row]), (row, position)
    # the env takes a sampled search (queries of spaces or control characters are its to reject)
    text = next(text for text, query in searches if query.strip() and query.isprintable())
    _, _, _, _, info = env.step(text)
    assert info["action_valid"] and "click[back to search]" in info["admissible_actions"]
    env.close()


def test_constrained_search_call_writes_a_query_that_webshop_accepts(
    tiny, shared_data, tmp_path, monkeypatch
):
    """Under tool calls the query is sampled inside the call as its format writes it: every
    closed response is one well-formed search call, and the env takes it. One format of each
    slot kind: a JSON string (``hermes``; ``llama3``'s is the same kind) and an XML parameter."""
    model, tokenizer, _ = tiny
    monkeypatch.setenv("HGPO_DATA", str(tmp_path))  # the env's search index cache, built once
    for call_format in ("hermes", "qwen_xml"):
        env = gym.make(
            "HGPO-WebShop-v0",
            data_path=str(shared_data / "webshop"),
            prompt_format="chat",
            response_format="tool_call",
            call_format=call_format,
        )
        messages, info = env.reset(options={"task_id": 0})
        replies = reply_choices(info, "tool_call")
        (search,) = replies
        closing = slot_vocabulary(tokenizer, split_slot(search).kind).closing
        fixed = len(tokenizer.encode(search.replace("<your query>", ""), add_special_tokens=False))
        generator = HFGenerator(
            _closing_biased(model, closing), tokenizer, GenerationConfig(max_new_tokens=fixed + 12)
        )
        torch.manual_seed(0)
        generations = generator.generate([ChatPrompt.of(messages, info)] * 4, [replies] * 4)
        closed = [g for g in generations if g.response_ids[-1] == generator.encoder.end_id]
        assert len(closed) >= 2, call_format
        tools = env.get_wrapper_attr("agent_tools").tools
        calls = [parse_tool_call(g.text, tools, call_format) for g in closed]
        assert all(c.status == "ok" and c.call.name == "search" for c in calls), [g.text for g in closed]
        for generation in closed:
            allowed_tokens(generation.choices, generation.response_ids, generator.encoder.end_id)
        text = next(g.text for g, c in zip(closed, calls) if c.call.arguments["query"].strip().isprintable())
        _, _, _, _, info = env.step(text)
        assert info["parse"] == "ok" and info["action_valid"], info
        env.close()


def test_a_slot_that_never_closes_is_cut_at_max_new_tokens(tiny):
    model, tokenizer, _ = tiny
    never_closes = _closing_biased(model, slot_vocabulary(tokenizer).closing, bias=-100.0)
    generator = HFGenerator(never_closes, tokenizer, GenerationConfig(max_new_tokens=12))
    torch.manual_seed(0)
    for generation in generator.generate(["find red shoes"] * 3, [[SEARCH_PLACEHOLDER]] * 3):
        assert len(generation.response_ids) == 12 and generation.response_ids[-1] != generator.encoder.end_id
        assert generation.text.startswith("search[") and "]" not in generation.text
        allowed_tokens(
            generation.choices, generation.response_ids, generator.encoder.end_id
        )  # on the language


# --------------------------------------------------------------------------- vLLM glue


class _FakeLLM:
    """Records the engine calls; 'generates' the first command of the choice trie, ``slot_reply``
    for a regex (checked against it), or a fixed id list."""

    instances: ClassVar[list[_FakeLLM]] = []

    def __init__(self, **kwargs):
        self.kwargs = kwargs
        self.loaded = None
        _FakeLLM.instances.append(self)

    def generate(self, prompts, params, use_tqdm=False):
        outs = []
        for prompt, p in zip(prompts, params):
            structured = p.kwargs.get("structured_outputs") or p.kwargs.get("guided_decoding")
            trie = (p.kwargs.get("extra_args") or {}).get(CHOICES_KEY)
            if trie:  # the choice-trie processor: the first command, in its own tokens
                ids = list(trie[0])
            elif structured is None:
                ids = [5, 6]
            else:
                ids = self.slot_reply
                assert re.fullmatch(structured.regex, self.tokenizer.decode(ids))
            outs.append(
                types.SimpleNamespace(
                    outputs=[types.SimpleNamespace(token_ids=ids, finish_reason="stop", logprobs=None)]
                )
            )
        return outs

    def apply_model(self, func):
        model = types.SimpleNamespace(load_weights=lambda weights: setattr(self, "loaded", dict(weights)))
        return [func(model)]


class _Params:
    def __init__(self, **kwargs):
        self.kwargs = kwargs


def _structured(choice: list[str] | None = None, regex: str | None = None) -> types.SimpleNamespace:
    return types.SimpleNamespace(choice=choice, regex=regex)


@pytest.fixture
def fake_vllm(monkeypatch):
    """A stand-in ``vllm`` package (vLLM needs a GPU and is not installed here)."""
    vllm = types.ModuleType("vllm")
    vllm.LLM, vllm.SamplingParams = _FakeLLM, _Params
    vllm.platforms = types.SimpleNamespace(  # as on a GPU machine
        current_platform=types.SimpleNamespace(device_type="cuda", is_cpu=lambda: False)
    )
    sampling = types.ModuleType("vllm.sampling_params")
    sampling.StructuredOutputsParams = _structured
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.sampling_params", sampling)
    _FakeLLM.instances.clear()
    return vllm


def test_vllm_generator_glue_with_a_stub_module(tiny, fake_vllm):
    model, tokenizer, path = tiny
    config = GenerationConfig(backend="vllm", max_new_tokens=7, vllm_gpu_memory_utilization=0.3)
    generator = VLLMGenerator(str(path), tokenizer, config, seed=3, dtype="bfloat16")
    llm = _FakeLLM.instances[-1]
    llm.tokenizer = tokenizer
    assert (
        llm.kwargs["model"] == str(path)
        and llm.kwargs["seed"] == 3
        and llm.kwargs["gpu_memory_utilization"] == 0.3
    )
    prompts, admissible = _prompts("plain", 3)
    out = generator.generate(prompts, admissible)
    for generation, commands in zip(out, admissible):
        assert generation.text == commands[0]
        assert generation.response_ids[-1] == generator.encoder.end_id  # the stop token is kept for training
        assert generation.choices == generator.encoder.choices(commands)
    free = generator.generate(prompts[:1])[0]
    assert free.choices is None and free.response_ids == [5, 6, generator.encoder.end_id]
    generator.sync_weights(model)
    assert set(llm.loaded) == set(model.state_dict())


def _sampling(generator, commands):
    """The ``SamplingParams`` keywords of one constrained prompt."""
    return vllm_requests(generator.encoder, generator.config, ["find red shoes"], [commands], 1.0)[0].sampling


def test_vllm_constrains_a_slot_with_a_regex_and_checks_replies_on_the_trie(tiny, fake_vllm, monkeypatch):
    _, tokenizer, path = tiny
    generator = VLLMGenerator(str(path), tokenizer, GenerationConfig(backend="vllm"))
    llm = _FakeLLM.instances[-1]
    llm.tokenizer = tokenizer
    commands = [SEARCH_PLACEHOLDER, "click[< prev]"]
    structured = _sampling(generator, commands)["structured_outputs"]
    assert structured.choice is None and structured.regex == choices_regex(commands)
    without_slot = _sampling(generator, commands[1:])  # the trie, in vLLM's engine
    assert "structured_outputs" not in without_slot
    assert without_slot["extra_args"] == choice_args(
        generator.encoder.choices(commands[1:]), generator.encoder.end_id
    )
    assert _FakeLLM.instances[-1].kwargs["logits_processors"] == [CHOICES_PROCESSOR]
    prefix = generator.encoder.choices(commands)[0].prefix
    as_the_trie = [*prefix, *tokenizer.encode("red shoes]", add_special_tokens=False)]
    char_by_char = tokenizer.convert_tokens_to_ids(list("search[red]"))  # same language, other tokens
    for reply, on_trie in ((as_the_trie, True), (char_by_char, False)):
        llm.slot_reply = reply
        generation = generator.generate(["find red shoes"], [commands])[0]
        assert generation.text.startswith("search[red") and (generation.choices is not None) == on_trie
    sampling = sys.modules["vllm.sampling_params"]  # vLLM < 0.11: guided decoding, same arguments
    monkeypatch.delattr(sampling, "StructuredOutputsParams")
    monkeypatch.setattr(sampling, "GuidedDecodingParams", _structured, raising=False)
    assert _sampling(generator, commands)["guided_decoding"].regex == choices_regex(commands)


def test_vllm_missing_gives_an_actionable_error(monkeypatch, tiny):
    monkeypatch.setitem(sys.modules, "vllm", None)  # import fails
    with pytest.raises(ImportError, match="needs vLLM: pip install vllm .* scripts/setup_openrlhf_cpu.sh"):
        VLLMGenerator("x", tiny[1], GenerationConfig(backend="vllm"))


def test_vllm_without_its_device_names_the_cpu_build(tiny, fake_vllm):
    fake_vllm.platforms.current_platform.device_type = ""  # vLLM's UnspecifiedPlatform
    with pytest.raises(RuntimeError, match="vLLM's CPU build: bash scripts/setup_openrlhf_cpu.sh"):
        VLLMGenerator("x", tiny[1], GenerationConfig(backend="vllm"))


def test_merged_state_dict_of_a_lora_model_has_base_names(tiny):
    _, _, path = tiny
    lora = load_policy(
        ModelConfig(dtype="float32", lora_rank=4, lora_target_modules=["q_proj", "v_proj"]),
        str(path),
        torch.device("cpu"),
    )
    base = load_policy(ModelConfig(dtype="float32"), str(path), torch.device("cpu"))
    with torch.no_grad():
        for name, param in lora.named_parameters():
            if "lora_B" in name:
                param.fill_(0.01)  # make the adapters matter
    merged = merged_state_dict(lora)
    assert set(merged) == set(base.state_dict())
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(merged[q], base.state_dict()[q])
    assert torch.equal(merged["model.embed_tokens.weight"], base.state_dict()["model.embed_tokens.weight"])
    assert not any("lora" in n for n in merged)
    assert "base_layer" in "".join(n for n, _ in lora.named_parameters())  # unmerged again afterwards


def test_progress_lines_are_throttled(monkeypatch):
    """Runs without a progress bar (the OpenRLHF trainer actor) get a line at most every ``every`` s."""
    import io

    from hgpo_train.rollout import collect as rollout

    clock = iter([0.0, 1.0, 10.5, 11.0, 25.0])
    monkeypatch.setattr(rollout.time, "monotonic", lambda: next(clock))
    stream = io.StringIO()
    show = rollout.progress_lines("iteration 3 rollout", 128, every=10.0, stream=stream)
    for turn in range(1, 6):
        show(turn, 128 - turn, 128 * turn)
    assert stream.getvalue().splitlines() == [
        "iteration 3 rollout: turn 1, 127/128 episodes running, 128 steps",
        "iteration 3 rollout: turn 3, 125/128 episodes running, 384 steps",
        "iteration 3 rollout: turn 5, 123/128 episodes running, 640 steps",
    ]


def test_every_vllm_generation_starts_alike(tiny):
    """In process or on OpenRLHF's engines: prompts encoded once, the same stop tokens (end of turn
    and EOS) as HF generation, the response budget shrunk to fit ``max_len``, and no room refused."""
    from hgpo_train.rollout.generation import PromptEncoder, PromptTooLongError

    _, tokenizer, _ = tiny
    encoder = PromptEncoder(tokenizer)
    config = GenerationConfig(max_new_tokens=16, top_p=0.9)
    prompts, admissible = _prompts("plain", 2)
    first, second = vllm_requests(encoder, config, prompts, admissible, None)
    assert second.replies == admissible[1] and second.prompt_ids == encoder.prompt_ids(prompts[1])
    assert first.prompt_ids == encoder.prompt_ids(prompts[0])
    assert (
        first.sampling["stop_token_ids"] == encoder.end_ids == HFGenerator(tiny[0], tokenizer, config).end_ids
    )
    assert (first.sampling["temperature"], first.sampling["top_p"], first.sampling["max_tokens"]) == (
        1.0,
        0.9,
        16,
    )
    assert first.replies == admissible[0] and "extra_args" in first.sampling  # the commands' trie
    fitted = vllm_requests(encoder, config, prompts[:1], None, 0.5, max_len=len(first.prompt_ids) + 3)[0]
    assert (fitted.sampling["max_tokens"], fitted.sampling["temperature"], fitted.replies) == (3, 0.5, None)
    with pytest.raises(PromptTooLongError, match="openrlhf.max_len"):
        vllm_requests(encoder, config, prompts[:1], None, None, max_len=len(first.prompt_ids))
