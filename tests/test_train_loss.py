"""The PPO loss, k3 KL, constrained log-probs, and token-mean aggregation over micro-batches."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from hgpo_train.config import UpdateConfig
from hgpo_train.rollout.batch import Episodes, StepBatch
from hgpo_train.rollout.constrained import SlotChoice, classify_slot_tokens
from hgpo_train.update.loss import off_policy_weights, ppo_loss, token_logprobs
from hgpo_train.update.modeling import Reference
from hgpo_train.update.ppo import PolicyUpdater, make_micro_batch

END = 1
VOCAB = 48
SLOT = classify_slot_tokens(["<pad>", "<end>", *"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRS", "]"], {0, 1})
"""A slot vocabulary over the test model's 48 tokens: 0 and 1 special, 2..46 letters, 47 ``]``."""
SEARCH = SlotChoice((7, 8), (9,), SLOT)
"""Tokens 7 8, slot text, ``]``, token 9."""


def _loss(logp, old, ref, adv, **kw):
    mask = torch.ones_like(logp, dtype=torch.bool)
    options = {"clip_ratio": 0.2, "kl_coef": 0.0, "entropy_coef": 0.0, "num_tokens": logp.numel(), **kw}
    return ppo_loss(logp, old, ref, adv, torch.zeros_like(logp), mask, **options)


def test_unclipped_loss_is_minus_token_mean_advantage():
    logp = torch.log(torch.tensor([[0.5, 0.25], [0.1, 0.9]]))
    adv = torch.tensor([[1.0], [-2.0]])
    terms = _loss(logp, logp.clone(), None, adv)
    assert terms.loss.item() == pytest.approx(-(1 + 1 - 2 - 2) / 4)
    assert terms.sums["clip_frac"] == 0


def test_clipping_stops_the_gradient_outside_the_trust_region():
    old = torch.log(torch.tensor([[0.5]]))
    for new_p, adv, has_grad in [(0.7, 1.0, False), (0.55, 1.0, True), (0.3, -1.0, False), (0.3, 1.0, True)]:
        logp = torch.log(torch.tensor([[new_p]])).requires_grad_()
        _loss(logp, old, None, torch.tensor([[adv]])).loss.backward()
        assert (logp.grad.abs().item() > 0) == has_grad, (new_p, adv)


def test_k3_kl_is_zero_at_the_reference_and_positive_elsewhere():
    logp = torch.log(torch.tensor([[0.5, 0.2]]))
    zero = _loss(logp, logp, logp.clone(), torch.zeros(1, 1), kl_coef=1.0)
    assert zero.sums["kl_ref"] == pytest.approx(0.0, abs=1e-7)
    ref = torch.log(torch.tensor([[0.4, 0.3]]))
    kl = _loss(logp, logp, ref, torch.zeros(1, 1), kl_coef=1.0)
    r = ref - logp
    assert kl.sums["kl_ref"] == pytest.approx(float((r.exp() - r - 1).sum()), rel=1e-5)
    assert kl.loss.item() == pytest.approx(kl.sums["kl_ref"] / 2, rel=1e-5)


@pytest.mark.parametrize(
    ("correction", "weights", "caught"),
    [  # row 1 weighs 1, 10, 1/4 (geometric mean 2.5 ** (1/3), inside); row 2 weighs 1/10, 1/5
        ("tis", [[1.0, 5.0, 0.5], [0.5, 0.5, 0.0]], [[0, 1, 1], [1, 1, 0]]),
        ("icepop", [[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]], [[0, 1, 1], [1, 1, 0]]),
        ("seq_mask", [[1.0, 10.0, 0.25], [0.0, 0.0, 0.0]], [[0, 0, 0], [1, 1, 0]]),
    ],
)
def test_off_policy_weights_follow_openrlhfs_rules(correction, weights, caught):
    old = torch.log(torch.tensor([[0.5, 0.5, 0.5], [0.1, 0.1, 0.1]]))
    ratio = torch.tensor([[1.0, 10.0, 0.25], [0.1, 0.2, 1.0]])  # pi_old / pi_behaviour
    mask = torch.tensor([[True, True, True], [True, True, False]])  # row 2's last column: padding
    weight, outside = off_policy_weights(old, old - ratio.log(), mask, correction, (0.5, 5.0))
    weight = weight * mask  # what the loss reads
    assert torch.allclose(weight, torch.tensor(weights), rtol=1e-5)
    assert (outside & mask).tolist() == torch.tensor(caught, dtype=torch.bool).tolist()


def test_the_correction_scales_the_surrogate_and_a_token_without_a_behaviour_log_prob_weighs_one():
    logp = torch.log(torch.tensor([[0.5, 0.25]]))
    old, adv = logp.clone(), torch.tensor([[2.0]])
    behaviour = torch.log(torch.tensor([[0.25, float("nan")]]))  # weights 2 and (no log-prob) 1
    terms = _loss(logp, old, None, adv, behaviour_logp=behaviour, correction="tis")
    assert terms.loss.item() == pytest.approx(-(2 * 2 + 2) / 2)
    assert terms.sums["off_policy_filtered"] == 0
    assert terms.sums["behaviour_kl"] == pytest.approx(float(np.log(0.25) - np.log(0.5)))
    with pytest.raises(ValueError, match="needs the sampler's log-probs"):
        _loss(logp, old, None, adv, correction="icepop")


