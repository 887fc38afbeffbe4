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
from functools import partial
from typing import Any, TextIO

import gymnasium as gym
import numpy as np

import hgpo_env  # noqa: F401  (registers the HGPO-* ids)
from hgpo_env.prompting.kinds import MemoryOptions
from hgpo_env.serve.auth import read_token
from hgpo_env.vector import GroupedEnvPool, GroupMismatchError, PoolError, ResetResult, StepResult
from hgpo_train.advantage import ProgressColumns
from hgpo_train.config import EnvConfig
from hgpo_train.rollout.agent_loop import AGENT_LOOPS, play_agent_loops, submitter
from hgpo_train.rollout.batch import Episodes, StepBatch
from hgpo_train.rollout.constrained import reply_choices
from hgpo_train.rollout.episodes import OUTCOMES, EnvPool, Episode, EpisodeRecorder, Generation, Generator, R

logger = logging.getLogger(__name__)


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
    MemoryOptions.pop_from(kwargs)  # the prompt's, not the tasks'
    kwargs.pop("tokenizer", None)
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


def opens_reasoning(tokenizer: Any, template_kwargs: Mapping[str, Any]) -> bool:
    """Whether the chat template's generation prompt opens a ``<think>`` block (Qwen3-Thinking,
    DeepSeek-R1): the policy's replies then close a block they never opened."""
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "?"}], add_generation_prompt=True, tokenize=False, **template_kwargs
    )
    return prompt.rstrip().endswith("<think>")


def template_settings(tokenizer: Any, template_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """What a chat env (``prompt_format="chat"``) pins of the policy's chat template: its text
    (in the keys' salt) and whether its generation prompt opens the reasoning block."""
    template = getattr(tokenizer, "chat_template", None) or ""
    return {
        "chat_template": template,
        "reasoning_open": bool(template) and opens_reasoning(tokenizer, template_kwargs),
    }


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
        **env.memory_kwargs,
        **env.kwargs,
        **overrides,
    }
    if env.prompt_format == "chat":
        kwargs.update(
            prompt_format="chat",
            call_format=env.call_format,
            chat_template_kwargs=dict(env.chat_template_kwargs),
            history_replies=env.history_replies,
            **template_settings(tokenizer, env.chat_template_kwargs),
        )
    if env.max_prompt_tokens is not None:
        kwargs.update(tokenizer=tokenizer, max_prompt_tokens=env.max_prompt_tokens)
    if env.compact_at_tokens is not None:
        kwargs.update(tokenizer=tokenizer, compact_at_tokens=env.compact_at_tokens)
    return kwargs


def play_episodes(
    pool: EnvPool,
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
    recorder: EpisodeRecorder[R] = EpisodeRecorder(pool.reset(seeds=seeds, task_ids=task_ids))
    active = sorted(recorder.prompts)
    turn = steps = 0
    while active:
        responses = respond([recorder.prompts[i] for i in active], [recorder.infos[i] for i in active])
        if len(responses) != len(active):
            raise ValueError(f"respond returned {len(responses)} responses for {len(active)} prompts")
        results = pool.step({i: r.text for i, r in zip(active, responses)})
        active = [r.env_index for response, r in zip(responses, results) if not recorder.record(response, r)]
        turn, steps = turn + 1, steps + len(results)
        if on_turn is not None:
            on_turn(turn, len(active), steps)
    return recorder.episodes()


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
    response_format: str | None = None,
    temperature: float | None = None,
    on_turn: Callable[[int, int, int], None] | None = None,
    agent_loop: str = "lockstep",
    max_batch: int | None = None,
) -> StepBatch:
    """Play one episode in every env of ``pool`` (one seed / task id per group) and record each step.

    ``constrained`` restricts every response to its prompt's replies
    (:func:`~hgpo_train.rollout.constrained.reply_choices` in the env's ``response_format``); ``on_turn``
    reports progress (:func:`play_episodes`). ``agent_loop``: ``"lockstep"`` turns
    (:func:`play_episodes`, the default: a sampled rollout replays exactly from its seed) or
    ``"per_episode"`` loops (:func:`~hgpo_train.rollout.agent_loop.play_agent_loops`: env steps overlap
    generation; a generator without its own ``submit`` answers up to ``max_batch`` waiting prompts
    per call, default all of them).
    ``batch.extras["timing"]`` holds the seconds the rollout waited on the envs (``env_s``) and
    the rest (``generate_s``: waiting on generation).
    """
    if constrained and response_format is None:
        raise ValueError("constrained decoding needs the env's response_format (its replies' layout)")
    replies = partial(reply_choices, response_format=response_format) if constrained else None
    timed = _TimedPool(pool)
    start = time.perf_counter()
    if agent_loop == "lockstep":

        def respond(prompts: list[str], infos: list[dict[str, Any]]) -> list[Generation]:
            admissible = [replies(info) for info in infos] if replies is not None else None
            return generator.generate(prompts, admissible, temperature)

        episodes = play_episodes(timed, respond, seeds=seeds, task_ids=task_ids, on_turn=on_turn)
    elif agent_loop == "per_episode":
        batch_cap = max_batch or pool.num_envs
        with submitter(generator, replies=replies, temperature=temperature, max_batch=batch_cap) as submit:
            episodes = play_agent_loops(timed, submit, seeds=seeds, task_ids=task_ids, on_turn=on_turn)
    else:
        raise ValueError(f"agent_loop must be one of {AGENT_LOOPS}, got {agent_loop!r}")
    batch = _to_batch(episodes)
    total = time.perf_counter() - start
    batch.extras["timing"] = {"env_s": timed.seconds, "generate_s": total - timed.seconds}
    return batch


class _TimedPool:
    """A pool whose ``reset`` and ``step`` calls add up their seconds."""

    def __init__(self, pool: GroupedEnvPool) -> None:
        self.pool, self.seconds = pool, 0.0

    def reset(self, **kwargs: Any) -> list[ResetResult]:
        return self._timed(self.pool.reset, **kwargs)

    def step(self, actions: Mapping[int, str]) -> list[StepResult]:
        return self._timed(self.pool.step, actions)

    def _timed(self, call: Callable[..., list[Any]], *args: Any, **kwargs: Any) -> list[Any]:
        start = time.perf_counter()
        try:
            return call(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - start


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
    windows = [s.window_prompt for e in episodes for s in e.steps]
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
        behaviour_logprobs=[np.asarray(g.logprobs, dtype=np.float32) for g in generations]
        if generations and all(g.logprobs is not None for g in generations)
        else None,
        window_prompts=windows if any(w is not None for w in windows) else None,
    )
