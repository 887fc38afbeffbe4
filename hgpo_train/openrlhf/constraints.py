"""Constrained decoding's log-probabilities in OpenRLHF's policy and reference models.

The local trainer trains the constrained distribution: at each response position the update
renormalises log-probabilities over the tokens the choice trie allowed there
(:mod:`hgpo_train.rollout.constrained`). OpenRLHF's ``Actor.forward`` computes log-probs, entropy and
KL over the whole vocabulary and has no way to take a per-token mask. So in a constrained run:

* the controller puts each iteration's constraints in a named Ray actor (:class:`ConstraintStore`):
  per step sample, keyed by a hash of its token ids, the prompt length, the response and its
  choices;
* every DeepSpeed actor of the run (policy and reference, on any node) has ``Actor.forward``
  wrapped (:func:`install`, applied by the run's Ray setup hook when ``openrlhf.models.actor`` is
  imported): for the rows of a forward pass that the store knows, the logits of the positions
  that predict response tokens keep their allowed tokens and the others are set to the dtype's
  lowest value, so OpenRLHF's log-softmax, entropy and KL are those of the constrained
  distribution, as in the local trainer.

A row the store does not know (an unconstrained run, a response vLLM tokenised other than the
trie, the engine–policy gap's probes, for which the store is emptied) runs unchanged.
"""

from __future__ import annotations

import functools
import os
import types
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import xxhash

from hgpo_train.openrlhf.patching import patch_modules
from hgpo_train.rollout.batch import StepBatch
from hgpo_train.rollout.constrained import AllowedSet, allowed_tokens

STORE_NAME = "hgpo_constraints"
ENV_VAR = "HGPO_CONSTRAINED_DECODING"
"""Set to 1 in every actor of a constrained run (the runtime env): :func:`install` then applies."""

Entry = tuple[int, tuple[int, ...], Any, int]
"""(prompt length, response ids, choices, end token id) of one step sample."""


def sequence_key(ids: np.ndarray) -> int:
    """The key of a sample's token ids (prompt then response), as both sides compute it."""
    return xxhash.xxh3_64_intdigest(np.ascontiguousarray(ids, dtype=np.int64).tobytes())


def constraint_table(batch: StepBatch, end_id: int) -> dict[int, Entry]:
    """The constrained rows of ``batch``, by :func:`sequence_key`."""
    table = {}
    for row, choices in enumerate(batch.choices):
        if choices is None:
            continue
        prompt, response = batch.prompt_ids[row], batch.response_ids[row]
        key = sequence_key(np.concatenate([prompt, response]))
        table[key] = (len(prompt), tuple(int(t) for t in response), choices, end_id)
    return table


class ConstraintStore:
    """The current iteration's constraints, for the DeepSpeed actors (a named Ray actor)."""

    def __init__(self) -> None:
        self.version, self.table = 0, {}

    def put(self, table: dict[int, Entry]) -> None:
        self.version, self.table = self.version + 1, table

    def get(self, version: int) -> tuple[int, dict[int, Entry] | None]:
        """(current version, its table), the table None when the caller has this version."""
        return self.version, (self.table if version != self.version else None)


def start_store() -> Any:
    """The run's store, named so that actors on every node find it."""
    import ray

    return ray.remote(num_cpus=0)(ConstraintStore).options(name=STORE_NAME).remote()


class _Client:
    """An actor process's view of the store: the table of the latest version, fetched when it changes."""

    def __init__(self) -> None:
        self.handle: Any = None
        self.version = -1
        self.table: dict[int, Entry] = {}

    def current(self) -> dict[int, Entry]:
        import ray

        if self.handle is None:
            self.handle = ray.get_actor(STORE_NAME)
        version, table = ray.get(self.handle.get.remote(self.version))
        if table is not None:
            self.version, self.table = version, table
            allowed_at.cache_clear()
        return self.table


@functools.lru_cache(maxsize=4096)
def allowed_at(key: int) -> list[AllowedSet]:
    """The allowed tokens at each response position of the stored sample ``key``."""
    _, response, choices, end_id = _CLIENT.table[key]
    return allowed_tokens(choices, response, end_id)


_CLIENT = _Client()


def masked_logits(logits: torch.Tensor, rows: Sequence[tuple[int, int, list[AllowedSet]]]) -> torch.Tensor:
    """``logits`` (B, T, V) with, for each (row, prompt length, allowed sets), every token the set
    does not allow at a response position set to the lowest value (out of place, for autograd;
    one row's (R, V) mask at a time, so a 150k vocabulary stays small)."""
    out = logits.clone()
    for b, prompt_length, allowed in rows:
        keep = torch.zeros((len(allowed), logits.shape[-1]), dtype=torch.bool)
        for t, tokens in enumerate(allowed):
            tokens.mark(keep[t])
        positions = torch.arange(len(allowed), device=logits.device) + prompt_length - 1  # predict token t
        out[b, positions] = logits[b, positions].masked_fill(
            ~keep.to(logits.device), torch.finfo(logits.dtype).min
        )
    return out


def constrained_rows(
    sequences: torch.Tensor, attention_mask: torch.Tensor
) -> list[tuple[int, int, list[AllowedSet]]]:
    """The rows of a forward pass the store knows, with their prompt lengths and allowed sets."""
    table = _CLIENT.current()
    if not table:
        return []
    rows = []
    ids, mask = sequences.cpu().numpy(), attention_mask.cpu().numpy().astype(bool)
    for b in range(len(ids)):
        key = sequence_key(ids[b][mask[b]])
        if key in table:
            rows.append((b, table[key][0], allowed_at(key)))
    return rows


def constrained_forward(original: Any) -> Any:
    """``Actor.forward`` whose model logits are masked on the rows the store knows."""

    @functools.wraps(original)
    def forward(
        self: Any,
        sequences: torch.Tensor,
        action_mask: Any = None,
        attention_mask: Any = None,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        rows = constrained_rows(sequences, attention_mask) if attention_mask is not None else []
        if not rows:
            return original(self, sequences, action_mask, attention_mask, *args, **kwargs)

        def mask_output(module: Any, inputs: Any, output: Any) -> Any:
            output["logits"] = masked_logits(output["logits"], rows)
            return output

        hook = self.model.register_forward_hook(mask_output)
        try:
            return original(self, sequences, action_mask, attention_mask, *args, **kwargs)
        finally:
            hook.remove()

    return forward


def patch_actor(module: types.ModuleType) -> None:
    module.Actor.forward = constrained_forward(module.Actor.forward)


def install() -> None:
    """Wrap ``Actor.forward`` in this process when it runs a constrained run (idempotent)."""
    if os.environ.get(ENV_VAR) != "1" or getattr(install, "done", False):
        return
    install.done = True  # type: ignore[attr-defined]
    patch_modules({"openrlhf.models.actor": patch_actor})
