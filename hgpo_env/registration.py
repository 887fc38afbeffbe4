"""Gymnasium registration: ``gymnasium.make("HGPO-...")`` returns an LLM-ready env.

The made env is ``KStepMemory(ParseResponse(TextEnv))``: observations are prompts, actions are
raw model responses, and ``env.unwrapped`` is the plain text environment. Env classes are named
by import path so that registering does not import heavy engines (ALFWorld, WebShop search).
Making one checks the argument types first, and a missing optional dependency is reported as the
extra to install.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
from collections.abc import Iterator
from typing import Any

import gymnasium as gym

from hgpo_env.actions import ParseResponse
from hgpo_env.arguments import check_argument_types
from hgpo_env.core import TextEnv
from hgpo_env.memory import KStepMemory, Tokenizer

ENV_CLASSES = {
    "HGPO-Rooms-v0": "hgpo_env.envs.rooms:RoomsEnv",
    "HGPO-ALFWorld-v0": "hgpo_env.envs.alfworld:ALFWorldEnv",
    "HGPO-WebShop-v0": "hgpo_env.envs.webshop:WebShopEnv",
}


EXTRAS = {"hgpo_env.envs.alfworld": "alfworld", "hgpo_env.envs.webshop": "webshop"}
"""Env package -> the pip extra that installs its engine's dependencies."""


@contextlib.contextmanager
def _extra_hint(module: str) -> Iterator[None]:
    """Turn a missing third-party module of an env package into one line naming its extra."""
    try:
        yield
    except ModuleNotFoundError as error:
        extra = EXTRAS.get(module)
        if extra is None or (error.name or "hgpo_env").startswith("hgpo_env"):
            raise
        message = f'{module} needs the {extra} extra (no module {error.name!r}): pip install -e ".[{extra}]"'
        raise ModuleNotFoundError(message, name=error.name) from None


def _load_class(path: str) -> type[TextEnv]:
    module, _, name = path.partition(":")
    with _extra_hint(module):
        return getattr(importlib.import_module(module), name)


def make_agent_env(
    env_class: type[TextEnv] | str,
    *,
    history_length: int = 2,
    fingerprint_mode: str = "observations_actions",
    response_format: str = "think_action",
    require_think: bool = False,
    tokenizer: Tokenizer | None = None,
    max_prompt_tokens: int | None = None,
    **env_kwargs: Any,
) -> gym.Env[str, str]:
    """Build a text env and wrap it with the response parser and the K-step memory.

    ``env_kwargs`` (``max_steps``, ``success_reward``, env-specific options) go to the env class.
    """
    check_argument_types(
        make_agent_env,
        {
            "history_length": history_length,
            "fingerprint_mode": fingerprint_mode,
            "response_format": response_format,
            "require_think": require_think,
            "max_prompt_tokens": max_prompt_tokens,
        },
    )
    cls = _load_class(env_class) if isinstance(env_class, str) else env_class
    check_argument_types(cls.__init__, env_kwargs)
    with _extra_hint(cls.__module__.rpartition(".")[0]):
        text_env = cls(**env_kwargs)
    env = ParseResponse(text_env, response_format, require_think=require_think)
    return KStepMemory(
        env,
        history_length,
        fingerprint_mode,
        response_format=response_format,
        tokenizer=tokenizer,
        max_prompt_tokens=max_prompt_tokens,
    )


def register_envs() -> None:
    """Register every HGPO-* id with Gymnasium (idempotent)."""
    for env_id, class_path in ENV_CLASSES.items():
        if env_id not in gym.registry:
            gym.register(id=env_id, entry_point=functools.partial(make_agent_env, class_path))
