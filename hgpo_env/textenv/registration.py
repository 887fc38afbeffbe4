"""Gymnasium registration: ``gymnasium.make("HGPO-...")`` returns an LLM-ready env.

The made env is ``KStepMemory(ParseResponse(TextEnv))`` (or another memory kind's wrapper,
:mod:`hgpo_env.prompting.kinds`): observations are prompts, actions are raw model responses, and
``env.unwrapped`` is the plain text environment. Env classes are named
by import path so that registering does not import heavy engines (ALFWorld, WebShop search, the
third-party packages of the presets). Making one checks the argument types first, and a missing
optional dependency is reported as the extra to install. :func:`register_text_env` registers a
user's own env the same way.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
from collections.abc import Callable, Iterator
from dataclasses import fields
from typing import Any

import gymnasium as gym

from hgpo_env.prompting.actions import ParseResponse
from hgpo_env.prompting.calling import ParseToolCall
from hgpo_env.prompting.chat import PROMPT_FORMATS, ChatSettings
from hgpo_env.prompting.kinds import MemoryOptions, wrap_memory
from hgpo_env.prompting.memory import DEFAULT_HISTORY_LENGTH, Tokenizer
from hgpo_env.textenv.adapter import TextAdapter, TextEnvSpec, adapt
from hgpo_env.textenv.arguments import check_argument_types

ENV_CLASSES = {
    "HGPO-Rooms-v0": "hgpo_env.envs.rooms:RoomsEnv",
    "HGPO-Corridor-v0": "hgpo_env.envs.corridor:CorridorEnv",
    "HGPO-ALFWorld-v0": "hgpo_env.envs.alfworld:ALFWorldEnv",
    "HGPO-WebShop-v0": "hgpo_env.envs.webshop:WebShopEnv",
    "HGPO-TextWorld-v0": "hgpo_env.envs.textworld:TextWorldEnv",
    "HGPO-TextWorldExpress-v0": "hgpo_env.envs.textworld_express:TextWorldExpressEnv",
    "HGPO-ScienceWorld-v0": "hgpo_env.envs.scienceworld:ScienceWorldEnv",
    "HGPO-BabyAI-v0": "hgpo_env.envs.babyai:BabyAIEnv",
    "HGPO-TextArena-v0": "hgpo_env.envs.textarena:TextArenaEnv",
}


EXTRAS = {
    "hgpo_env.envs.alfworld": "alfworld",
    "hgpo_env.envs.webshop": "webshop",
    "hgpo_env.envs.textworld": "textworld",
    "hgpo_env.envs.textworld_express": "textworld-express",
    "hgpo_env.envs.scienceworld": "scienceworld",
    "hgpo_env.envs.babyai": "babyai",
    "hgpo_env.envs.textarena": "textarena",
    "hgpo_env.serve": "serve",
}
"""Env package -> the pip extra that installs its engine's dependencies."""


_BUILDERS: dict[str, Callable[[], list[Callable[..., Any]]]] = {}
"""For each id registered here, the callables ``make`` passes the caller's arguments to beside the
wrappers (the env class, or the adapter and the user's factory); loaded when asked, since loading
an env class imports its engine."""


class MissingExtraError(ModuleNotFoundError):
    """An env package's third-party dependency is not installed; the message names the extra."""


@contextlib.contextmanager
def extra_hint(module: str) -> Iterator[None]:
    """Turn a missing third-party module of an hgpo_env package into one line naming its extra."""
    try:
        yield
    except ModuleNotFoundError as error:
        extra = EXTRAS.get(module)
        if extra is None or (error.name or "hgpo_env").startswith("hgpo_env"):
            raise
        message = f'{module} needs the {extra} extra (no module {error.name!r}): pip install -e ".[{extra}]"'
        raise MissingExtraError(message, name=error.name) from None


def load_class(path: str) -> Callable[..., gym.Env[str, str]]:
    """The env class (or factory) at ``"module:name"``, a missing extra named in one line."""
    module, _, name = path.partition(":")
    with extra_hint(module):
        return getattr(importlib.import_module(module), name)


