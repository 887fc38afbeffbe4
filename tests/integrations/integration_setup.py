"""What the integration tests share: small Rooms tasks and a tiny chat model trained on their text."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from hgpo_train.advantage import (
    AdvantageConfig,
    crbc_advantages,
    episode_scores,
    g2po_advantages,
    gigpo_advantages,
    graph_returns,
    grpo_advantages,
    hgpo_advantages,
    step_returns,
)

ENV_ID = "HGPO-Rooms-v0"
ROOMS = {"min_rooms": 2, "max_rooms": 3, "lock_probability": 0.0}
"""Small Rooms tasks: episodes of a few steps."""


def tiny_chat_model(out_dir: Path) -> str:
    """A random-weight Qwen2 and its tokenizer (ChatML template, end of turn ``<|im_end|>``), saved to ``out_dir``."""
    from hgpo_train.config import EnvConfig, TinyModelConfig
    from hgpo_train.tiny_model import build_tiny_model

    env = EnvConfig(name="rooms", response_format="plain", max_steps=4, kwargs=ROOMS)
    tiny = TinyModelConfig(hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2, vocab_size=400)
    return str(build_tiny_model(env, tiny, out_dir, seed=0))


def import_error_without(monkeypatch, adapter: str, framework: str) -> str:
    """The message of importing ``adapter`` afresh while ``framework`` cannot be imported."""
    import importlib
    import sys

    import pytest

    monkeypatch.setitem(sys.modules, framework, None)  # None in sys.modules: import raises ImportError
    monkeypatch.delitem(sys.modules, adapter, raising=False)  # restored after the test
    with pytest.raises(ImportError) as raised:
        importlib.import_module(adapter)
    return str(raised.value)


def reference_advantages(
    rewards: Sequence[float],
    rollouts: Sequence[str],
    groups: Sequence[object],
    invalid: Sequence[bool],
    fingerprints: np.ndarray,
    config: AdvantageConfig,
    next_states: Sequence[int] | None = None,
    action_keys: Sequence[int] | None = None,
    won: Sequence[bool] | None = None,
) -> np.ndarray:
    """The configured estimator from its own function in hgpo_train.advantage, on raw step columns
    (rows of a rollout in chronological order), independently of the adapters' code paths."""
    scores = episode_scores(rewards, rollouts, invalid, config.invalid_penalty)
    if config.estimator == "grpo":
        return grpo_advantages(scores, groups, config.mode)
    if config.estimator == "crbc":
        return crbc_advantages(rewards, rollouts, groups, fingerprints, action_keys, won, invalid, config)
    if config.estimator == "g2po":
        return g2po_advantages(
            rewards, rollouts, groups, fingerprints, invalid, config.mode, config.gamma,
            config.invalid_penalty, config.step_weight, config.success_reward,
        )  # fmt: skip
    if config.returns == "graph":
        returns = graph_returns(
            rewards, rollouts, groups, fingerprints[:, 0], next_states, config.gamma, invalid,
            config.invalid_penalty, config.normalize_distance,
        )  # fmt: skip
    else:
        returns = step_returns(rewards, rollouts, config.gamma, invalid, config.invalid_penalty)
    if config.estimator in ("gigpo", "graphgpo"):
        return gigpo_advantages(
            returns, scores, groups, fingerprints, config.mode, config.step_weight, config.episode_weight
        )
    return hgpo_advantages(
        returns,
        groups,
        fingerprints,
        config.mode,
        config.alpha,
        config.base_group,
        scores,
        config.weight_offset,
    )
