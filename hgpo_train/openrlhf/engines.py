"""The rollout generator over OpenRLHF's vLLM engine actors.

It implements the shared rollout's ``Generator`` protocol, so :func:`hgpo_train.rollout.collect_rollouts`
drives the envs exactly as in the single-machine trainer. Prompts are chat-templated and
tokenised once here (the shared :class:`~hgpo_train.generation.PromptEncoder`) and sent as token ids
to ``RolloutRayActor.generate`` (vllm_engine.py line 153), so the ids trained on are the ids the
engine saw. Consecutive prompts (members of one task group) go to the same engine, where they
share cached prefixes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import ray

from hgpo_train.config import GenerationConfig
from hgpo_train.generation import (
    CHOICES_PROCESSOR,
    Generation,
    PromptEncoder,
    constrained_sampling,
    vllm_generation,
)


class PromptTooLongError(ValueError):
    """A prompt leaves no room for a response within ``openrlhf.max_len``."""


def vllm_sampling_params(**kwargs: Any) -> Any:
    """``vllm.SamplingParams(**kwargs)``; vllm is imported here only."""
    import vllm

    return vllm.SamplingParams(**kwargs)


class EngineGenerator:
    """Samples one response per prompt on the engines; ``sync_weights`` is the trainer's broadcast.

    ``admissible`` constrains responses to the commands' token trie inside the engines (their
    logits processor, :func:`engine_actor`), exactly as the local ``generation.backend=vllm`` does
    (:func:`~hgpo_train.generation.constrained_sampling`).
    """

    def __init__(
        self,
        engines: Sequence[Any],
        tokenizer: Any,
        config: GenerationConfig,
        response_format: str,
        max_len: int,
        make_params: Callable[..., Any] = vllm_sampling_params,
    ) -> None:
        if not engines:
            raise ValueError(
                "the openrlhf backend needs at least one vLLM engine (openrlhf.vllm_num_engines)"
            )
        self.engines = list(engines)
        self.config = config
        self.max_len = max_len
        self.make_params = make_params
        self.encoder = PromptEncoder(tokenizer, response_format)
        eos = tokenizer.eos_token_id
        self.end_ids = sorted({self.encoder.end_id} | ({eos} if eos is not None else set()))

    def generate(
        self,
        prompts: Sequence[str],
        admissible: Sequence[Sequence[str]] | None = None,
        temperature: float | None = None,
    ) -> list[Generation]:
        temperature = self.config.temperature if temperature is None else temperature
        encoded = [self.encoder.prompt_ids(p) for p in prompts]
        refs = []
        for i, ids in enumerate(encoded):
            room = self.max_len - len(ids)
            if room < 1:
                raise PromptTooLongError(
                    f"a prompt of {len(ids)} tokens leaves no room for a response within openrlhf.max_len="
                    f"{self.max_len}; set env.max_prompt_tokens (the memory window then shrinks to fit)"
                )
            params = self.make_params(
                temperature=temperature,
                top_p=self.config.top_p,
                max_tokens=min(self.config.max_new_tokens, room),
                stop_token_ids=self.end_ids,
                **constrained_sampling(self.encoder, admissible[i] if admissible else None),
            )
            engine = self.engines[i * len(self.engines) // len(encoded)]
            refs.append(engine.generate.remote(ids, params))
        outputs = ray.get(refs)
        return [
            vllm_generation(
                self.encoder, ids, output.outputs[0], self.end_ids, admissible[i] if admissible else None
            )
            for i, (ids, output) in enumerate(zip(encoded, outputs))
        ]


def engine_actor(worker_extension_cls: str | None = None) -> Any:
    """OpenRLHF's ``RolloutRayActor`` whose vLLM engine loads the choice-trie logits processor
    (constrained decoding), and on CPU ``worker_extension_cls`` (the weight receiver)."""
    from openrlhf.trainer.ray import vllm_engine

    base = vllm_engine.RolloutRayActor.__ray_actor_class__

    class HGPORolloutActor(base):  # type: ignore[misc, valid-type]
        async def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["logits_processors"] = [*(kwargs.get("logits_processors") or []), CHOICES_PROCESSOR]
            if worker_extension_cls:
                kwargs["worker_extension_cls"] = worker_extension_cls
            await super().__init__(*args, **kwargs)

    return ray.remote(HGPORolloutActor)


def install_engine_actor(worker_extension_cls: str | None = None) -> None:
    """Make OpenRLHF's launcher create :func:`engine_actor` engines (in the driver, once)."""
    from openrlhf.trainer.ray import vllm_engine

    if not getattr(vllm_engine, "_hgpo_engine_actor", False):
        vllm_engine.RolloutRayActor = engine_actor(worker_extension_cls)
        vllm_engine._hgpo_engine_actor = True