def make_agent_env(
    env_class: Callable[..., gym.Env[str, str]] | str,
    *,
    history_length: int = DEFAULT_HISTORY_LENGTH,
    fingerprint_mode: str = "observations_actions",
    fingerprint_state: str = "text",
    response_format: str = "think_action",
    require_think: bool = False,
    tokenizer: Tokenizer | None = None,
    prompt_format: str = "text",
    call_format: str = "hermes",
    chat_template: str = "",
    chat_template_kwargs: dict[str, Any] | None = None,
    history_replies: str = "action",
    reasoning_open: bool = False,
    **kwargs: Any,
) -> gym.Env[str, str]:
    """Build a text env and wrap it with the response parser and the prompt memory.

    ``env_class`` is a text env class (or any callable returning an env on the ``info``
    contract), or its ``"module:name"`` path. The :class:`~hgpo_env.prompting.kinds.MemoryOptions`
    among ``kwargs`` (``memory``, ``compact_every``, ...) choose the memory kind
    (:func:`~hgpo_env.prompting.kinds.wrap_memory`); the rest (``max_steps``, ``success_reward``,
    env-specific options) go to the env.

    ``prompt_format="chat"`` makes prompts chat messages (:mod:`hgpo_env.prompting.chat`);
    ``chat_template`` and ``chat_template_kwargs`` name what the policy renders them with (keys
    of different templates never meet), ``history_replies`` how past replies are shown
    (:data:`~hgpo_env.prompting.chat.HISTORY_REPLIES`). ``response_format="tool_call"`` (chat
    only) reads the reply's tool call in ``call_format`` (:mod:`hgpo_env.prompting.tool_calls`);
    ``reasoning_open`` says the template's generation prompt opens ``<think>`` (Qwen3-Thinking,
    DeepSeek-R1), so a reply's reasoning has no opening tag.
    """
    common = {
        "history_length": history_length,
        "fingerprint_mode": fingerprint_mode,
        "fingerprint_state": fingerprint_state,
        "response_format": response_format,
    }
    check_argument_types(
        make_agent_env,
        {
            **common,
            "require_think": require_think,
            "prompt_format": prompt_format,
            "call_format": call_format,
            "chat_template": chat_template,
            "history_replies": history_replies,
            "reasoning_open": reasoning_open,
        },
    )
    if prompt_format not in PROMPT_FORMATS:
        raise ValueError(f"prompt_format must be one of {PROMPT_FORMATS}, got {prompt_format!r}")
    for option, value, default in (
        ("history_replies", history_replies, "action"),
        ("reasoning_open", reasoning_open, False),
    ):
        if value != default and prompt_format != "chat":
            raise ValueError(f"{option} is an option of prompt_format='chat'")
    if response_format == "tool_call" and prompt_format != "chat":
        raise ValueError(
            "response_format='tool_call' needs prompt_format='chat' (tools are rendered by a chat template)"
        )
    check_argument_types(
        MemoryOptions, {f.name: kwargs[f.name] for f in fields(MemoryOptions) if f.name in kwargs}
    )
    options = MemoryOptions.pop_from(kwargs)
    cls = load_class(env_class) if isinstance(env_class, str) else env_class
    if isinstance(cls, type):
        check_argument_types(cls.__init__, kwargs)
    with extra_hint(getattr(cls, "__module__", "").rpartition(".")[0]):
        text_env = cls(**kwargs)
    if response_format == "tool_call":
        parsed: gym.Env[str, Any] = ParseToolCall(text_env, call_format, reasoning_open=reasoning_open)
    else:
        parsed = ParseResponse(text_env, response_format, require_think=require_think)
    chat = None
    if prompt_format == "chat":
        chat = ChatSettings(chat_template, dict(chat_template_kwargs or {}), call_format, reasoning_open)
    return wrap_memory(
        parsed, options, tokenizer=tokenizer, chat=chat, history_replies=history_replies, **common
    )


def register_envs() -> None:
    """Register every HGPO-* id with Gymnasium (idempotent)."""
    for env_id, class_path in ENV_CLASSES.items():
        if env_id not in gym.registry:
            gym.register(id=env_id, entry_point=functools.partial(make_agent_env, class_path))
        _BUILDERS[env_id] = lambda path=class_path: [load_class(path)]


def import_env_module(env_id: str) -> str:
    """The Gymnasium id of ``env_id``; for ``"module:Id"``, ``module`` is imported first (it
    registers ``Id``), as ``gymnasium.make`` does. An import failure propagates."""
    module, _, name = env_id.rpartition(":")
    if module:
        importlib.import_module(module)
    return name


def register_text_env(env_id: str, make_env: Callable[..., Any], spec: TextEnvSpec, **defaults: Any) -> None:
    """Register ``env_id`` so that ``gymnasium.make(env_id, ...)`` gives an LLM-ready env.

    ``make_env(**kwargs)`` builds the third-party env; ``spec`` says how it meets the ``info``
    contract (:class:`~hgpo_env.textenv.adapter.TextEnvSpec`). At ``make`` time the wrapper options
    (``history_length``, ...) go to the wrappers, the adapter's (``max_steps``, ``reward``, ...)
    to :class:`~hgpo_env.textenv.adapter.TextAdapter`, the rest to ``make_env``. For a pool, register in
    an importable module and pass ``"module:ID"``, so each worker registers it too.
    """
    factory = functools.partial(adapt, make_env, spec)
    gym.register(id=env_id, entry_point=functools.partial(make_agent_env, factory), kwargs=defaults)
    _BUILDERS[env_id] = lambda: [TextAdapter, make_env]


def env_defaults(env_id: str) -> dict[str, Any]:
    """The values ``gymnasium.make(env_id)`` builds with where the caller gives none: the
    wrappers' defaults, the env class's (or the adapter's and the factory's) and the id's own
    registered ``kwargs``. An id registered with ``gymnasium.register`` directly has only the last."""
    spec = gym.spec(import_env_module(env_id))
    values: dict[str, Any] = {}
    builder = _BUILDERS.get(spec.id)
    for function in [make_agent_env, MemoryOptions, *builder()] if builder is not None else []:
        parameters = inspect.signature(function).parameters.values()
        values.update({p.name: p.default for p in parameters if p.default is not inspect.Parameter.empty})
    values.update(spec.kwargs)
    return values
