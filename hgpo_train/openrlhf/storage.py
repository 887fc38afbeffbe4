"""Every node must see the run folder and the model the driver sees, before training starts.

Actors on other nodes load the model from its path and DeepSpeed ranks write their checkpoint
shards into the run folder, so both must be on storage every node mounts (NFS, a cluster file
system). Without it a run fails minutes in, on one node, with an error about a missing file; or
worse, each node writes its shards to a local folder of the same name and no node holds a whole
checkpoint. :func:`check_nodes` runs :func:`node_problem` on every node: the driver leaves a
token in the run folder, each node must read it back there, write its own, and read the model.
"""

from __future__ import annotations

import secrets
from pathlib import Path

from hgpo_train.config import ConfigError
from hgpo_train.openrlhf.placement import node_name

PROBE_TIMEOUT_S = 300.0
"""A node's first task may wait for the runtime env (the project's code) to be set up there."""


def node_problem(run_dir: str, token: str, model_dir: str | None) -> str | None:
    """On one node: why it cannot use the run's storage, or None. Leaves a file named after ``token``."""
    folder = Path(run_dir)
    seen = folder / f".storage-{token}"
    try:
        if seen.read_text() != token:
            return f"sees another {seen.name} in the run folder {run_dir}"
    except OSError as error:
        return f"cannot see the driver's run folder {run_dir} ({error.strerror or error})"
    try:
        (folder / f".storage-{token}-{secrets.token_hex(4)}").write_text(token)
    except OSError as error:
        return f"cannot write the run folder {run_dir} ({error.strerror or error})"
    if model_dir is not None and not (Path(model_dir) / "config.json").is_file():
        return f"cannot read the model at {model_dir} (no config.json there)"
    return None


def check_nodes(run_dir: Path, model: str) -> None:
    """Raise ConfigError naming every node that cannot use the run folder or the model (a hub
    name instead of a folder is downloaded by each node and not checked)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    token = secrets.token_hex(8)
    marker = run_dir / f".storage-{token}"
    marker.write_text(token)
    model_dir = model if Path(model).is_dir() else None
    probe = ray.remote(num_cpus=0, max_retries=0)(node_problem)
    nodes = [
        n for n in ray.nodes() if n["Alive"] and (n["Resources"].get("CPU") or n["Resources"].get("GPU"))
    ]
    try:
        answers: list[str | None] = ray.get(
            [
                probe.options(
                    scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
                ).remote(str(run_dir), token, model_dir)
                for n in nodes
            ],
            timeout=PROBE_TIMEOUT_S,
        )
    except ray.exceptions.GetTimeoutError as error:
        raise ConfigError(
            f"not every Ray node answered the storage check within {PROBE_TIMEOUT_S:g} s"
        ) from error
    finally:
        for path in run_dir.glob(f".storage-{token}*"):
            path.unlink(missing_ok=True)
    problems = [f"{node_name(n)} {answer}" for n, answer in zip(nodes, answers, strict=True) if answer]
    if problems:
        raise ConfigError(
            "; ".join(problems) + ": the run folder (train.output_dir) and the model must be on storage "
            "every node of the Ray cluster mounts at the same path"
        )
