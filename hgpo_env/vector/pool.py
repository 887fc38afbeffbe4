"""GroupedEnvPool: N copies of an env per task group, hosted by worker processes, stepped partially.

This is the only view of environments a trainer needs. The pool owns the bookkeeping that makes
group RL sound (every member of a group starts from the verified same state) and that keeps a
long run alive (a failing env or worker ends its episodes as truncated instead of ending the run).
"""

from __future__ import annotations

import enum
import logging
import os
import weakref
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from hgpo_env.contract.info import GROUP_KEYS
from hgpo_env.vector.host import EnvSpec, Reply
from hgpo_env.vector.layout import Layout, check_positive_int
from hgpo_env.vector.results import GroupMismatchError, PoolError, ResetResult, StepResult
from hgpo_env.vector.workers import Hosting, Workers

if TYPE_CHECKING:
    from typing_extensions import Self

logger = logging.getLogger(__name__)
BACKENDS = ("process", "ray", "openenv")
SEED_RANGE = 2**31 - 1


class _Status(enum.Enum):
    IDLE = "has not been reset (or its last reset failed): call reset() first"
    RUNNING = "is in an episode"
    OVER = "finished its episode: call reset() before stepping it again"


def _local_cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _backend(name: str) -> tuple[type[Workers], Callable[[], int]]:
    """The workers class of a backend and its default worker count; imports Ray only for "ray"."""
    if name == "process":
        from hgpo_env.vector.process import ProcessWorkers

        return ProcessWorkers, _local_cpus
    if name == "openenv":
        from hgpo_env.textenv.registration import extra_hint
        from hgpo_env.vector.remote import OpenEnvWorkers

        with extra_hint("hgpo_env.serve"):
            import hgpo_env.serve.client  # noqa: F401  (fail here, not in every worker)
        return OpenEnvWorkers, _local_cpus
    try:
        from hgpo_env.vector import ray_workers
    except ImportError as error:
        raise ImportError(f"backend='ray' needs Ray (pip install 'ray[default]'): {error}") from error
    return ray_workers.RayWorkers, ray_workers.default_num_workers


def _check_registered(env_id: str) -> None:
    """Fail here, in one line, for an id no worker could make (``module:Id`` imports ``module``)."""
    import gymnasium as gym

    from hgpo_env.textenv.registration import import_env_module

    try:
        gym.spec(import_env_module(env_id))
    except (ImportError, gym.error.Error) as error:
        raise ValueError(f"cannot make {env_id!r}: {error}") from None


