"""Multi-turn step collection over a :class:`~hgpo_env.vector.GroupedEnvPool` into a StepBatch.

Each turn: the prompts of all envs still in an episode (the env writes them, K-step memory
included) go to the generator in one batch, the responses step exactly those envs, and every
(prompt, response) pair becomes one row, keyed by the fingerprints that came with its prompt.
"""

from __future__ import annotations

import inspect
import logging
import math
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, NamedTuple, Protocol, TextIO, TypeVar

import gymnasium as gym
import numpy as np

import hgpo_env  # noqa: F401  (registers the HGPO-* ids)
from hgpo_env.memory import SUMMARY_TURN
from hgpo_env.milestones import MILESTONES_KEY, SIGNATURE_KEY
from hgpo_env.serve.auth import read_token
from hgpo_env.vector import GroupedEnvPool, GroupMismatchError, PoolError
from hgpo_train.advantage import ProgressColumns
from hgpo_train.batch import Episodes, StepBatch
from hgpo_train.config import EnvConfig
from hgpo_train.generation import Generation

logger = logging.getLogger(__name__)


class Generator(Protocol):
    def generate(
        self,
        prompts: Sequence[str],
        admissible: Sequence[Sequence[str]] | None = None,
        temperature: float | None = None,
    ) -> list[Generation]: ...


R = TypeVar("R")
"""What a ``respond`` callable returns per prompt: any object with a ``text`` attribute."""

POOL_OPTIONS = frozenset(
    name for name, p in inspect.signature(GroupedEnvPool).parameters.items() if p.kind is p.KEYWORD_ONLY
) - {"num_workers", "seed"}
"""The pool's own options (``backend``, timeouts, ...) a caller may set; make_pool sets the rest."""


def make_pool(
    env: EnvConfig,
    num_groups: int,
    group_size: int,
    *,
    seed: int,
    tokenizer: Any = None,
    env_kwargs: Mapping[str, Any] | None = None,
    pool_options: Mapping[str, Any] | None = None,
    probe: bool = True,
) -> GroupedEnvPool:
    """A pool of ``num_groups`` x ``group_size`` envs as ``env`` describes them.

    ``env_kwargs`` go to the envs on top of ``env.kwargs`` (evaluation's held-out split);
    ``pool_options`` configure the pool itself (:data:`POOL_OPTIONS`). Kept apart, an env
    argument can never be taken for a pool option, nor the other way round.
    ``tokenizer`` is used only with a token budget (``env.max_prompt_tokens``, ``env.compact_at_tokens``).
    With ``probe``, one env is made here first, so bad arguments or missing data fail with the
    env's own error instead of one traceback per worker; a caller that has just made one with
    these arguments (:func:`count_tasks`) passes ``probe=False``.
    """
    unknown = sorted(set(pool_options or {}) - POOL_OPTIONS)
    if unknown:
        raise ValueError(f"unknown pool options {unknown}; GroupedEnvPool takes {sorted(POOL_OPTIONS)}")
    options = {
        "backend": env.backend,
        **({"servers": list(env.servers)} if env.servers else {}),
        **({"server_token": read_token(env.server_token_file)} if env.server_token_file else {}),
        **(pool_options or {}),
    }
    kwargs = _env_kwargs(env, tokenizer, env_kwargs or {})
    if probe:
        made = _make_env(env, kwargs)
        try:
            if env.backend == "openenv":
                made.reset(seed=0)  # a served env is made at its first reset: check the arguments there
        finally:
            made.close()
    workers = min(env.num_workers, num_groups * group_size)
    return GroupedEnvPool(
        env.env_id, num_groups, group_size, num_workers=workers, seed=seed, **options, **kwargs
    )


def count_tasks(env: EnvConfig, env_kwargs: Mapping[str, Any] | None = None) -> int | None:
    """How many tasks the env's ``task_id`` selects with these arguments (None: generated without end)."""
    kwargs = _env_kwargs(env, None, env_kwargs or {})
    for prompt_only in (
        "tokenizer",
        "max_prompt_tokens",
        "memory",
        "compact_every",
        "compact_at_tokens",
        "notes_tag",
    ):
        kwargs.pop(prompt_only, None)
    made = _make_env(env, kwargs)
    try:
        if env.backend == "openenv":
            made.reset(seed=0)
        return made.unwrapped.num_tasks
    finally:
        made.close()


