"""Loading the policy and tokenizer, LoRA, and the frozen reference for the KL term.

Every model, the tiny local one included, is loaded with ``from_pretrained``; a name that is
neither a local folder nor reachable on the Hub fails with a message that says what to do.
"""

from __future__ import annotations

import contextlib
import copy
import os
import socket
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from hgpo_train.config import ModelConfig


class ModelLoadError(RuntimeError):
    """The model or tokenizer could not be loaded (missing folder, no network, gated repo)."""


def resolve_device(name: str) -> torch.device:
    """``auto`` is the first GPU when there is one, else the CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"train.device={name} but no CUDA device is available")
    return device


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, name)


HUB_PROBE_TIMEOUT = 3.0
"""Seconds to wait for the Hub before saying it is unreachable (instead of its minute of retries)."""


def _hub_unreachable() -> str | None:
    """Why the Hub (``$HF_ENDPOINT``) cannot be reached now, or None when it answers a connection."""
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        return "HF_HUB_OFFLINE is set"
    endpoint = urllib.parse.urlsplit(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    port = endpoint.port or (443 if endpoint.scheme == "https" else 80)
    try:
        socket.create_connection((endpoint.hostname or "", port), timeout=HUB_PROBE_TIMEOUT).close()
    except OSError as error:
        return f"{endpoint.geturl()} is unreachable ({error})"
    return None


def _load(loader: Any, name: str, **kwargs: Any) -> Any:
    path = Path(name).expanduser()
    if name.startswith(("/", ".", "~")) or path.exists():  # a path, never a hub name: no hub retries
        if not path.exists():
            raise ModelLoadError(f"model {name!r}: no such path")
        if path.is_dir() and not (path / "config.json").is_file():
            raise ModelLoadError(f"model {name!r}: a folder without a model in it (no config.json)")
    else:  # a hub name: the local cache first, then the Hub only if it answers
        with contextlib.suppress(OSError, ValueError):
            return loader.from_pretrained(name, local_files_only=True, **kwargs)
        reason = _hub_unreachable()
        if reason is not None:
            raise ModelLoadError(
                f"model {name!r} is not in the local cache and {reason}: pass --model a local folder "
                "(`python -m hgpo_train tiny-model --env rooms --out DIR` builds one offline) or set "
                "model.name_or_path=tiny"
            )
    try:
        return loader.from_pretrained(name, **kwargs)
    except (OSError, ValueError) as error:
        where = "local folder" if Path(name).exists() else "local folder or Hugging Face Hub model"
        raise ModelLoadError(
            f"cannot load {name!r} as a {where}: {error}\n"
            "Pass --model with a local path or a reachable hub name; offline, build a tiny model with "
            "`python -m hgpo_train tiny-model --env rooms --out DIR` or set model.name_or_path=tiny."
        ) from error


def load_tokenizer(name_or_path: str, trust_remote_code: bool = False) -> Any:
    """The tokenizer, with left padding (generation) and a pad token."""
    from transformers import AutoTokenizer

    tokenizer = _load(AutoTokenizer, name_or_path, trust_remote_code=trust_remote_code)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_policy(
    config: ModelConfig, name_or_path: str, device: torch.device, adapter_dir: str | Path | None = None
) -> Any:
    """The trainable causal LM, LoRA-wrapped when ``lora_rank > 0``.

    ``adapter_dir`` restores saved LoRA adapters (a resumed run); full weights are restored by
    passing the checkpoint folder as ``name_or_path``.
    """
    from transformers import AutoModelForCausalLM

    dtype = resolve_dtype(config.dtype, device)
    model = _load(AutoModelForCausalLM, name_or_path, dtype=dtype, trust_remote_code=config.trust_remote_code)
    model.to(device)
    if config.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    if config.lora_rank > 0:
        from peft import LoraConfig, PeftModel, get_peft_model

        if adapter_dir is not None:
            model = PeftModel.from_pretrained(model, str(adapter_dir), is_trainable=True)
        else:
            lora = LoraConfig(
                r=config.lora_rank,
                lora_alpha=config.lora_alpha,
                lora_dropout=config.lora_dropout,
                target_modules=config.lora_target_modules,
                task_type="CAUSAL_LM",
            )
            model = get_peft_model(model, lora)
    model.train()
    return model


class Reference:
    """The frozen reference policy of the KL term.

    With LoRA it is the policy's own base model with the adapters disabled (no second copy);
    otherwise ``initial`` (the initial weights, loaded again on resume) or, by default, a frozen
    copy of the policy as it is now.
    """

    def __init__(self, policy: Any, initial: Any = None) -> None:
        self._shares_base = hasattr(policy, "disable_adapter")
        if self._shares_base:
            self.model = policy
        else:
            self.model = (initial if initial is not None else copy.deepcopy(policy)).eval()
            self.model.requires_grad_(False)

    @contextlib.contextmanager
    def active(self) -> Iterator[Any]:
        """A context in which ``model`` computes the reference distribution."""
        if self._shares_base:
            with self.model.disable_adapter():
                yield self.model
        else:
            yield self.model
