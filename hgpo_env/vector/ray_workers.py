"""The Ray backend: each worker is a Ray actor running an :class:`EnvHost`, placed on CPU.

Imported only for ``backend="ray"``, so hgpo_env needs no Ray otherwise. The pool joins the Ray
cluster this process is connected to, or starts a local one (``ray.init()``). Actors take one CPU
each and are spread over the nodes; ``actor_options`` override that (``num_cpus``, ``resources``,
``runtime_env``, ...). Env code must be importable on the nodes (install the package there).

A node that is lost takes only its actors' episodes: their replacements are kept off that node
(Ray may still list it as alive for a while) and go to a live node with room for them; when no
node has room, the replacement is not attempted and the error says what is missing. A node Ray
still lists as alive :data:`LOST_NODE_GRACE` seconds later was only unreachable for a moment,
and is used again.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterator, Mapping, Sequence
from typing import Any

import ray
from ray._private.state import available_resources_per_node  # no public per-node view; ray is pinned
from ray.exceptions import ActorUnavailableError, RayError

from hgpo_env.vector.host import EnvHost, Reply, sendable
from hgpo_env.vector.workers import Hosting, WorkerFailure, Workers

DEFAULT_ACTOR_OPTIONS: dict[str, Any] = {"num_cpus": 1, "scheduling_strategy": "SPREAD"}
LOST_NODE_GRACE = 30.0
"""Seconds after which a lost node that Ray still lists as alive is trusted again (Ray declares
a dead node dead within about 15 s)."""
ROOM_WAIT = 3.0
"""Seconds a replacement waits for room on the live nodes before it is given up."""
CLOSE_TIMEOUT = 5.0
"""Seconds the actors get to close their envs, and then to be confirmed dead, at close."""


def _connect() -> None:
    if not ray.is_initialized():
        ray.init()


class _RayEnvHost(EnvHost):
    """An EnvHost whose replies are checked before Ray serialises them: a reply that fails to
    serialise in a streaming generator would end the whole batch."""

    def reset(self, requests: Sequence[tuple[int, int | None, dict[str, Any] | None]]) -> Iterator[Reply]:
        for reply in super().reset(requests):
            yield sendable(reply, ray.cloudpickle.dumps)

    def step(self, requests: Sequence[tuple[int, str]]) -> Iterator[Reply]:
        for reply in super().step(requests):
            yield sendable(reply, ray.cloudpickle.dumps)

    def node_id(self) -> str:
        """The Ray node this actor lives on."""
        return ray.get_runtime_context().get_node_id()


def default_num_workers() -> int:
    """One worker per CPU of the cluster."""
    _connect()
    return max(1, int(ray.cluster_resources().get("CPU", 1)))


class RayWorkers(Workers):
    def __init__(
        self, hosting: Hosting, start_timeout: float, actor_options: Mapping[str, Any] | None = None
    ) -> None:
        super().__init__(hosting, start_timeout)
        _connect()
        self._options = {**DEFAULT_ACTOR_OPTIONS, **(actor_options or {})}
        self._actor_class = ray.remote(_RayEnvHost)
        self._actors: list[Any] = [None] * len(self.hosted)
        self._pending: list[Any] = [None] * len(self.hosted)
        self._nodes: list[Any] = [None] * len(self.hosted)  # each actor's node id (an ObjectRef)
        self._lost_nodes: dict[str, float] = {}  # node id -> when it was lost
        self._room: dict[str, dict[str, float]] | None = None  # free resources while replacing

    def _boot(self, workers: Collection[int]) -> None:
        # Replacements after a node loss are checked against the room left, rather than left
        # pending until their start timeout; elsewhere Ray (or its autoscaler) places them.
        self._forgive_nodes()
        self._room = self._free_room() if self._lost_nodes else None
        try:
            super()._boot(workers)
        finally:
            self._room = None

    def _launch(self, worker: int) -> None:
        options = dict(self._options)
        if self._lost_nodes:
            options["label_selector"] = {"ray.io/node-id": f"!in({','.join(sorted(self._lost_nodes))})"}
        if self._room is not None:
            self._claim_room(worker)
        actor = self._actor_class.options(**options).remote(
            self._env(worker), self.hosting.env_kwargs, list(self.hosted[worker])
        )
        self._actors[worker], self._pending[worker] = actor, actor.pid.remote()
        self._nodes[worker] = actor.node_id.remote()

    def _forgive_nodes(self) -> None:
        if not self._lost_nodes:
            return
        alive = {node["NodeID"] for node in ray.nodes() if node["Alive"]}
        now = time.monotonic()
        for node, lost in list(self._lost_nodes.items()):
            if node in alive and now - lost > LOST_NODE_GRACE:
                del self._lost_nodes[node]

    def _need(self) -> dict[str, float]:
        return {"CPU": float(self._options.get("num_cpus", 1)), **self._options.get("resources", {})}

    def _free_room(self) -> dict[str, dict[str, float]]:
        free = available_resources_per_node()
        return {node: dict(room) for node, room in free.items() if node not in self._lost_nodes}

    def _claim_room(self, worker: int) -> None:
        """Take a replacement's resources from the node with the most room, or say what is missing."""
        need = self._need()
        deadline = time.monotonic() + ROOM_WAIT
        while True:  # the resources of actors just killed come back within a moment
            fits = [
                n for n, room in self._room.items() if all(room.get(k, 0.0) >= v for k, v in need.items())
            ]
            if fits or time.monotonic() > deadline:
                break
            time.sleep(0.25)
            self._room = self._free_room()
        if not fits:
            free = {node[:8]: room.get("CPU", 0.0) for node, room in self._room.items()}
            lost = sorted(node[:8] for node in self._lost_nodes)
            raise WorkerFailure(
                f"cannot be replaced: no live Ray node has {need} free (free CPUs by node: {free}; "
                f"lost nodes: {lost}); add a node or give the pool fewer workers"
            )
        node = max(fits, key=lambda n: self._room[n].get("CPU", 0.0))
        for key, value in need.items():
            self._room[node][key] -= value

    def _failed(self, worker: int, failure: WorkerFailure) -> None:
        """An actor that cannot be reached (rather than one whose process died) is on a lost node."""
        if isinstance(failure.__cause__, ActorUnavailableError) and self._nodes[worker] is not None:
            try:
                self._lost_nodes.setdefault(ray.get(self._nodes[worker], timeout=1.0), time.monotonic())
            except RayError:
                pass

    def _stop(self, worker: int) -> None:
        actor = self._actors[worker]
        self._actors[worker] = self._pending[worker] = None
        if actor is not None:
            ray.kill(actor, no_restart=True)

    def _send(self, worker: int, method: str, batch: list[Any]) -> None:
        actor = self._actors[worker]
        if actor is None:
            raise WorkerFailure("is not running")
        self._pending[worker] = getattr(actor, method).remote(batch)

    def _ready(self, workers: Collection[int], timeout: float) -> Collection[int]:
        by_ref = {self._pending[worker]: worker for worker in workers}
        ready, _ = ray.wait(list(by_ref), num_returns=len(by_ref), timeout=timeout)
        return {by_ref[ref] for ref in ready}

    def _receive(self, worker: int) -> list[Any]:
        pending = self._pending[worker]
        try:
            ref = next(pending) if isinstance(pending, ray.ObjectRefGenerator) else pending
            return [ray.get(ref)]
        except StopIteration:
            raise WorkerFailure("ended its answers early") from None
        except RayError as error:
            raise WorkerFailure(f"failed: {error}") from error

    def close(self) -> None:
        live = [actor for actor in self._actors if actor is not None]
        if not live or not ray.is_initialized():
            return
        ray.wait([actor.close.remote() for actor in live], num_returns=len(live), timeout=CLOSE_TIMEOUT)
        for worker in range(len(self._actors)):
            self._stop(worker)
        # A call to a killed actor fails once Ray has seen it die: wait for that, not longer.
        ray.wait([actor.pid.remote() for actor in live], num_returns=len(live), timeout=CLOSE_TIMEOUT)
