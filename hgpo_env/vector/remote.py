"""The ``openenv`` backend: pool workers whose envs are sessions on remote env servers.

Each worker is a local process (as in the process backend) hosting :class:`RemoteEnv` sessions
on ``servers[worker % len(servers)]``, so the envs spread over the servers and the workers wait
on them in parallel, and each worker steps its sessions at once (:class:`ConcurrentEnvHost`), so a
silent server costs a call one ``step_timeout``. Every fault of the process backend keeps its
meaning; in addition a server that dies or stops answering within ``step_timeout`` fails only the
steps of its sessions (those episodes end truncated with ``info["env_error"]``, which names the
server, the operation and the timeout), and their next reset moves to a server that takes it
(:class:`~hgpo_env.serve.client.RemoteEnv`).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from hgpo_env.vector.host import ConcurrentEnvHost, EnvSpec
from hgpo_env.vector.process import ProcessWorkers
from hgpo_env.vector.workers import Hosting

SLACK = 5.0
"""Seconds a worker gets beyond its sessions' own timeouts before it is given up for dead."""


def _remote_env(
    servers: Sequence[str], primary: int, timeout: float, env_id: str, token: str | None, **env_kwargs: Any
) -> Any:
    from hgpo_env.serve.client import RemoteEnv  # the serve extra, imported in the worker

    return RemoteEnv(servers, primary, timeout=timeout, env_id=env_id, token=token, **env_kwargs)


class OpenEnvWorkers(ProcessWorkers):
    host_class = ConcurrentEnvHost  # sessions wait on their servers: a worker steps them all at once

    def __init__(
        self,
        hosting: Hosting,
        start_timeout: float,
        *,
        servers: Sequence[str],
        step_timeout: float,
        token: str | None = None,
    ) -> None:
        if not isinstance(hosting.env, str):
            raise TypeError("backend='openenv' takes a registered env id (the servers make the envs)")
        if not servers:
            raise ValueError("backend='openenv' needs servers=[url, ...]")
        super().__init__(hosting, start_timeout)
        self._factories = [
            functools.partial(_remote_env, list(servers), worker, step_timeout, hosting.env, token)
            for worker in range(len(self.hosted))
        ]

    def _patience(self, timeout: float) -> float:
        """The sessions time out by themselves after ``timeout``; the worker's deadline comes
        later, so a silent server costs its episodes, not the worker and the others it hosts."""
        return timeout + SLACK

    def _env(self, worker: int) -> EnvSpec:
        return self._factories[worker]
