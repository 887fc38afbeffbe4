"""The policy update: old and reference log-probs, then PPO over mini- and micro-batches.

A micro-batch lays out each sample as ``[left padding | prompt | response | right padding]``,
so every response starts at the same column and the LM head runs on the response columns only
(``logits_to_keep``): with a 150k vocabulary, logits over whole prompts would not fit.
Position ids come from the attention mask, as in left-padded generation.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from hgpo_train.config import UpdateConfig
from hgpo_train.rollout.batch import StepBatch
from hgpo_train.rollout.constrained import allowed_tokens
from hgpo_train.update.loss import ppo_loss, token_logprobs
from hgpo_train.update.modeling import Reference


@dataclass
class MicroBatch:
    rows: np.ndarray
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    targets: torch.Tensor
    """(B, R) response tokens, padded."""
    mask: torch.Tensor
    """(B, R) True on real response tokens."""
    allowed: torch.Tensor | None
    """(B, R, V) tokens constrained decoding allowed, None when no row was constrained."""


def make_micro_batch(
    batch: StepBatch, rows: Sequence[int], pad_id: int, end_id: int, vocab_size: int, device: torch.device
) -> MicroBatch:
    """Tensors for ``rows`` of ``batch`` in the prompt-left / response-right layout."""
    rows = np.asarray(rows)
    width_p = max(len(batch.prompt_ids[i]) for i in rows)
    width_r = max(len(batch.response_ids[i]) for i in rows)
    b = len(rows)
    input_ids = torch.full((b, width_p + width_r), pad_id, dtype=torch.long)
    attention = torch.zeros((b, width_p + width_r), dtype=torch.long)
    targets = torch.full((b, width_r), pad_id, dtype=torch.long)
    mask = torch.zeros((b, width_r), dtype=torch.bool)
    constrained = any(batch.choices[i] is not None for i in rows)
    allowed = torch.ones((b, width_r, vocab_size), dtype=torch.bool) if constrained else None
    for k, i in enumerate(rows):
        prompt, response = batch.prompt_ids[i], batch.response_ids[i]
        input_ids[k, width_p - len(prompt) : width_p] = torch.from_numpy(prompt.astype(np.int64))
        input_ids[k, width_p : width_p + len(response)] = torch.from_numpy(response.astype(np.int64))
        attention[k, width_p - len(prompt) : width_p + len(response)] = 1
        targets[k, : len(response)] = torch.from_numpy(response.astype(np.int64))
        mask[k, : len(response)] = True
        if allowed is not None and batch.choices[i] is not None:
            allowed[k, : len(response)] = False
            for t, tokens in enumerate(allowed_tokens(batch.choices[i], response.tolist(), end_id)):
                tokens.mark(allowed[k, t])  # slot positions: a whole vocabulary mask at once
    position_ids = (attention.cumsum(-1) - 1).clamp(min=0)
    return MicroBatch(
        rows,
        input_ids.to(device),
        attention.to(device),
        position_ids.to(device),
        targets.to(device),
        mask.to(device),
        allowed.to(device) if allowed is not None else None,
    )


def forward_logprobs(
    model: torch.nn.Module, micro: MicroBatch, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(logp, entropy), each (B, R), of the micro-batch's response tokens under ``model``."""
    width_r = micro.targets.shape[1]
    out = model(
        input_ids=micro.input_ids,
        attention_mask=micro.attention_mask,
        position_ids=micro.position_ids,
        logits_to_keep=width_r + 1,
        use_cache=False,
    )
    logits = out.logits[:, :width_r]  # the column before each response token predicts it
    return token_logprobs(logits, micro.targets, micro.allowed, temperature)


