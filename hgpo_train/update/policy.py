"""A run's policy and its generator: what training and a stand-alone evaluation both start from."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hgpo_train.config import Config
from hgpo_train.rollout.generation import VLLMGenerator, make_generator
from hgpo_train.update.modeling import load_policy, load_tokenizer


def base_model_path(config: Config, run_dir: Path) -> str:
    """``model.name_or_path``, or the tiny model built (once) into the run folder."""
    if config.model.name_or_path != "tiny":
        return config.model.name_or_path
    from hgpo_train.update.tiny_model import build_tiny_model

    path = run_dir / "tiny_model"
    if not (path / "config.json").is_file():
        build_tiny_model(config.env, config.tiny, path, seed=config.train.seed)
    return str(path)


@dataclass
class LoadedPolicy:
    model: Any
    tokenizer: Any
    base_path: str
    checkpoint: Path | None


def load_run_policy(
    config: Config, run_dir: Path, device: torch.device, checkpoint: Path | None
) -> LoadedPolicy:
    """The policy of a run: the base model, or the weights/adapters of ``checkpoint``."""
    base = base_model_path(config, run_dir)
    tokenizer = load_tokenizer(base, config.model.trust_remote_code)
    torch.manual_seed(config.train.seed)  # LoRA initialisation
    if checkpoint is None:
        model = load_policy(config.model, base, device)
    elif config.model.lora_rank > 0:
        model = load_policy(config.model, base, device, adapter_dir=checkpoint / "model")
    else:
        model = load_policy(config.model, str(checkpoint / "model"), device)
    return LoadedPolicy(model, tokenizer, base, checkpoint)


def build_generator(config: Config, loaded: LoadedPolicy, *, training: bool = True) -> Any:
    """The configured generation backend, holding the loaded policy's current weights. The ``hf``
    backend samples with the trained model itself, or, in an asynchronous run (whose rollouts
    sample while the update changes the model), with a frozen copy of it; ``training=False``
    (an evaluation alone: nothing changes the model) never copies it."""
    model = loaded.model
    if config.generation.backend == "hf" and config.train.async_staleness and training:
        model = copy.deepcopy(model).requires_grad_(False)
    generator = make_generator(
        config.generation.backend,
        model,
        loaded.tokenizer,
        config.generation,
        model_path=loaded.base_path,
        seed=config.train.seed,
        dtype=config.model.dtype,
    )
    if isinstance(generator, VLLMGenerator):  # the hf generator's are scored by the trainer
        generator.record_logprobs = config.update.off_policy_correction != "off"
    if loaded.checkpoint is not None:
        generator.sync_weights(loaded.model)
    return generator
