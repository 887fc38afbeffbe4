"""The trainer on memory kinds: a compaction's summary turns are rows of the batch, credited by
the estimator and trained like any action (or left out of the update on request); notes ride in
the action replies."""

from __future__ import annotations

import re

import numpy as np
import pytest
from reference_credit import batch_reference_advantages
from test_train_e2e import ROOMS

from hgpo_train.config import load_config
from hgpo_train.local.train import Trainer

COMPACTION = [
    "env.memory=compaction",
    "env.compact_every=2",
    "env.history_length=1",
    "env.max_steps=5",
    "train.iterations=1",
]


def one_iteration(tmp_path, overrides, env="rooms"):
    """One iteration's result and the batch the update was given."""
    trainer = Trainer(load_config(env=env, overrides=[*ROOMS, *overrides, f"train.output_dir={tmp_path}"]))
    updated = []
    update = trainer.updater.update
    trainer.updater.update = lambda batch, *args: updated.append(batch) or update(batch, *args)
    try:
        return trainer.run_iteration(0), updated[0], trainer
    finally:
        trainer.close()


TOOL_CALLS = ["env.prompt_format=chat", "env.response_format=tool_call", "generation.max_new_tokens=24"]


@pytest.mark.parametrize("prompts", [[], TOOL_CALLS], ids=["text", "chat"])
def test_summary_turns_are_credited_and_trained_rows(tmp_path, prompts):
    result, trained, trainer = one_iteration(tmp_path, [*COMPACTION, *prompts])
    batch, metrics = result.batch, result.metrics
    summaries = batch.summary_turn
    assert summaries.any() and not summaries.all()
    assert (batch.reward[summaries] == 0).all()
    assert len(trained) == len(batch)  # trained like any action
    # every estimator sees them as steps: the advantages are the reference's on the whole batch
    expected = batch_reference_advantages(batch, trainer.config.advantage)
    np.testing.assert_allclose(result.advantages, expected, rtol=0, atol=1e-9)
    assert metrics["memory/summary_turns_per_episode"] == summaries.sum() / len(batch.episodes)
    assert metrics["memory/summary_tokens"] == batch.response_lengths[summaries].mean()
    assert_savings_against_the_window(result, trainer)
    # a summary row's level 0 is its request, shared by no action row
    assert not set(batch.fingerprints[summaries, 0]) & set(batch.fingerprints[~summaries, 0])


def test_masked_summaries_stay_out_of_the_update(tmp_path):
    result, trained, _ = one_iteration(tmp_path, [*COMPACTION, "update.train_summaries=false"])
    batch = result.batch
    assert batch.summary_turn.any()
    assert len(trained) == (~batch.summary_turn).sum() and not trained.summary_turn.any()
    assert np.isfinite(result.metrics["update/loss"])


def test_masking_summaries_without_compaction_is_one_line():
    with pytest.raises(
        ValueError, match="update.train_summaries: false masks summary turns, which env.memory: window"
    ):
        load_config(env="rooms", overrides=["update.train_summaries=false"])
    with pytest.raises(
        ValueError, match="compact_every is an option of memory='compaction', not of memory='notes'"
    ):
        load_config(env="rooms", overrides=["env.memory=notes", "env.compact_every=2"])


def test_notes_train_in_the_action_replies(tmp_path):
    free = ["env.memory=notes", "generation.constrained=false", "env.max_steps=3", "train.iterations=1"]
    result, trained, _ = one_iteration(tmp_path, free)
    batch = result.batch
    assert not batch.summary_turn.any() and len(trained) == len(batch)
    assert "memory/summary_turns_per_episode" not in result.metrics
    assert batch.fingerprints.shape[1] == 3 and (batch.fingerprints[:, 2] == 0).all()


def test_constrained_notes_keep_a_shown_fact_and_a_command(tmp_path):
    """Under constrained decoding a notes reply is chosen whole: a note the env offered, then a
    command; so a tiny model's notes are never empty and its commands always admissible."""
    constrained = [
        "env.kwargs={}",
        "env.memory=notes",
        "env.max_steps=3",
        "generation.max_new_tokens=64",
        "train.iterations=1",
    ]
    result, trained, trainer = one_iteration(tmp_path, constrained, env="HGPO-Corridor-v0")
    batch = result.batch
    assert result.metrics["memory/prompt_tokens_saved"] > 0  # notes instead of K = 2 steps
    assert not batch.invalid.any() and len(trained) == len(batch)
    decode = trainer.generator.encoder.decode
    for response in batch.response_ids:
        reply = decode(response)
        assert re.fullmatch(
            r"<notes>[^<]+</notes> (take|drop) (red|blue) key|<notes>[^<]+</notes> go (east|west)", reply
        )


def assert_savings_against_the_window(result, trainer) -> None:
    """memory/prompt_tokens_saved: per action turn, the window's prompt (the env's
    ``window_prompt``, tests/test_memory_kinds.py) encoded as the policy's, less the prompt shown."""
    batch = result.batch
    saved = []
    for row, window in enumerate(batch.window_prompts):
        assert (window is None) == batch.summary_turn[row]
        if window is not None:
            saved.append(len(trainer.generator.encoder.prompt_ids(window)) - len(batch.prompt_ids[row]))
    assert result.metrics["memory/prompt_tokens_saved"] == pytest.approx(np.mean(saved))
    # compaction shows up to K + compact_every - 1 steps and the summary: more than the window
    assert np.mean(saved) < 0
