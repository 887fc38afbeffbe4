"""Both backends optimise the same objective: one fixed batch, the same loss and gradients.

The local trainer's loss (``hgpo_train.update.ppo``: the micro-batch layout, ``forward_logprobs`` and
``ppo_loss``) and the loss OpenRLHF's policy actor computes (``ActorPPOTrainer.training_step``
with OpenRLHF's ``Actor`` wrapper, ``PolicyLoss``, k3 KL and entropy terms, with the arguments
OpenRLHF's own parser resolves from the same config) get one fixed batch of step samples:
tokens, masks, advantages, old and reference log-probs; once free, once with every response
one of a few commands (constrained decoding: both sides renormalise over the allowed tokens);
then with each off-policy correction, on behaviour log-probs (as an engine records them) that
put some tokens and responses outside the bounds, one of them missing (NaN, filled by the
experience maker on OpenRLHF's side).
DeepSpeed's engine is the one piece replaced (its ``backward`` is ``loss.backward()`` on a
one-rank gloo group), so the gradients are read straight off the same model's parameters in both.
"""

from __future__ import annotations

import copy
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import CPU_CONFIG
from openrlhf_runs import load_run
from test_train_loss import step_batch

from hgpo_train.config import UpdateConfig
from hgpo_train.openrlhf import cpu
from hgpo_train.openrlhf.arguments import openrlhf_argv, resolve
from hgpo_train.rollout.batch import StepBatch
from hgpo_train.update.loss import off_policy_weights, ppo_loss
from hgpo_train.update.ppo import forward_logprobs, make_micro_batch

SAMPLES = 6
OVERRIDES = ["update.kl_coef=0.05", "update.entropy_coef=0.01", "update.clip_ratio=0.2"]
LOSS_TOLERANCE = 1e-6
GRAD_TOLERANCE = 1e-5
"""Measured: the losses differ by about 2e-8 and the largest gradient entry by about 3e-8 (float32;
the layouts differ: left-padded prompts here, right-padded sequences there)."""


def fixed_batch(rng: np.random.Generator, vocab: int, end_id: int, constrained: bool) -> StepBatch:
    """Random prompts and responses; constrained, each response is one of four commands sharing
    first tokens (so the trie branches), followed by the end token."""
    prompts = [rng.integers(3, vocab, rng.integers(5, 12)).astype(np.int32) for _ in range(SAMPLES)]
    stem = tuple(int(t) for t in rng.integers(3, vocab, 2))
    commands = (stem, (*stem, 7), (stem[0], 11, 12), (13,))
    if constrained:
        picks = [commands[i] for i in rng.integers(0, len(commands), SAMPLES)]
        responses = [np.array([*c, end_id], dtype=np.int32) for c in picks]
    else:
        responses = [
            np.append(rng.integers(3, vocab, rng.integers(1, 6)), end_id).astype(np.int32)
            for _ in range(SAMPLES)
        ]
    return step_batch(prompts, responses, [commands if constrained else None] * SAMPLES)


@pytest.fixture(scope="module")
def one_rank_group(tmp_path_factory: pytest.TempPathFactory) -> None:
    cpu.install()
    store = torch.distributed.FileStore(str(tmp_path_factory.mktemp("store") / "store"), 1)
    torch.distributed.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield
    torch.distributed.destroy_process_group()


def padded(rows: list[torch.Tensor], width: int) -> torch.Tensor:
    return torch.stack([torch.nn.functional.pad(r, (0, width - len(r))) for r in rows])


def local_loss(model: torch.nn.Module, batch: StepBatch, old, ref, adv, update: UpdateConfig, pad_id, end_id):
    vocab = model.get_output_embeddings().weight.shape[0]
    micro = make_micro_batch(batch, np.arange(SAMPLES), pad_id, end_id, vocab, torch.device("cpu"))
    logp, entropy = forward_logprobs(model, micro, temperature=1.0)
    behaviour = None
    if batch.behaviour_logprobs is not None:
        behaviour = padded([torch.from_numpy(b) for b in batch.behaviour_logprobs], logp.shape[1])
    terms = ppo_loss(
        logp,
        padded(old, logp.shape[1]),
        padded(ref, logp.shape[1]),
        torch.as_tensor(adv, dtype=torch.float32)[:, None],
        entropy,
        micro.mask,
        clip_ratio=update.clip_ratio,
        kl_coef=update.kl_coef,
        entropy_coef=update.entropy_coef,
        num_tokens=int(batch.response_lengths.sum()),
        behaviour_logp=behaviour,
        correction=update.off_policy_correction,
        bounds=update.off_policy_bounds,
    )
    terms.loss.backward()
    return terms.loss.detach()


