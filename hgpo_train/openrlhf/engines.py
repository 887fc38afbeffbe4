"""The rollout generator over OpenRLHF's vLLM engine actors.

It implements the shared rollout's ``Generator`` protocol, so :func:`hgpo_train.rollout.collect.collect_rollouts`
drives the envs exactly as in the single-machine trainer. Prompts are chat-templated and
tokenised once here (the shared :class:`~hgpo_train.rollout.generation.PromptEncoder`) and sent as token ids
to ``RolloutRayActor.generate`` (vllm_engine.py line 153), so the ids trained on are the ids the
engine saw. Consecutive prompts (members of one task group) go to the same engine, where they
share cached prefixes.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

import ray

from hgpo_train.config import GenerationConfig
from hgpo_train.openrlhf.process_env import FP32_VAR
from hgpo_train.rollout.episodes import Prompt
from hgpo_train.rollout.generation import (
    CHOICES_PROCESSOR,
    Generation,
    PromptEncoder,
    RequestGenerator,
    VLLMRequest,
    vllm_requests,
)


def vllm_sampling_params(**kwargs: Any) -> Any:
    """``vllm.SamplingParams(**kwargs)``; vllm is imported here only."""
    import vllm

    return vllm.SamplingParams(**kwargs)


class EngineGenerator(RequestGenerator):
    """Samples one response per prompt on the engines; ``sync_weights`` is the trainer's broadcast.

    ``admissible`` constrains responses to the commands' token trie inside the engines (their
    logits processor, :func:`engine_actor`), exactly as the local ``generation.backend=vllm`` does
    (:func:`~hgpo_train.rollout.generation.constrained_sampling`).
    """

    def __init__(
        self,
        engines: Sequence[Any],
        tokenizer: Any,
        config: GenerationConfig,
        max_len: int,
        make_params: Callable[..., Any] = vllm_sampling_params,
        *,
        record_logprobs: bool = False,
    ) -> None:
        if not engines:
            raise ValueError(
                "the openrlhf backend needs at least one vLLM engine (openrlhf.vllm_num_engines)"
            )
        self.engines = list(engines)
        self.config = config
        self.max_len = max_len
        self.make_params = make_params
        self.record_logprobs = record_logprobs
        self.encoder = PromptEncoder(tokenizer)

    def complete(self, requests: Sequence[VLLMRequest]) -> list[Any]:
        refs = [
            self.engines[i * len(self.engines) // len(requests)].generate.remote(
                r.prompt_ids, self.make_params(**r.sampling)
            )
            for i, r in enumerate(requests)
        ]
        return [output.outputs[0] for output in ray.get(refs)]

    def submit(
        self, prompt: Prompt, admissible: Sequence[str] | None, temperature: float | None, group: int
    ) -> Future[Generation]:
        """Start one prompt's generation on the engine of its task group (per-episode agent
        loops, :mod:`hgpo_train.rollout.agent_loop`): the engine batches it with whatever else it runs."""
        [request] = vllm_requests(
            self.encoder,
            self.config,
            [prompt],
            None if admissible is None else [admissible],
            temperature,
            self.max_len,
            self.record_logprobs,
        )
        engine = self.engines[group % len(self.engines)]
        started = engine.generate.remote(request.prompt_ids, self.make_params(**request.sampling)).future()
        done: Future[Generation] = Future()

        def finish(future: Future[Any]) -> None:
            if not done.set_running_or_notify_cancel():  # the rollout was abandoned
                return
            try:
                done.set_result(request.generation(future.result().outputs[0]))
            except Exception as error:  # noqa: BLE001  (the rollout's result() raises it)
                done.set_exception(error)

        started.add_done_callback(finish)
        return done


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
            if os.environ.get(FP32_VAR):  # OpenRLHF asks for bfloat16 engines (vllm_engine.py:273)
                kwargs["dtype"] = "float32"
            await super().__init__(*args, **kwargs)

    return ray.remote(HGPORolloutActor)


def install_engine_actor(worker_extension_cls: str | None = None) -> None:
    """Make OpenRLHF's launcher create :func:`engine_actor` engines (in the driver, once)."""
    from openrlhf.trainer.ray import vllm_engine

    if not getattr(vllm_engine, "_hgpo_engine_actor", False):
        vllm_engine.RolloutRayActor = engine_actor(worker_extension_cls)
        vllm_engine._hgpo_engine_actor = True