def test_constrained_logprobs_renormalise_over_the_allowed_tokens():
    logits = torch.randn(1, 2, 6)
    allowed = torch.zeros(1, 2, 6, dtype=torch.bool)
    allowed[0, 0, [1, 3]] = True
    allowed[0, 1] = True  # unconstrained position
    targets = torch.tensor([[3, 4]])
    logp, entropy = token_logprobs(logits, targets, allowed, temperature=1.0)
    expected = torch.log_softmax(logits[0, 0, [1, 3]], -1)[1]
    assert logp[0, 0].item() == pytest.approx(expected.item(), rel=1e-5)
    assert logp[0, 1].item() == pytest.approx(torch.log_softmax(logits[0, 1], -1)[4].item(), rel=1e-5)
    assert entropy[0, 0].item() <= np.log(2) + 1e-6 and torch.isfinite(entropy).all()
    hot, _ = token_logprobs(logits, targets, None, temperature=2.0)
    assert hot[0, 1].item() == pytest.approx(torch.log_softmax(logits[0, 1] / 2, -1)[4].item(), rel=1e-5)


def step_batch(prompt_ids: list[np.ndarray], response_ids: list[np.ndarray], choices: list) -> StepBatch:
    """Update rows of these ids and choices; the columns the update does not read are filler."""
    n, empty = len(response_ids), np.zeros(0)
    return StepBatch(
        group_id=np.zeros(n, np.int64),
        traj_id=np.arange(n),
        step=np.zeros(n, np.int64),
        reward=np.zeros(n),
        invalid=np.zeros(n, bool),
        fingerprints=np.ones((n, 1), np.uint64),
        next_state=np.ones(n, np.uint64),
        action_key=np.ones(n, np.uint64),
        outcome=np.full(n, "lost"),
        prompt_ids=prompt_ids,
        response_ids=response_ids,
        choices=choices,
        episodes=Episodes(empty, empty, [], [], empty, empty, empty, empty, empty, empty, empty),
    )


def _batch(n: int = 10, seed: int = 0) -> StepBatch:
    rng = np.random.default_rng(seed)
    responses = [
        np.append(rng.integers(2, 40, size=rng.integers(1, 4)), END).astype(np.int32) for _ in range(n)
    ]
    choices = []
    for i, r in enumerate(responses):  # half the rows constrained to their own response and a decoy
        choices.append((tuple(r[:-1].tolist()), (7, 8)) if i % 2 else None)
    for i in range(0, n, 4):  # and some a search with a free-text query
        query = rng.integers(2, 47, size=rng.integers(1, 5))
        responses[i] = np.array([7, 8, *query, 47, 9, END], np.int32)
        choices[i] = (SEARCH, (7, 3))
    prompts = [rng.integers(2, 40, size=rng.integers(3, 9)).astype(np.int32) for _ in range(n)]
    return step_batch(prompts, responses, choices)


@pytest.mark.parametrize("mini_batch_size", [10, 4])
def test_micro_batch_size_does_not_change_the_update(mini_batch_size):
    torch.manual_seed(0)
    base = Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=48,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=2,
            tie_word_embeddings=True,
        )
    )
    batch, advantages = _batch(), np.linspace(-1, 1, 10)
    results = []
    for micro in (1, 3, mini_batch_size):
        model = copy.deepcopy(base)
        config = UpdateConfig(lr=1e-2, kl_coef=0.05, mini_batch_size=mini_batch_size, micro_batch_size=micro)
        updater = PolicyUpdater(
            model,
            Reference(model),
            torch.optim.SGD(model.parameters(), lr=1e-2),
            config,
            pad_id=0,
            end_id=END,
            temperature=1.0,
        )
        metrics = updater.update(batch, advantages, np.random.default_rng(0))
        results.append((dict(model.named_parameters()), metrics))
    (first, m1), *others = results
    for params, metrics in others:
        for name, value in params.items():
            torch.testing.assert_close(value, first[name], rtol=1e-5, atol=1e-6)
        assert metrics["update/loss"] == pytest.approx(m1["update/loss"], rel=1e-4, abs=1e-7)
    assert m1["update/optimizer_steps"] == (1 if mini_batch_size == 10 else 3)


def test_micro_batch_masks_follow_the_sampler_inside_a_slot():
    batch = _batch()
    micro = make_micro_batch(batch, [0, 1, 2], 0, END, VOCAB, torch.device("cpu"))
    search, fixed, free = micro.allowed  # rows 0 (search), 1 (own response or (7, 8)), 2 (unconstrained)
    query = len(batch.response_ids[0]) - 5
    assert search[0].nonzero().flatten().tolist() == [7]
    assert search[1].nonzero().flatten().tolist() == [3, 8]  # the decoy (7, 3) may still end
    assert torch.equal(search[2], SLOT.opening)  # the first query token: any letter, no bare "]"
    for position in range(3, 3 + query):
        assert torch.equal(search[position], SLOT.continuing)
    assert search[3 + query].nonzero().flatten().tolist() == [9]
    assert search[4 + query].nonzero().flatten().tolist() == [END]
    assert free.all() and fixed[: len(batch.response_ids[1])].sum(-1).max() <= 2
    logp, _ = token_logprobs(torch.zeros(3, search.shape[0], VOCAB), micro.targets, micro.allowed, 1.0)
    assert logp[0, 2].item() == pytest.approx(-np.log(45))  # renormalised over the 45 letters