def openrlhf_loss(model: torch.nn.Module, batch: StepBatch, old, ref, adv, args, pad_id: int):
    from openrlhf.models.actor import Actor
    from openrlhf.trainer.ppo_utils.experience import Experience
    from openrlhf.trainer.ray.ppo_actor import ActorPPOTrainer

    from hgpo_train.openrlhf.experience_maker import StepAdvantageMaker
    from hgpo_train.openrlhf.samples import step_experience

    samples = []
    for row in range(SAMPLES):
        sample = step_experience(
            batch.prompt_ids[row],
            batch.response_ids[row],
            0.0,
            float(adv[row]),
            truncated=False,
            behaviour_logprobs=None if batch.behaviour_logprobs is None else batch.behaviour_logprobs[row],
        )
        start, n = len(batch.prompt_ids[row]) - 1, len(batch.response_ids[row])
        for name, values in (("action_log_probs", old[row]), ("base_action_log_probs", ref[row])):
            full = torch.zeros_like(sample.action_mask, dtype=torch.float32)
            full[0, start : start + n] = values
            setattr(sample, name, full)
        samples.append(sample)
    # the maker's one method (its Ray actor groups are not needed): advantages, NaN log-probs filled
    samples = object.__new__(StepAdvantageMaker).compute_advantages_and_returns(samples)
    experience = Experience.concat_experiences(samples, pad_token_id=pad_id)
    seen = {}

    def backward(loss: torch.Tensor, *_: object) -> None:
        seen["loss"] = loss.detach()
        loss.backward()

    strategy = SimpleNamespace(
        args=args,
        ring_attn_group=None,
        backward=backward,
        optimizer_step=lambda *a, **k: None,  # the gradients are compared before any step
        get_grad_norm=lambda *_: 0.0,
    )
    scheduler = SimpleNamespace(get_last_lr=lambda: [args.actor.adam.lr])
    policy = Actor(model, temperature=args.rollout.temperature)
    policy.packing_samples = args.ds.packing_samples  # set only when Actor loads the model itself
    trainer = ActorPPOTrainer(strategy, policy, None, None, scheduler)
    trainer.training_step(experience, kl_ctl=args.algo.kl.init_coef, step=0)
    return seen["loss"]


@pytest.mark.parametrize(
    ("constrained", "correction"),
    [(False, "off"), (True, "off"), (False, "tis"), (False, "icepop"), (False, "seq_mask"), (True, "tis")],
    ids=["free", "constrained", "free-tis", "free-icepop", "free-seq_mask", "constrained-tis"],
)
def test_local_and_openrlhf_losses_and_gradients_match(
    warm_model: str,
    one_rank_group: None,
    constrained: bool,
    correction: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Constrained: OpenRLHF's ``Actor.forward`` as a constrained run wraps it in its actors
    (:mod:`hgpo_train.openrlhf.constraints`), its store's table given directly (no Ray here).
    A correction: OpenRLHF's ``is_correction_*`` arguments come from its parser, as a run's do."""
    from openrlhf.models import actor
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hgpo_train.openrlhf import constraints

    config, cluster = load_run(CPU_CONFIG, [*OVERRIDES, f"update.off_policy_correction={correction}"])
    args = resolve(openrlhf_argv(config, cluster, checkpoint_dir="unused", final_dir="unused"))
    tokenizer = AutoTokenizer.from_pretrained(warm_model)
    base = AutoModelForCausalLM.from_pretrained(warm_model, dtype=torch.float32)
    pad_id, end_id = tokenizer.pad_token_id or 0, tokenizer.convert_tokens_to_ids("<|im_end|>")
    rng = np.random.default_rng(0)
    batch = fixed_batch(rng, base.config.vocab_size, end_id, constrained)
    if constrained:
        monkeypatch.setattr(actor.Actor, "forward", constraints.constrained_forward(actor.Actor.forward))
        table = constraints.constraint_table(batch, end_id)
        monkeypatch.setattr(constraints._CLIENT, "table", table)
        monkeypatch.setattr(constraints._CLIENT, "current", lambda: table)
        constraints.allowed_at.cache_clear()

    with torch.no_grad():  # old and reference log-probs near the current ones: some ratios clip
        micro = make_micro_batch(batch, np.arange(SAMPLES), pad_id, end_id, base.config.vocab_size, "cpu")
        current, _ = forward_logprobs(base, micro, temperature=1.0)
    rows = [current[k, : len(batch.response_ids[k])] for k in range(SAMPLES)]
    old = [r + torch.as_tensor(rng.normal(0, 0.3, len(r)), dtype=torch.float32) for r in rows]
    ref = [r + torch.as_tensor(rng.normal(0, 0.5, len(r)), dtype=torch.float32) for r in rows]
    adv = rng.normal(0, 1, SAMPLES)
    if correction != "off":  # each response shifted as a whole, each token a little more
        shifts = [-1.5, 0.0, 2.0, 0.3, -0.4, 0.8]
        behaviour = [
            (o + s + torch.as_tensor(rng.normal(0, 0.5, len(o)), dtype=torch.float32)).numpy()
            for o, s in zip(old, shifts)
        ]
        behaviour[1][-1] = np.nan  # a token the engine gave no log-prob for
        batch.behaviour_logprobs = behaviour
        width = max(len(o) for o in old)
        mask = padded([torch.ones(len(o)) for o in old], width).bool()
        filled = [torch.from_numpy(np.where(np.isnan(b), o.numpy(), b)) for b, o in zip(behaviour, old)]
        _, outside = off_policy_weights(
            padded(old, width), padded(filled, width), mask, correction, (0.5, 5.0)
        )
        assert 0 < int(outside[mask].sum()) < int(mask.sum())  # the bounds catch some, not all

    local_model, openrlhf_model = copy.deepcopy(base), copy.deepcopy(base)
    local = local_loss(local_model, batch, old, ref, adv, config.update, pad_id, end_id)
    theirs = openrlhf_loss(openrlhf_model, batch, old, ref, adv, args, pad_id)

    assert abs(float(local) - float(theirs)) < LOSS_TOLERANCE, (float(local), float(theirs))
    worst = max(
        float((a.grad - b.grad).abs().max())
        for a, b in zip(local_model.parameters(), openrlhf_model.parameters())
    )
    assert worst < GRAD_TOLERANCE, worst
    assert any(float(p.grad.abs().max()) > 1e-3 for p in local_model.parameters())  # a real gradient
