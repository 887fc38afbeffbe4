"""Multi-turn step collection over a :class:`~hgpo_env.vector.GroupedEnvPool` into a StepBatch.

Each turn: the prompts of all envs still in an episode (the env writes them, K-step memory
included) go to the generator in one batch, the responses step exactly those envs, and every
(prompt, response) pair becomes one row, keyed by the fingerprints that came with its prompt.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import gymnasium as gym
import numpy as np

import hgpo_env  # noqa: F401  (registers the HGPO-* ids)
from hgpo_env.vector import GroupedEnvPool
from hgpo_train.batch import Episodes, StepBatch
from hgpo_train.config import EnvConfig
from hgpo_train.generation import Generation


class Generator(Protocol):
    def generate(
        self,
        prompts: Sequence[str],
        admissible: Sequence[Sequence[str]] | None = None,
        temperature: float | None = None,
    ) -> list[Generation]: ...


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
) -> GroupedEnvPool:
    """A pool of ``num_groups`` x ``group_size`` envs as ``env`` describes them.

    ``env_kwargs`` go to the envs on top of ``env.kwargs`` (evaluation's held-out split);
    ``pool_options`` configure the pool itself (:data:`POOL_OPTIONS`). Kept apart, an env
    argument can never be taken for a pool option, nor the other way round.
    ``tokenizer`` is used only with ``env.max_prompt_tokens`` (the memory window's token budget).
    One env is made here first, so bad arguments or missing data fail with the env's own error
    instead of one traceback per worker.
    """
    options = pool_options or {}
    unknown = sorted(set(options) - POOL_OPTIONS)
    if unknown:
        raise ValueError(f"unknown pool options {unknown}; GroupedEnvPool takes {sorted(POOL_OPTIONS)}")
    kwargs = _env_kwargs(env, tokenizer, env_kwargs or {})
    gym.make(env.env_id, **kwargs).close()
    workers = min(env.num_workers, num_groups * group_size)
    return GroupedEnvPool(
        env.env_id, num_groups, group_size, num_workers=workers, seed=seed, **options, **kwargs
    )


def _env_kwargs(env: EnvConfig, tokenizer: Any, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Constructor arguments of every env: ``env``'s fields, ``env.kwargs``, then ``overrides``."""
    kwargs: dict[str, Any] = {
        "history_length": env.history_length,
        "fingerprint_mode": env.fingerprint_mode,
        "response_format": env.response_format,
        "max_steps": env.max_steps,
        "success_reward": env.success_reward,
        **env.kwargs,
        **overrides,
    }
    if env.max_prompt_tokens is not None:
        kwargs.update(tokenizer=tokenizer, max_prompt_tokens=env.max_prompt_tokens)
    return kwargs


@dataclass
class _Trajectory:
    """One env's episode while it runs."""

    group: int
    member: int
    task: str
    task_type: str | None
    rows: list[dict[str, Any]] = field(default_factory=list)
    won: bool = False
    score: float = 0.0
    truncated: bool = False
    env_error: bool = False


def collect_rollouts(
    pool: GroupedEnvPool,
    generator: Generator,
    *,
    seeds: Sequence[int] | None = None,
    task_ids: Sequence[int] | None = None,
    constrained: bool = False,
    temperature: float | None = None,
) -> StepBatch:
    """Play one episode in every env of ``pool`` (one seed / task id per group) and record each step.

    ``constrained`` restricts every response to the admissible commands of its prompt.
    ``batch.extras["timing"]`` holds the seconds spent in the envs and in generation.
    """
    timing = {"env_s": 0.0, "generate_s": 0.0}
    start = time.perf_counter()
    resets = pool.reset(seeds=seeds, task_ids=task_ids)
    timing["env_s"] += time.perf_counter() - start
    prompts = {r.env_index: r.obs for r in resets}
    infos = {r.env_index: r.info for r in resets}
    trajectories = {
        r.env_index: _Trajectory(r.group, r.member, r.info["task"], r.info.get("task_type")) for r in resets
    }
    active = [r.env_index for r in resets]
    while active:
        start = time.perf_counter()
        admissible = [infos[i]["admissible_actions"] for i in active] if constrained else None
        generations = generator.generate([prompts[i] for i in active], admissible, temperature)
        timing["generate_s"] += time.perf_counter() - start
        start = time.perf_counter()
        results = pool.step({i: g.text for i, g in zip(active, generations)})
        timing["env_s"] += time.perf_counter() - start
        for generation, result in zip(generations, results):
            i = result.env_index
            trajectory = trajectories[i]
            trajectory.rows.append(
                {
                    "step": len(trajectory.rows),
                    "reward": float(result.reward),
                    "invalid": "env_error" not in result.info and not result.info.get("action_valid", False),
                    "fingerprints": infos[i]["fingerprints"],
                    "generation": generation,
                }
            )
            prompts[i], infos[i] = result.obs, result.info
            if result.done:
                trajectory.won = bool(result.info.get("won", False))
                trajectory.score = float(result.info.get("score", 0.0))
                trajectory.truncated = result.truncated
                trajectory.env_error = "env_error" in result.info
        active = [r.env_index for r in results if not r.done]
    batch = _to_batch([trajectories[i] for i in sorted(trajectories)])
    batch.extras["timing"] = timing
    return batch


def _to_batch(trajectories: list[_Trajectory]) -> StepBatch:
    rows = [(t, row) for t in trajectories for row in t.rows]
    levels = len(rows[0][1]["fingerprints"]) if rows else 1
    fingerprints = np.zeros((len(rows), levels), dtype=np.uint64)
    for k, (_, row) in enumerate(rows):
        fingerprints[k] = row["fingerprints"]
    episodes = Episodes(
        group_id=np.array([t.group for t in trajectories], dtype=np.int64),
        traj_id=np.array([t.member for t in trajectories], dtype=np.int64),
        task=[t.task for t in trajectories],
        task_type=[t.task_type for t in trajectories],
        won=np.array([t.won for t in trajectories], dtype=bool),
        score=np.array([t.score for t in trajectories], dtype=np.float64),
        length=np.array([len(t.rows) for t in trajectories], dtype=np.int64),
        total_reward=np.array([sum(r["reward"] for r in t.rows) for t in trajectories], dtype=np.float64),
        truncated=np.array([t.truncated for t in trajectories], dtype=bool),
        env_error=np.array([t.env_error for t in trajectories], dtype=bool),
    )
    return StepBatch(
        group_id=np.array([t.group for t, _ in rows], dtype=np.int64),
        traj_id=np.array([t.member for t, _ in rows], dtype=np.int64),
        step=np.array([row["step"] for _, row in rows], dtype=np.int64),
        reward=np.array([row["reward"] for _, row in rows], dtype=np.float64),
        invalid=np.array([row["invalid"] for _, row in rows], dtype=bool),
        fingerprints=fingerprints,
        prompt_ids=[np.asarray(row["generation"].prompt_ids, dtype=np.int32) for _, row in rows],
        response_ids=[np.asarray(row["generation"].response_ids, dtype=np.int32) for _, row in rows],
        choices=[row["generation"].choices for _, row in rows],
        episodes=episodes,
    )