def _make_env(env: EnvConfig, kwargs: Mapping[str, Any]) -> gym.Env:
    """One env as the pool's workers will have it: in process, or a session on the first server."""
    if env.backend != "openenv":
        return gym.make(env.env_id, **kwargs)
    from hgpo_env.serve.client import RemoteEnv

    token = read_token(env.server_token_file) if env.server_token_file else None
    return RemoteEnv(env.servers, env_id=env.env_id, token=token, **kwargs)


def _env_kwargs(env: EnvConfig, tokenizer: Any, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Constructor arguments of every env: ``env``'s fields, ``env.kwargs``, then ``overrides``."""
    kwargs: dict[str, Any] = {
        "history_length": env.history_length,
        "fingerprint_mode": env.fingerprint_mode,
        "fingerprint_state": env.fingerprint_state,
        "response_format": env.response_format,
        "protocol": env.protocol,
        "max_steps": env.max_steps,
        "success_reward": env.success_reward,
        **_memory_kwargs(env),
        **env.kwargs,
        **overrides,
    }
    if env.max_prompt_tokens is not None:
        kwargs.update(tokenizer=tokenizer, max_prompt_tokens=env.max_prompt_tokens)
    if env.compact_at_tokens is not None:
        kwargs.update(tokenizer=tokenizer, compact_at_tokens=env.compact_at_tokens)
    return kwargs


def _memory_kwargs(env: EnvConfig) -> dict[str, Any]:
    """The memory kind and its options, only where not the window's defaults: envs served by a
    server that predates memory kinds still take the config of a window run."""
    if env.memory == "window":
        return {}
    options = {"compact_every": env.compact_every, "notes_tag": env.notes_tag}
    return {"memory": env.memory, **{name: value for name, value in options.items() if value is not None}}


OUTCOMES = ("won", "lost", "truncated", "env_error")
"""How a rollout ends: its task solved; ended by the env without a win; cut by the step limit (or
the env's own); cut by a failure of the env or its worker."""


class Progress(NamedTuple):
    """One step's progress signatures and milestone flags, before and after it."""

    signature: str
    milestones: tuple[int, ...]
    next_signature: str
    next_milestones: tuple[int, ...]

    @classmethod
    def of(cls, before: dict[str, Any], after: dict[str, Any]) -> Progress | None:
        """From the infos of the step's prompt and its result; None without milestones."""
        if SIGNATURE_KEY not in before:
            return None
        after = after if SIGNATURE_KEY in after else before
        return cls(
            before[SIGNATURE_KEY],
            tuple(before[MILESTONES_KEY]),
            after[SIGNATURE_KEY],
            tuple(after[MILESTONES_KEY]),
        )


@dataclass
class EpisodeStep(Generic[R]):
    """One step of an episode: the prompt the env wrote, its fingerprints, the response, the outcome."""

    prompt: str
    fingerprints: tuple[int, ...]
    """The fingerprints that came with ``prompt`` (level 0..K)."""
    response: R
    reward: float
    invalid: bool
    """The response was not a valid admissible action (an env failure is not counted as invalid)."""
    next_state: int = 0
    """Level 0 of the fingerprints the step returned: the key of the state it led to (the terminal
    observation's on a last step; 0 where the env failed)."""
    action_key: int = 0
    """The key of the command the step executed (``info["action_key"]``; 0 where the env failed)."""
    progress: Progress | None = None
    """The milestones of the observation the step acted on and of the one it returned (the first
    again where the env failed); None where the env reports none (:mod:`hgpo_env.milestones`)."""
    summary_turn: bool = False
    """The prompt asked for a summary, not a command (``memory="compaction"``'s summary turn)."""


@dataclass
class Episode(Generic[R]):
    """One env's episode: which group and member played it, its steps and how it ended."""

    group: int
    member: int
    task: str
    task_type: str | None
    task_key: int = 0
    """The task's key from its reset (``info["task_key"]``)."""
    steps: list[EpisodeStep[R]] = field(default_factory=list)
    won: bool = False
    score: float = 0.0
    truncated: bool = False
    env_error: bool = False

    @property
    def outcome(self) -> str:
        """How it ended, one of :data:`OUTCOMES`."""
        if self.env_error:
            return "env_error"
        if self.won:
            return "won"
        return "truncated" if self.truncated else "lost"


def play_episodes(
    pool: GroupedEnvPool,
    respond: Callable[[list[str], list[dict[str, Any]]], Sequence[R]],
    *,
    seeds: Sequence[int] | None = None,
    task_ids: Sequence[int] | None = None,
    on_turn: Callable[[int, int, int], None] | None = None,
) -> list[Episode[R]]:
    """Play one episode in every env of ``pool`` (one seed / task id per group), in lockstep turns.

    Each turn ``respond(prompts, infos)`` answers the prompts of all envs still in an episode in
    one call (batched generation), with each prompt's ``info``; it returns one response per
    prompt, anything with a ``text`` attribute, kept as the step's ``response``. This loop is
    framework-neutral: the trainer, its OpenRLHF backend and the TRL integration differ only in
    ``respond``. Episodes come back in env order (group by group). ``on_turn(turn, running,
    steps)`` is called after each turn (for progress: envs still in an episode, steps so far).
    """
    resets = pool.reset(seeds=seeds, task_ids=task_ids)
    prompts = {r.env_index: r.obs for r in resets}
    infos = {r.env_index: r.info for r in resets}
    episodes = {
        r.env_index: Episode(
            r.group, r.member, r.info["task"], r.info.get("task_type"), int(r.info.get("task_key", 0))
        )
        for r in resets
    }
    active = [r.env_index for r in resets]
    turn = steps = 0
    while active:
        responses = respond([prompts[i] for i in active], [infos[i] for i in active])
        if len(responses) != len(active):
            raise ValueError(f"respond returned {len(responses)} responses for {len(active)} prompts")
        results = pool.step({i: r.text for i, r in zip(active, responses)})
        for response, result in zip(responses, results):
            i = result.env_index
            episode = episodes[i]
            failed = "env_error" in result.info
            episode.steps.append(
                EpisodeStep(
                    prompts[i],
                    tuple(infos[i]["fingerprints"]),
                    response,
                    float(result.reward),
                    not failed and not result.info.get("action_valid", False),
                    int(result.info["fingerprints"][0]) if "fingerprints" in result.info else 0,
                    int(result.info.get("action_key", 0)),
                    Progress.of(infos[i], result.info),
                    infos[i].get("turn") == SUMMARY_TURN,
                )
            )
            prompts[i], infos[i] = result.obs, result.info
            if result.done:
                episode.won = bool(result.info.get("won", False))
                episode.score = float(result.info.get("score", 0.0))
                episode.truncated = result.truncated
                episode.env_error = failed
        active = [r.env_index for r in results if not r.done]
        turn, steps = turn + 1, steps + len(results)
        if on_turn is not None:
            on_turn(turn, len(active), steps)
    return [episodes[i] for i in sorted(episodes)]


def progress_lines(
    label: str, num_envs: int, every: float = 10.0, stream: TextIO | None = None
) -> Callable[[int, int, int], None]:
    """An ``on_turn`` callback that writes a progress line at most every ``every`` seconds, for
    runs without a progress bar (the OpenRLHF backend's trainer actor, whose output Ray relays)."""
    last = -math.inf

    def show(turn: int, running: int, steps: int) -> None:
        nonlocal last
        now = time.monotonic()
        if now - last >= every:
            last = now
            line = f"{label}: turn {turn}, {running}/{num_envs} episodes running, {steps} steps"
            print(line, file=stream or sys.stderr, flush=True)

    return show


def step_columns(episodes: Sequence[Episode[Any]]) -> dict[str, Any]:
    """The advantage estimators' input columns of ``episodes``, one row per step in episode order:
    ``group_id``, ``traj_id`` (the member), ``step``, ``reward``, ``invalid``, ``fingerprints``
    (uint64, n x (K+1)), ``next_state`` (uint64, the key of the state each step led to),
    ``action_key`` (uint64, the key of the command it executed), ``outcome`` (how the step's
    rollout ended, one of :data:`OUTCOMES`), ``summary_turn`` (bool, the step was a summary turn)
    and, where every step has milestones, ``progress`` (:class:`~hgpo_train.advantage.ProgressColumns`,
    else None); pass them to :func:`hgpo_train.advantage.step_credit`."""
    steps = [(e, k, s) for e in episodes for k, s in enumerate(e.steps)]
    levels = len(steps[0][2].fingerprints) if steps else 1
    return {
        "progress": ProgressColumns.from_steps([s.progress for _, _, s in steps]),
        "group_id": np.array([e.group for e, _, _ in steps], dtype=np.int64),
        "traj_id": np.array([e.member for e, _, _ in steps], dtype=np.int64),
        "step": np.array([k for _, k, _ in steps], dtype=np.int64),
        "reward": np.array([s.reward for _, _, s in steps], dtype=np.float64),
        "invalid": np.array([s.invalid for _, _, s in steps], dtype=bool),
        "fingerprints": np.array([s.fingerprints for _, _, s in steps], dtype=np.uint64).reshape(-1, levels),
        "next_state": np.array([s.next_state for _, _, s in steps], dtype=np.uint64),
        "action_key": np.array([s.action_key for _, _, s in steps], dtype=np.uint64),
        "outcome": np.array([e.outcome for e, _, _ in steps], dtype=f"<U{max(map(len, OUTCOMES))}"),
        "summary_turn": np.array([s.summary_turn for _, _, s in steps], dtype=bool),
    }


def collect_rollouts(
    pool: GroupedEnvPool,
    generator: Generator,
    *,
    seeds: Sequence[int] | None = None,
    task_ids: Sequence[int] | None = None,
    constrained: bool = False,
    temperature: float | None = None,
    on_turn: Callable[[int, int, int], None] | None = None,
) -> StepBatch:
    """Play one episode in every env of ``pool`` (one seed / task id per group) and record each step.

    ``constrained`` restricts every response to the admissible commands of its prompt; ``on_turn``
    reports progress (:func:`play_episodes`).
    ``batch.extras["timing"]`` holds the seconds spent in the envs and in generation.
    """
    generate_s = 0.0

    def respond(prompts: list[str], infos: list[dict[str, Any]]) -> list[Generation]:
        nonlocal generate_s
        start = time.perf_counter()
        admissible = [info["admissible_actions"] for info in infos] if constrained else None
        generations = generator.generate(prompts, admissible, temperature)
        generate_s += time.perf_counter() - start
        return generations

    start = time.perf_counter()
    episodes = play_episodes(pool, respond, seeds=seeds, task_ids=task_ids, on_turn=on_turn)
    batch = _to_batch(episodes)
    batch.extras["timing"] = {"env_s": time.perf_counter() - start - generate_s, "generate_s": generate_s}
    return batch


ROLLOUT_ATTEMPTS = 3
"""Tries at an iteration's rollout when the pool raises (a reset it could not heal)."""


def collect_with_retries(
    pool: GroupedEnvPool,
    generator: Generator,
    *,
    label: str,
    before_attempt: Callable[[], None] = lambda: None,
    **options: Any,
) -> StepBatch:
    """:func:`collect_rollouts` (``options``), given again when the pool raises, up to
    :data:`ROLLOUT_ATTEMPTS` times: the pool resets first, so nothing was sampled yet and the
    retry is the same rollout (``before_attempt`` reseeds the sampler). An env that is not
    deterministic (:class:`~hgpo_env.vector.GroupMismatchError`) is not retried: it would fail
    again. ``label`` names the iteration in the warning."""
    attempt = 1
    while True:
        before_attempt()
        try:
            return collect_rollouts(pool, generator, **options)
        except GroupMismatchError:
            raise
        except PoolError as error:
            if attempt == ROLLOUT_ATTEMPTS:
                raise
            attempt += 1
            logger.warning(
                "%s: the env pool failed (%s); rollout attempt %d of %d",
                label,
                error,
                attempt,
                ROLLOUT_ATTEMPTS,
            )


def _to_batch(episodes: list[Episode[Generation]]) -> StepBatch:
    columns = step_columns(episodes)
    generations = [s.response for e in episodes for s in e.steps]
    summary = Episodes(
        group_id=np.array([e.group for e in episodes], dtype=np.int64),
        traj_id=np.array([e.member for e in episodes], dtype=np.int64),
        task=[e.task for e in episodes],
        task_type=[e.task_type for e in episodes],
        task_key=np.array([e.task_key for e in episodes], dtype=np.uint64),
        won=np.array([e.won for e in episodes], dtype=bool),
        score=np.array([e.score for e in episodes], dtype=np.float64),
        length=np.array([len(e.steps) for e in episodes], dtype=np.int64),
        total_reward=np.array([sum(s.reward for s in e.steps) for e in episodes], dtype=np.float64),
        truncated=np.array([e.truncated for e in episodes], dtype=bool),
        env_error=np.array([e.env_error for e in episodes], dtype=bool),
    )
    return StepBatch(
        **columns,
        prompt_ids=[np.asarray(g.prompt_ids, dtype=np.int32) for g in generations],
        response_ids=[np.asarray(g.response_ids, dtype=np.int32) for g in generations],
        choices=[g.choices for g in generations],
        episodes=summary,
    )
