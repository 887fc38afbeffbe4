"""Per-token log-probabilities and the PPO loss with a k3 KL term, an entropy bonus and the
off-policy correction of tokens another policy sampled.

Aggregation is the token mean over a whole mini-batch: each micro-batch's token losses are
summed and divided by the mini-batch's token count, so gradient accumulation over micro-batches
gives exactly the gradient of the mini-batch's token mean.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hgpo_train.config import OffPolicyCorrection

KL_CLAMP = 20.0
"""Bound on the log-ratio inside the k3 estimator, so one extreme token cannot explode the loss."""


def token_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, allowed: torch.Tensor | None, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probability of each target token and the entropy at each position.

    ``logits`` (B, T, V) predict ``targets`` (B, T). ``allowed`` (B, T, V, bool) restricts the
    distribution to the tokens constrained decoding allowed there (a row of all True is
    unconstrained), so the policy trained is the one that sampled.
    """
    logits = logits.float()
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    if allowed is not None:
        logits = logits.masked_fill(~allowed, float("-inf"))
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    p = logp_all.exp()
    entropy = -(p * logp_all.masked_fill(p == 0, 0.0)).sum(-1)
    return logp, entropy


def off_policy_weights(
    old_logp: torch.Tensor,
    behaviour_logp: torch.Tensor,
    mask: torch.Tensor,
    correction: OffPolicyCorrection,
    bounds: tuple[float, float],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's importance weight pi_old / pi_behaviour under ``correction``, and which tokens
    the bounds caught (weight clipped, or token or response dropped).

    The rule is OpenRLHF 0.11's ``PolicyLoss`` with ratio gating, so both backends weigh a token
    alike: ``tis`` clamps the weight into ``bounds``; ``icepop`` zeroes a token whose weight is
    outside; ``seq_mask`` zeroes every token of a response whose geometric-mean weight (over
    ``mask``) is outside, the others keeping their own weights. All tensors are (B, T).
    """
    low, high = bounds
    log_weight = (old_logp - behaviour_logp).detach()
    weight = log_weight.exp()
    gated = weight
    if correction == "seq_mask":
        real = mask.float()
        mean_log = (log_weight * real).sum(-1) / real.sum(-1).clamp(min=1)
        gated = mean_log.exp().unsqueeze(-1).expand_as(weight)
    outside = (gated < low) | (gated > high)
    if correction == "tis":
        return gated.clamp(low, high), outside
    return torch.where(outside, 0.0, weight), outside


@dataclass
class LossTerms:
    """The loss of a micro-batch (already scaled for accumulation) and per-token sums for logging."""

    loss: torch.Tensor
    sums: dict[str, float]


def ppo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    ref_logp: torch.Tensor | None,
    advantages: torch.Tensor,
    entropy: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_ratio: float,
    kl_coef: float,
    entropy_coef: float,
    num_tokens: int,
    behaviour_logp: torch.Tensor | None = None,
    correction: OffPolicyCorrection = "off",
    bounds: tuple[float, float] = (0.5, 5.0),
) -> LossTerms:
    """Clipped surrogate (times :func:`off_policy_weights` unless ``correction`` is off) +
    ``kl_coef`` * k3 KL to the reference - ``entropy_coef`` * entropy.

    All tensors are (B, T) over response tokens; ``advantages`` is the row's advantage
    broadcast to its tokens; ``num_tokens`` is the mini-batch's token count (the token mean);
    ``behaviour_logp`` the log-probs the sampler recorded.
    """
    real = mask
    mask = mask.float()
    log_ratio = logp - old_logp
    ratio = torch.exp(log_ratio)
    surrogate = torch.maximum(
        -advantages * ratio, -advantages * torch.clamp(ratio, 1.0 - clip_ratio, 1.0 + clip_ratio)
    )
    off_policy: dict[str, float] = {}
    if correction != "off":
        if behaviour_logp is None:
            raise ValueError(f"off_policy_correction={correction} needs the sampler's log-probs")
        # a token the sampler gave no log-prob for (NaN) weighs 1
        behaviour = torch.where(torch.isnan(behaviour_logp), old_logp.detach(), behaviour_logp)
        weights, outside = off_policy_weights(old_logp, behaviour, real, correction, bounds)
        surrogate = surrogate * weights
        off_policy = {
            "off_policy_filtered": float((outside.float() * mask).sum()),
            "behaviour_kl": float(((behaviour - old_logp) * mask).sum()),
        }
    per_token = surrogate - entropy_coef * entropy
    kl = torch.zeros_like(logp)
    if ref_logp is not None and kl_coef > 0:
        ref_log_ratio = torch.clamp(ref_logp - logp, -KL_CLAMP, KL_CLAMP)
        kl = torch.exp(ref_log_ratio) - ref_log_ratio - 1.0  # k3: unbiased, always >= 0
        per_token = per_token + kl_coef * kl
    loss = (per_token * mask).sum() / num_tokens
    with torch.no_grad():
        clipped = ((ratio - 1.0).abs() > clip_ratio).float()
        sums = {
            "loss": float(loss) * num_tokens,
            "pg_loss": float((surrogate * mask).sum()),
            "kl_ref": float((kl * mask).sum()),
            "entropy": float((entropy * mask).sum()),
            "clip_frac": float((clipped * mask).sum()),
            "approx_kl_old": float((0.5 * log_ratio.pow(2) * mask).sum()),
            **off_policy,
        }
    return LossTerms(loss, sums)
