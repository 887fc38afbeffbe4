"""What the integration tests share: small Rooms tasks and a tiny chat model trained on their text."""

from __future__ import annotations

from pathlib import Path

ENV_ID = "HGPO-Rooms-v0"
ROOMS = {"min_rooms": 2, "max_rooms": 3, "lock_probability": 0.0}
"""Small Rooms tasks: episodes of a few steps."""


def tiny_chat_model(out_dir: Path) -> str:
    """A random-weight Qwen2 and its tokenizer (ChatML template, end of turn ``<|im_end|>``), saved to ``out_dir``."""
    from hgpo_train.config import EnvConfig, TinyModelConfig
    from hgpo_train.update.tiny_model import build_tiny_model

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