class GroupedEnvPool:
    """``num_groups`` task groups of ``group_size`` copies of one env, spread over worker processes.

    Env ``i`` is member ``i % group_size`` of group ``i // group_size``. :meth:`reset` starts every
    member of a group on the same task and seed and checks they report one ``task_key`` and ``initial_fingerprint``;
    :meth:`step` steps only the envs it is given. Workers each host many envs, step the ones a
    call gives them back to back, and run in parallel (placement: :mod:`hgpo_env.vector.layout`).

    Faults end episodes, not runs: an env that raises in ``step``, or whose worker dies or takes
    longer than ``step_timeout`` seconds over one env's step, gives ``truncated=True`` with
    ``info["env_error"]``. A dead or late worker is killed and restarted; the other episodes it
    hosted died with it and report the same on their next step. A worker that cannot be restarted
    stays down until the next :meth:`reset`, which retries it with backoff (and restarts a worker
    that died between episodes). Every wait has a deadline, so nothing hangs.

    Workers are spawned, so a script that makes a pool needs the ``if __name__ == "__main__":``
    guard. ``num_envs``, ``num_groups``, ``group_size`` and ``num_workers`` are plain attributes;
    treat them, like the arguments, as read-only.

    Args:
        env_id: a registered Gymnasium id (e.g. ``"HGPO-Rooms-v0"``; ``"module:Id"`` imports
            ``module`` in each worker first), or a picklable callable taking ``env_kwargs`` and
            returning an env.
        num_groups: task groups; the pool holds ``num_groups * group_size`` envs.
        group_size: envs per group (the rollouts that share a task).
        num_workers: worker processes (Ray actors); default one per CPU, at most one per env.
        seed: seeds the per-group seeds that :meth:`reset` draws when given none.
        backend: ``"process"`` (spawned local processes), ``"ray"`` (Ray actors), or
            ``"openenv"`` (local processes whose envs are sessions on the env servers ``servers``,
            :mod:`hgpo_env.vector.remote`).
        servers: base URLs of ``python -m hgpo_env serve`` servers (``backend="openenv"`` only).
        server_token: their bearer token (``backend="openenv"``); None reads ``$HGPO_SERVE_TOKEN``.
        step_timeout: seconds one env may take over a step before its worker is killed.
        reset_timeout: seconds one env may take over a reset, or to be made.
        ray_actor_options: overrides for ``ray.remote`` (``backend="ray"`` only).
        env_kwargs: passed to ``gymnasium.make`` (or the callable) in every worker.
    """

    def __init__(
        self,
        env_id: EnvSpec,
        num_groups: int,
        group_size: int,
        *,
        num_workers: int | None = None,
        seed: int | None = None,
        backend: str = "process",
        step_timeout: float = 60.0,
        reset_timeout: float = 300.0,
        ray_actor_options: Mapping[str, Any] | None = None,
        servers: Sequence[str] | None = None,
        server_token: str | None = None,
        **env_kwargs: Any,
    ) -> None:
        for name, value in (
            ("num_groups", num_groups),
            ("group_size", group_size),
            ("num_workers", num_workers),
        ):
            if value is not None:
                check_positive_int(name, value)  # before any arithmetic on them
        if isinstance(env_id, str):
            _check_registered(env_id)
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        if ray_actor_options is not None and backend != "ray":
            raise ValueError("ray_actor_options needs backend='ray'")
        if (servers is not None) != (backend == "openenv"):
            raise ValueError("backend='openenv' needs servers=[url, ...], and servers need backend='openenv'")
        if server_token is not None and backend != "openenv":
            raise ValueError("server_token needs backend='openenv'")
        if not step_timeout > 0 or not reset_timeout > 0:
            raise ValueError(f"timeouts must be positive, got step {step_timeout!r}, reset {reset_timeout!r}")
        self.env_id = env_id
        self.backend = backend
        self.step_timeout = float(step_timeout)
        self.reset_timeout = float(reset_timeout)
        self._rng = np.random.default_rng(seed)
        workers_class, default_workers = _backend(backend)
        if num_workers is None:
            num_workers = min(num_groups * group_size, default_workers())
        self._layout = Layout(num_groups, group_size, num_workers)
        self.num_groups, self.group_size, self.num_workers = num_groups, group_size, num_workers
        self.num_envs = self._layout.num_envs
        hosted = [self._layout.hosted(w) for w in range(num_workers)]
        extra: dict[str, Any] = {"actor_options": ray_actor_options} if backend == "ray" else {}
        if backend == "openenv":
            extra = {"servers": list(servers or ()), "step_timeout": self.step_timeout, "token": server_token}
        hosting = Hosting(env_id, dict(env_kwargs), hosted)
        self._workers: Workers = workers_class(hosting, self.reset_timeout, **extra)
        self._close = weakref.finalize(self, self._workers.close)
        self._status = [_Status.IDLE] * self.num_envs
        self._last: list[tuple[str, dict[str, Any]]] = [("", {})] * self.num_envs
        self._lost: dict[int, str] = {}
        try:
            self._workers.start()
        except BaseException:
            self.close()
            raise

    # ----------------------------------------------------------------- shape
    def group_of(self, env_index: int) -> tuple[int, int]:
        """``(group, member)`` of an env."""
        return self._layout.group_of(self._check_index(env_index))

    def members(self, group: int) -> range:
        """The env indices of a group."""
        if not 0 <= group < self.num_groups:
            raise IndexError(f"group {group} out of range: the pool has {self.num_groups} groups")
        return self._layout.members(group)

    def worker_of(self, env_index: int) -> int:
        """The worker that hosts an env."""
        return self._layout.worker_of(self._check_index(env_index))

    # ----------------------------------------------------------------- state
    @property
    def running(self) -> list[int]:
        """Envs whose episode has not reported its end yet: those to step next."""
        return [i for i, status in enumerate(self._status) if status is _Status.RUNNING]

    @property
    def num_restarts(self) -> int:
        """Workers restarted so far (after a death or a timeout)."""
        return self._workers.restarts

    @property
    def closed(self) -> bool:
        return not self._close.alive

    def worker_pids(self) -> list[int]:
        """Process id of each worker (-1 while one is down), for monitoring."""
        self._check_open()
        return self._workers.pids()

    # ----------------------------------------------------------------- reset
    def reset(
        self,
        *,
        seeds: Sequence[int] | None = None,
        task_ids: Sequence[int] | None = None,
        options: Sequence[Mapping[str, Any] | None] | None = None,
    ) -> list[ResetResult]:
        """Start a new episode in every env; returns one result per env, in env order.

        Each argument has one entry per group. Every member of group ``g`` is reset with seed
        ``seeds[g]`` (drawn from the pool's seed when not given) and options ``options[g]``, with
        ``task_ids[g]`` as ``options["task_id"]``. Raises :class:`GroupMismatchError` when a
        group's members report different ``task_key`` or ``initial_fingerprint``, and :class:`PoolError` when an
        env or worker fails; after either, every env waits for the next ``reset``.
        """
        self._check_open()
        seeds = self._per_group("seeds", seeds)
        task_ids = self._per_group("task_ids", task_ids)
        options = self._per_group("options", options)
        if seeds is None:
            seeds = self._rng.integers(SEED_RANGE, size=self.num_groups)
        seeds = [int(seed) for seed in seeds]
        group_options = [dict(o or {}) for o in options or [None] * self.num_groups]
        for group, task_id in enumerate(task_ids or []):
            group_options[group]["task_id"] = task_id
        batches: dict[int, list[Any]] = defaultdict(list)
        for index in range(self.num_envs):
            group = index // self.group_size
            batches[self._layout.worker_of(index)].append((index, seeds[group], group_options[group]))
        self._status = [_Status.IDLE] * self.num_envs
        self._lost.clear()
        self._workers.revive()  # a worker that could not be restarted gets its retries now
        replies, failures = self._run("reset", batches, self.reset_timeout)
        if failures:  # a worker died (say, between episodes) and was restarted: once more on it
            self._workers.revive()
            retried, _ = self._run("reset", {w: batches[w] for w in failures}, self.reset_timeout)
            replies.update(retried)
        errors = [
            f"{self._name(index)}: {error}" for index, error in replies.items() if isinstance(error, str)
        ]
        if errors:
            raise PoolError(
                f"reset failed for {len(errors)} env(s); the pool is usable, call reset() again:\n"
                + "\n".join(errors[:8])
            )
        results = []
        for index in range(self.num_envs):
            obs, info = replies[index].value
            self._last[index] = (obs, info)
            results.append(ResetResult(index, *self._layout.group_of(index), obs, info))
        self._check_groups(results, seeds, group_options)
        self._status = [_Status.RUNNING] * self.num_envs
        return results

    def _check_groups(self, results: list[ResetResult], seeds: Sequence[int], options: Sequence[Any]) -> None:
        """Every member of a group must report one task (``task_key``) and one start
        (``initial_fingerprint``); name the members that differ from the group's majority."""
        missing = [r.env_index for r in results if not all(key in r.info for key in GROUP_KEYS)]
        if missing:
            raise PoolError(
                f"envs {missing[:8]} report no info['task_key'] or info['initial_fingerprint']: the pool "
                "needs envs on the info contract under the K-step memory wrapper (every HGPO-* id and "
                "every TextEnv / TextAdapter has both)"
            )
        mismatches = []
        for group in range(self.num_groups):
            members = list(self._layout.members(group))
            identity = {m: tuple(results[i].info[key] for key in GROUP_KEYS) for m, i in enumerate(members)}
            majority, _ = Counter(identity.values()).most_common(1)[0]
            odd = [m for m, found in identity.items() if found != majority]
            if odd:
                differ = [
                    key for n, key in enumerate(GROUP_KEYS) if any(identity[m][n] != majority[n] for m in odd)
                ]
                task = {m: results[i].info.get("task", "?") for m, i in enumerate(members)}
                others = task[next(m for m in identity if identity[m] == majority)]
                mismatches.append(
                    f"group {group} (seed {seeds[group]}, options {options[group]}): members {odd} "
                    f"(envs {[members[m] for m in odd]}) differ from the other {len(members) - len(odd)} "
                    f"in {' and '.join(differ)}; their tasks {[task[m] for m in odd]}, the others' {others!r}"
                )
        if mismatches:
            raise GroupMismatchError(
                f"{len(mismatches)} group(s) whose members did not start the same task, so they are not "
                "comparable (an env that ignores its seed, or draws its hidden state from a shared "
                "random stream?):\n" + "\n".join(mismatches[:8])
            )

    # ----------------------------------------------------------------- step
    def step(self, actions: Mapping[int, str]) -> list[StepResult]:
        """Step the envs named in ``actions`` (env index -> response); one result each, in that order.

        Only envs in an episode may be stepped (see :attr:`running`); nothing is sent unless every
        entry is valid.
        """
        self._check_open()
        items = [(self._check_index(index), action) for index, action in actions.items()]
        for index, action in items:
            if self._status[index] is not _Status.RUNNING:
                raise RuntimeError(f"{self._name(index)} {self._status[index].value}")
            if not isinstance(action, str):
                raise TypeError(f"the action for env {index} must be a str, got {type(action).__name__}")
        results: dict[int, StepResult] = {}
        batches: dict[int, list[Any]] = defaultdict(list)
        for index, action in items:
            if index in self._lost:
                results[index] = self._failed(index, self._lost.pop(index))
            else:
                batches[self._layout.worker_of(index)].append((index, action))
        replies, failures = self._run("step", batches, self.step_timeout)
        for index, reply in replies.items():
            results[index] = self._failed(index, reply) if isinstance(reply, str) else self._stepped(reply)
        for worker, reason in failures.items():  # the rest of its episodes died with it
            for index in self._layout.hosted(worker):
                if self._status[index] is _Status.RUNNING:
                    self._lost.setdefault(index, reason)
        return [results[index] for index, _ in items]

    def _stepped(self, reply: Reply) -> StepResult:
        obs, reward, terminated, truncated, info = reply.value
        index = reply.env_index
        self._last[index] = (obs, info)
        if terminated or truncated:
            self._status[index] = _Status.OVER
        return StepResult(index, *self._layout.group_of(index), obs, reward, terminated, truncated, info)

    def _failed(self, index: int, error: str) -> StepResult:
        """The truncated result of an episode that an env or worker failure ended."""
        obs, info = self._last[index]
        info = {**info, "env_error": error}
        info.pop("initial_fingerprint", None)
        self._status[index] = _Status.OVER
        return StepResult(index, *self._layout.group_of(index), obs, 0.0, False, True, info)

    # ----------------------------------------------------------------- running batches
    def _run(
        self, method: str, batches: Mapping[int, list[Any]], timeout: float
    ) -> tuple[dict[int, Reply | str], dict[int, str]]:
        """Each env's reply or the reason (str) it has none, and why each failed worker failed."""
        out: dict[int, Reply | str] = {}
        failures: dict[int, str] = {}
        for worker, (replies, failure) in self._workers.run(method, batches, timeout).items():
            for reply in replies:
                if reply.error is not None:
                    logger.warning("%s: %s\n%s", self._name(reply.env_index), reply.error, reply.detail)
                out[reply.env_index] = reply if reply.error is None else reply.error
            if failure is None:
                continue
            down = self._workers.down.get(worker)
            now = f"it could not be restarted ({down})" if down else "it was restarted"
            failures[worker] = f"worker {worker} {failure}; {now} and the episodes it hosted were lost"
            logger.warning("%s", failures[worker])
            for item in batches[worker][len(replies) :]:
                out[item[0]] = failures[worker]
        return out, failures

    # ----------------------------------------------------------------- helpers
    def _name(self, index: int) -> str:
        group, member = self._layout.group_of(index)
        return f"env {index} (group {group}, member {member})"

    def _per_group(self, name: str, values: Sequence[Any] | None) -> list[Any] | None:
        if values is None:
            return None
        values = list(values)
        if len(values) != self.num_groups:
            raise ValueError(f"{name} needs one entry per group ({self.num_groups}), got {len(values)}")
        return values

    def _check_index(self, env_index: int) -> int:
        if isinstance(env_index, bool) or not isinstance(env_index, (int, np.integer)):
            raise TypeError(f"an env index is an int, got {type(env_index).__name__}")
        if not 0 <= env_index < self.num_envs:
            raise IndexError(f"env index {env_index} out of range: the pool has {self.num_envs} envs")
        return int(env_index)

    def _check_open(self) -> None:
        if self.closed:
            raise RuntimeError("the pool is closed")

    # ----------------------------------------------------------------- lifetime
    def close(self) -> None:
        """Stop every worker; idempotent. Also runs when the pool is garbage-collected."""
        self._close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"GroupedEnvPool({self.env_id!r}, num_groups={self.num_groups}, group_size={self.group_size}, "
            f"num_workers={self.num_workers}, backend={self.backend!r})"
        )
