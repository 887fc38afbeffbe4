"""Choice-constrained sampling inside vLLM: the command trie as a vLLM logits processor.

vLLM's structured outputs (a ``choice`` list) accept a command in *any* tokenisation: a model
may spell ``go north`` letter by letter. The update renormalises over the trie of each
command's own tokenisation (:mod:`hgpo_train.rollout.constrained`), so such a sample cannot be trained
as constrained, and an untrained model produces mostly such samples. This processor makes vLLM
sample exactly what the trie allows, as the Hugging Face path does: each request's commands
travel as token ids in ``SamplingParams.extra_args`` (:func:`hgpo_train.rollout.constrained.choice_args`)
and its engine masks,
position by position, every token the trie does not allow. Engines load it with
``logits_processors=[hgpo_train.rollout.generation.CHOICES_PROCESSOR]``; requests without the key are left alone. Commands with a free-text
slot (WebShop's ``search[<your query>]``) still go through structured outputs (a regex).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from vllm.v1.sample.logits_processor import AdapterLogitsProcessor

from hgpo_train.rollout.constrained import CHOICES_KEY, END_KEY, ChoiceTrie


class ChoiceTrieProcessor(AdapterLogitsProcessor):
    """Masks, request by request, what the request's :class:`ChoiceTrie` does not allow next."""

    def is_argmax_invariant(self) -> bool:
        return False

    def new_req_logits_processor(
        self, params: Any
    ) -> Callable[[list[int], torch.Tensor], torch.Tensor] | None:
        args = params.extra_args or {}
        if CHOICES_KEY not in args:
            return None
        trie = ChoiceTrie(tuple(tuple(c) for c in args[CHOICES_KEY]), int(args[END_KEY]))
        state, seen = trie.start(), 0

        def constrain(output_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
            nonlocal state, seen
            if len(output_ids) < seen:  # the request was restarted (preemption): replay it
                state, seen = trie.start(), 0
            for token in output_ids[seen:]:
                state = trie.advance(state, token)
            seen = len(output_ids)
            allowed = torch.zeros(logits.shape[-1], dtype=torch.bool)
            trie.allowed(state).mark(allowed)
            return logits.masked_fill(~allowed.to(logits.device), float("-inf"))

        return constrain
