"""HGPO-* environments behind verl-agent's environment-manager protocol, over a :class:`GroupedEnvPool`.

verl-agent (the HGPO and GiGPO papers' code, a fork of verl installed from its repository) runs
``envs.reset(kwargs=...)`` and then ``envs.step(text_actions)`` with one action for every env,
finished ones included, until all are done; consecutive ``env.rollout.n`` envs form a task group.
:class:`PoolEnvironmentManager` answers in its format: observations ``{"text": prompts, "image":
None, "anchor": fingerprints}``, where the prompt is our K-step prompt and the anchor, stored by
verl-agent as ``anchor_obs``, is the prompt's fingerprint tuple (levels 0..K) instead of the raw
observation, so :mod:`integrations.verl` groups steps by what their prompts show.
No verl import: the manager needs only the pool.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from hgpo_env.vector import GroupedEnvPool
from integrations._framework import text_prompts_only


class PoolEnvironmentManager:
    """verl-agent's ``EnvironmentManagerBase`` methods for ``num_groups`` x ``group_size`` HGPO-* envs.

    Set verl-agent's ``env.rollout.n`` to ``group_size``. ``pool_options`` configure the pool
    (``num_workers``, ``backend``, timeouts); ``env_kwargs`` go to ``gymnasium.make``.
    """

    def __init__(
        self,
        env_id: str,
        num_groups: int,
        group_size: int,
        *,
        seed: int | None = None,
        pool_options: Mapping[str, Any] | None = None,
        **env_kwargs: Any,
    ) -> None:
        text_prompts_only(env_kwargs, "the verl-agent adapter")
        self.pool = GroupedEnvPool(
            env_id, num_groups, group_size, seed=seed, **(pool_options or {}), **env_kwargs
        )
        self._prompts: list[str] = []
        self._infos: list[dict[str, Any]] = []
        self._done = np.zeros(self.pool.num_envs, dtype=bool)

    def _observations(self) -> dict[str, Any]:
        anchors = [tuple(info["fingerprints"]) for info in self._infos]
        return {"text": list(self._prompts), "image": None, "anchor": anchors}

    def _group_tasks(self, kwargs: Sequence[Mapping[str, Any] | None]) -> dict[str, list[int] | None]:
        """Per-group ``task_ids`` / ``seeds`` from per-env kwargs (members of a group must agree)."""
        if len(kwargs) != self.pool.num_envs:
            raise ValueError(f"got env kwargs for {len(kwargs)} envs, the manager has {self.pool.num_envs}")
        out: dict[str, list[int] | None] = {}
        for name, plural in (("task_id", "task_ids"), ("seed", "seeds")):
            values = [None if k is None else k.get(name) for k in kwargs]
            groups = [
                values[g * self.pool.group_size : (g + 1) * self.pool.group_size]
                for g in range(self.pool.num_groups)
            ]
            if any(len(set(group)) != 1 for group in groups):
                raise ValueError(f"the envs of a group must share one {name}")
            firsts = [group[0] for group in groups]
            if any(v is None for v in firsts) and any(v is not None for v in firsts):
                raise ValueError(f"give every group a {name}, or none")
            out[plural] = None if firsts[0] is None else [int(v) for v in firsts]
        return out

    def reset(
        self, kwargs: Sequence[Mapping[str, Any] | None] | None = None
    ) -> tuple[dict[str, Any], list[dict]]:
        """Start every env; ``kwargs`` (verl-agent's per-sample ``env_kwargs``) may name a
        ``task_id`` and/or ``seed`` per env; without them each group draws its task."""
        tasks = self._group_tasks(kwargs) if kwargs is not None else {}
        results = self.pool.reset(**tasks)
        self._prompts = [r.obs for r in results]
        self._infos = [dict(r.info, is_action_valid=True) for r in results]
        self._done[:] = False
        return self._observations(), [dict(info) for info in self._infos]

    def step(self, text_actions: Sequence[str]) -> tuple[dict[str, Any], np.ndarray, np.ndarray, list[dict]]:
        """Step the envs still in an episode; finished ones keep their last observation, reward 0."""
        if len(text_actions) != self.pool.num_envs:
            raise ValueError(f"got {len(text_actions)} actions for {self.pool.num_envs} envs")
        rewards = np.zeros(self.pool.num_envs, dtype=np.float32)
        running = {i: text_actions[i] for i in np.flatnonzero(~self._done)}
        for result in self.pool.step(running) if running else []:
            i = result.env_index
            self._prompts[i] = result.obs
            valid = "env_error" not in result.info and bool(result.info.get("action_valid", False))
            self._infos[i] = dict(result.info, is_action_valid=valid)
            rewards[i] = result.reward
            self._done[i] = result.done
        return self._observations(), rewards, self._done.copy(), [dict(info) for info in self._infos]

    def success_evaluator(self, *args: Any, **kwargs: Any) -> dict[str, np.ndarray]:
        """``{"success_rate": won per env}`` of the episodes just played (verl-agent calls it at the end)."""
        return {"success_rate": np.array([float(info.get("won", False)) for info in self._infos])}

    def close(self) -> None:
        self.pool.close()