class PolicyUpdater:
    """Runs the PPO update of one iteration on a :class:`StepBatch` and its advantages."""

    def __init__(
        self,
        model: torch.nn.Module,
        reference: Reference | None,
        optimizer: torch.optim.Optimizer,
        config: UpdateConfig,
        *,
        pad_id: int,
        end_id: int,
        temperature: float,
    ) -> None:
        self.model = model
        self.reference = reference
        self.optimizer = optimizer
        self.config = config
        self.pad_id = pad_id
        self.end_id = end_id
        self.temperature = temperature
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        self.device = next(model.parameters()).device

    def _micro_batches(self, batch: StepBatch, rows: np.ndarray) -> Iterator[MicroBatch]:
        """Micro-batches of ``rows``, similar lengths together to cut padding."""
        lengths = batch.prompt_lengths[rows] + batch.response_lengths[rows]
        rows = rows[np.argsort(lengths, kind="stable")]
        size = self.config.micro_batch_size
        for start in range(0, len(rows), size):
            yield make_micro_batch(
                batch, rows[start : start + size], self.pad_id, self.end_id, self.vocab_size, self.device
            )

    @torch.no_grad()
    def response_logprobs(self, model: torch.nn.Module, batch: StepBatch) -> list[torch.Tensor]:
        """Per-row log-probs of every response token of ``batch`` under ``model``."""
        out = [torch.empty(0)] * len(batch)
        for micro in self._micro_batches(batch, np.arange(len(batch))):
            logp = forward_logprobs(model, micro, self.temperature)[0]
            for k, row in enumerate(micro.rows):
                out[row] = logp[k, : len(batch.response_ids[row])].cpu()
        return out

    def score(
        self, batch: StepBatch, *, old: bool = True
    ) -> tuple[list[torch.Tensor] | None, list[torch.Tensor] | None]:
        """Per-row log-probs of every response token: old (before the update) and reference."""
        old_rows = self.response_logprobs(self.model, batch) if old else None
        ref_rows = None
        if self.reference is not None and self.config.kl_coef > 0:
            with self.reference.active() as reference:
                ref_rows = self.response_logprobs(reference, batch)
        return old_rows, ref_rows

    def update(
        self, batch: StepBatch, advantages: np.ndarray, generator: np.random.Generator
    ) -> dict[str, float]:
        """PPO epochs over shuffled mini-batches; returns token-mean losses and optimizer stats.

        With a single optimizer step (one epoch, one mini-batch) the old log-probs are those of
        that step's own forward pass (detached), which saves a forward pass over the batch.
        """
        if len(batch) == 0:
            return {}
        cfg = self.config
        single_step = cfg.ppo_epochs == 1 and len(batch) <= cfg.mini_batch_size
        old, ref = self.score(batch, old=not single_step)
        totals: dict[str, float] = {}
        num_tokens_all = 0
        grad_norms = []
        for _ in range(cfg.ppo_epochs):
            order = generator.permutation(len(batch))
            for start in range(0, len(order), cfg.mini_batch_size):
                rows = order[start : start + cfg.mini_batch_size]
                num_tokens = int(batch.response_lengths[rows].sum())
                self.optimizer.zero_grad(set_to_none=True)
                for micro in self._micro_batches(batch, rows):
                    logp, entropy = forward_logprobs(self.model, micro, self.temperature)
                    old_logp = logp.detach() if single_step else _pad([old[r] for r in micro.rows], logp)
                    behaviour = None
                    if batch.behaviour_logprobs is not None:
                        behaviour = _pad(
                            [torch.from_numpy(batch.behaviour_logprobs[r]) for r in micro.rows], logp
                        )
                    terms = ppo_loss(
                        logp,
                        old_logp,
                        _pad([ref[r] for r in micro.rows], logp) if ref is not None else None,
                        torch.as_tensor(advantages[micro.rows], dtype=torch.float32, device=logp.device)[
                            :, None
                        ],
                        entropy,
                        micro.mask,
                        clip_ratio=cfg.clip_ratio,
                        kl_coef=cfg.kl_coef,
                        entropy_coef=cfg.entropy_coef,
                        num_tokens=num_tokens,
                        behaviour_logp=behaviour,
                        correction=cfg.off_policy_correction,
                        bounds=cfg.off_policy_bounds,
                    )
                    terms.loss.backward()
                    for key, value in terms.sums.items():
                        totals[key] = totals.get(key, 0.0) + value
                params = [p for p in self.model.parameters() if p.requires_grad]
                max_norm = cfg.max_grad_norm if cfg.max_grad_norm > 0 else math.inf
                grad_norms.append(float(torch.nn.utils.clip_grad_norm_(params, max_norm)))
                self.optimizer.step()
                num_tokens_all += num_tokens
        metrics = {f"update/{key}": value / max(num_tokens_all, 1) for key, value in totals.items()}
        metrics["update/grad_norm"] = float(np.mean(grad_norms))
        metrics["update/optimizer_steps"] = float(len(grad_norms))
        metrics["update/lr"] = float(self.optimizer.param_groups[0]["lr"])
        return metrics


def _pad(rows: list[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    """Ragged per-row values as a (B, R) tensor shaped like ``like`` (zeros past each row's end)."""
    out = torch.zeros_like(like, dtype=torch.float32)
    for k, values in enumerate(rows):
        out[k, : len(values)] = values.to(out.device)
    return out
