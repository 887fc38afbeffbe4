"""Constrained log-probs in OpenRLHF's models: the masked logits give the local trainer's
renormalised log-probs and entropy (no OpenRLHF needed: the mask is applied to plain logits)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_train_loss import step_batch

from hgpo_train.openrlhf.constraints import constraint_table, masked_logits, sequence_key
from hgpo_train.rollout.batch import StepBatch
from hgpo_train.rollout.constrained import allowed_tokens
from hgpo_train.update.loss import token_logprobs

END, VOCAB = 9, 12
CHOICES = ((3, 4), (3, 5, 6), (7,))


def batch_of(prompts: list[list[int]], responses: list[list[int]], choices: list) -> StepBatch:
    return step_batch(
        [np.array(p, np.int32) for p in prompts], [np.array(r, np.int32) for r in responses], choices
    )


def test_masked_logits_give_the_local_renormalised_logprobs_and_entropy() -> None:
    prompts, responses = [[1, 2, 2], [1, 1]], [[3, 5, 6, END], [7, END]]
    batch = batch_of(prompts, responses, [CHOICES, CHOICES])
    table = constraint_table(batch, END)
    width = max(len(p) + len(r) for p, r in zip(prompts, responses))
    sequences = torch.zeros((2, width), dtype=torch.long)  # OpenRLHF's layout: [prompt | response | pad]
    attention = torch.zeros((2, width), dtype=torch.long)
    for b, (p, r) in enumerate(zip(prompts, responses)):
        sequences[b, : len(p) + len(r)] = torch.tensor(p + r)
        attention[b, : len(p) + len(r)] = 1
    keys = [sequence_key(sequences[b][attention[b].bool()].numpy()) for b in range(2)]
    assert set(keys) == set(table)  # both sides key a sample by the same token ids
    logits = torch.randn(2, width, VOCAB, requires_grad=True)
    rows = [(b, len(prompts[b]), allowed_tokens(CHOICES, responses[b], END)) for b in range(2)]
    masked = masked_logits(logits, rows)
    for b, (p, r) in enumerate(zip(prompts, responses)):
        positions = torch.arange(len(r)) + len(p) - 1
        theirs = torch.log_softmax(masked[b, positions], dim=-1).gather(-1, torch.tensor(r)[:, None])[:, 0]
        allowed = torch.zeros(len(r), VOCAB, dtype=torch.bool)
        for t, tokens in enumerate(rows[b][2]):
            tokens.mark(allowed[t])
        ours, entropy = token_logprobs(logits[b, positions][None], torch.tensor(r)[None], allowed[None], 1.0)
        torch.testing.assert_close(theirs, ours[0])
        probs = torch.softmax(masked[b, positions], dim=-1)  # OpenRLHF's compute_entropy, written out
        their_entropy = torch.logsumexp(masked[b, positions], -1) - (probs * masked[b, positions]).sum(-1)
        torch.testing.assert_close(their_entropy, entropy[0])
    after_3 = torch.softmax(masked[0, 3], -1)  # the position that predicts the token after 3
    assert set(torch.nonzero(after_3 > 0)[:, 0].tolist()) == {4, 5}
    assert masked[0, 0].equal(logits[0, 0])  # prompt positions untouched
    masked[:, :, 0].sum().backward()  # differentiable, out of place
    assert logits.grad is not None


def test_only_constrained_rows_are_in_the_table() -> None:
    batch = batch_of([[1], [2]], [[7, END], [8, END]], [CHOICES, None])
    table = constraint_table(batch, END)
    assert list(table) == [sequence_key(np.array([1, 7, END]))]
    assert table[sequence_key(np.array([1, 7, END]))][:2] == (1, (7, END))
    with pytest.raises(KeyError):
        table[sequence_key(np.array([2, 8, END]))]
