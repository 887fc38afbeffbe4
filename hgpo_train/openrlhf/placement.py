"""Can the cluster place this run? Checked per node, before any actor exists.

Ray waits without end for a placement group or an actor that no node has room for, and OpenRLHF's
launcher waits on them with no timeout, so a run that cannot be placed hangs silently. Summing
the cluster's CPUs and GPUs is not enough: a bundle needs its CPU and GPU on one node, and the
controller must run on the driver's node (it writes the run folder). :func:`demands` lists what
OpenRLHF 0.11.2's launcher and this backend reserve, :func:`unplaced` packs them onto the nodes'
free resources the way Ray's PACK strategy may, :func:`check_capacity` refuses at once a run that
would not fit even an idle cluster, and :func:`wait_until_placeable` gives up after a bounded
wait with one line naming what does not fit and where there is room.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from hgpo_train.config import BACKEND_SECTION as SECTION
from hgpo_train.config import Config, ConfigError, OpenRLHFConfig

Resources = dict[str, float]


@dataclass(frozen=True)
class Demand:
    """One bundle or actor the run reserves: ``cpus`` and ``gpus`` on one node (``node`` if pinned)."""

    what: str
    cpus: float
    gpus: float = 0.0
    node: str | None = None


def demands(config: Config, cluster: OpenRLHFConfig, driver_node: str | None = None) -> list[Demand]:
    """What the run reserves, in the order the launcher asks for it.

    Policy and reference share one {GPU: 1, CPU: 1} bundle per data-parallel rank (OpenRLHF's
    ``colocate_all`` or ``colocate_actor_ref``, as the backend sets them); the engines share those
    bundles when colocated in a synchronous run and get their own otherwise (an asynchronous run
    generates while the policy trains); then the controller (1 CPU on the driver's node) and the
    env worker actors.
    """
    out = [Demand(f"policy/reference rank {r}", 1.0, 1.0) for r in range(cluster.dp_size)]
    if not cluster.colocate_all or config.train.async_staleness:
        engine_gpus = cluster.vllm_num_engines * cluster.vllm_tensor_parallel_size
        out += [Demand(f"vLLM engine GPU {g}", 1.0, 1.0) for g in range(engine_gpus)]
    out.append(Demand("the controller (HGPOTrainer)", 1.0, node=driver_node))
    if config.env.backend != "openenv" and cluster.env_actor_cpus > 0:
        out += [Demand(f"env worker {w}", cluster.env_actor_cpus) for w in range(config.env.num_workers)]
    return out


def unplaced(wanted: list[Demand], free: dict[str, Resources]) -> tuple[Demand | None, dict[str, Resources]]:
    """The first demand no node can hold once the earlier ones are placed (None if all fit), and
    what is left free per node. Pinned demands go first, then the rest first-fit in order."""
    left = {node: {"CPU": r.get("CPU", 0.0), "GPU": r.get("GPU", 0.0)} for node, r in free.items()}
    for demand in sorted(wanted, key=lambda d: d.node is None):
        nodes = [demand.node] if demand.node is not None else list(left)
        fits = [
            n
            for n in nodes
            if n in left and left[n]["CPU"] >= demand.cpus - 1e-9 and left[n]["GPU"] >= demand.gpus - 1e-9
        ]
        if not fits:
            return demand, left
        left[fits[0]]["CPU"] -= demand.cpus
        left[fits[0]]["GPU"] -= demand.gpus
    return None, left


FIX = (
    f"Check {SECTION}.num_nodes/gpus_per_node/vllm_num_engines/colocate_all/env_actor_cpus and "
    "env.num_workers, or start nodes with more --num-cpus/--num-gpus"
)


def per_node(resources: dict[str, Resources], names: dict[str, str]) -> str:
    return "; ".join(f"{names.get(n, n)}: {r['CPU']:g} CPU, {r['GPU']:g} GPU" for n, r in resources.items())


def describe(demand: Demand, left: dict[str, Resources], names: dict[str, str]) -> str:
    """One line: what does not fit, how much it needs, and what each node still has."""
    need = f"{demand.cpus:g} CPU" + (f" + {demand.gpus:g} GPU" if demand.gpus else "")
    where = f" on the driver's node {names.get(demand.node, demand.node)}" if demand.node else " on one node"
    return (
        f"the Ray cluster cannot place {demand.what} ({need}{where}); free after the rest of the run: "
        f"{per_node(left, names) or 'no live nodes'}. {FIX}"
    )


def check_capacity(wanted: list[Demand], capacity: dict[str, Resources], names: dict[str, str]) -> None:
    """Raise ConfigError at once when the run does not fit the nodes even with nothing else running
    (``capacity``: each node's total resources): no wait can help once every node has joined."""
    missing, _ = unplaced(wanted, capacity)
    if missing is None:
        return
    cpus, gpus = sum(d.cpus for d in wanted), sum(d.gpus for d in wanted)
    total = {k: sum(r.get(k, 0.0) for r in capacity.values()) for k in ("CPU", "GPU")}
    raise ConfigError(
        f"the run needs {cpus:g} CPU and {gpus:g} GPU, and {missing.what} fits no node of the Ray "
        f"cluster even when it is idle: its {len(capacity)} nodes have {total['CPU']:g} CPU and "
        f"{total['GPU']:g} GPU in all ({per_node(capacity, names)}). {FIX}"
    )


def wait_until_placeable(
    wanted: list[Demand],
    free_per_node: Callable[[], dict[str, Resources]],
    names: dict[str, str],
    timeout_s: float,
    poll_s: float = 2.0,
) -> None:
    """Return once the run fits the nodes' free resources; raise ConfigError after ``timeout_s``
    (nodes may still be joining, or another job may be releasing its resources)."""
    deadline = time.monotonic() + timeout_s
    while True:
        missing, left = unplaced(wanted, free_per_node())
        if missing is None:
            return
        if time.monotonic() >= deadline:
            raise ConfigError(describe(missing, left, names) + f" (waited {timeout_s:g} s)")
        time.sleep(poll_s)


def node_name(node: dict) -> str:
    """How a line names a node of ``ray.nodes()``: its address and port (nodes may share an address)."""
    return f"node {node['NodeManagerAddress']}:{node['NodeManagerPort']}"


def check_cluster(config: Config, cluster: OpenRLHFConfig) -> None:
    """:func:`wait_until_placeable` against the connected Ray cluster's live nodes."""
    import ray
    from ray._private.state import available_resources_per_node  # as verl's resource pools read it

    alive = [n for n in ray.nodes() if n["Alive"]]
    names = {n["NodeID"]: node_name(n) for n in alive}
    driver = ray.get_runtime_context().get_node_id()
    wanted = demands(config, cluster, driver)
    if len(alive) >= cluster.num_nodes:  # every node the run expects has joined
        capacity = {n["NodeID"]: {k: n["Resources"].get(k, 0.0) for k in ("CPU", "GPU")} for n in alive}
        check_capacity(wanted, capacity, names)

    def free_on_live_nodes() -> dict[str, Resources]:
        return {node: free for node, free in available_resources_per_node().items() if node in names}

    wait_until_placeable(wanted, free_on_live_nodes, names, cluster.placement_timeout_s)
