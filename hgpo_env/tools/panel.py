"""Task panels: the ordered tasks an evaluation plays, each with its task key, and a hash of all.

A success rate is only comparable with another measured on the same tasks. Task ids alone do not
say which tasks those are (another ALFWorld data version, another WebShop goal file, a changed
Rooms generator give other tasks under the same ids), but every env reports the key of the task
it plays (``info["task_key"]``, equal across machines for one task). A panel lists, in play order,
each task id with its key; its hash is the sha256 of that list with the env id and split, so two
results name the same tasks exactly when their panel hashes are equal.

    python -m hgpo_env panel HGPO-ALFWorld-v0 valid_unseen      # the manifest, as JSON

The package ships the manifest of each env's evaluation split (:data:`SHIPPED`, in
``hgpo_env/panels/``): ``eval.panel: HGPO-ALFWorld-v0.valid_seen`` plays and checks those tasks.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym


@dataclass(frozen=True)
class ShippedPanel:
    """How a shipped manifest was made: ``build_panel(env_id, split, tasks)`` with the env's default
    arguments, and the benchmark's official data where the env reads data (``data_path``)."""

    env_id: str
    split: str
    tasks: int | None
    """The first this many task ids (envs that generate tasks without end), or None: the whole split."""
    data: str | None = None
    """The folder of the official data (``../shared/data/<data>`` here) the env reads, if any."""

    @property
    def path(self) -> Path:
        return PANELS / f"{self.name}.json"

    @property
    def name(self) -> str:
        return f"{self.env_id}.{self.split}"


PANELS = Path(__file__).parents[1] / "panels"
SHIPPED = {
    panel.name: panel
    for panel in (
        ShippedPanel("HGPO-Rooms-v0", "eval", 100),
        ShippedPanel("HGPO-ALFWorld-v0", "valid_seen", None, data="alfworld"),
        ShippedPanel("HGPO-WebShop-v0", "test", None, data="webshop"),
        ShippedPanel("HGPO-TextWorldExpress-v0", "test", None),
        ShippedPanel("HGPO-ScienceWorld-v0", "test", None),
        ShippedPanel("HGPO-BabyAI-v0", "eval", 100),
        ShippedPanel("HGPO-TextArena-v0", "eval", 100),
    )
}
"""The manifests in ``hgpo_env/panels/``, by name (``<env id>.<split>``). WebShop's test goals are
the same 500 under both protocols. ALFWorld's valid_unseen is not shipped (its games were not at
hand when these were made: ``python -m hgpo_env panel HGPO-ALFWorld-v0 valid_unseen`` makes it);
HGPO-TextWorld-v0 plays the user's own games, whose panel only the user can make."""


class PanelError(ValueError):
    """A panel that cannot be trusted: tasks that repeat, or tasks other than its manifest's."""


@dataclass(frozen=True)
class Panel:
    """The tasks of one evaluation split, in play order."""

    env_id: str
    split: str | None
    task_ids: tuple[int, ...]
    task_keys: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.task_ids) != len(self.task_keys):
            raise PanelError(f"{len(self.task_ids)} task ids but {len(self.task_keys)} task keys")
        seen: dict[int, int] = {}
        for task_id, key in zip(self.task_ids, self.task_keys):
            if key in seen:
                raise PanelError(
                    f"{self.env_id} {self.split}: tasks {seen[key]} and {task_id} are the same task "
                    f"(task key {key}): a panel plays each task once per pass"
                )
            seen[key] = task_id

    @property
    def hash(self) -> str:
        """sha256 of the env id, the split and the ordered (task id, task key) pairs."""
        canonical = {"env_id": self.env_id, "split": self.split, "tasks": self._pairs()}
        return hashlib.sha256(json.dumps(canonical, separators=(",", ":")).encode()).hexdigest()

    def _pairs(self) -> list[list[Any]]:
        return [[task_id, str(key)] for task_id, key in zip(self.task_ids, self.task_keys)]

    def to_json(self) -> dict[str, Any]:
        """The manifest (keys as decimal strings: 64-bit integers do not survive JSON doubles)."""
        return {
            "env_id": self.env_id,
            "split": self.split,
            "size": len(self.task_ids),
            "sha256": self.hash,
            "tasks": self._pairs(),
        }

    @classmethod
    def from_json(cls, manifest: Mapping[str, Any]) -> Panel:
        """A panel from its manifest; a manifest whose hash does not match its tasks is refused."""
        tasks = manifest["tasks"]
        panel = cls(
            manifest["env_id"],
            manifest.get("split"),
            tuple(int(task_id) for task_id, _ in tasks),
            tuple(int(key) for _, key in tasks),
        )
        if manifest.get("sha256", panel.hash) != panel.hash:
            raise PanelError("the manifest's sha256 does not match its tasks: it was edited")
        return panel

    @classmethod
    def load(cls, path: str | Path) -> Panel:
        """The panel of a manifest file, or of a shipped manifest by name (:data:`SHIPPED`); one
        that cannot be read is a :class:`PanelError`."""
        if str(path) in SHIPPED and not Path(path).exists():
            path = SHIPPED[str(path)].path
        try:
            return cls.from_json(json.loads(Path(path).read_text()))
        except (OSError, ValueError, KeyError, TypeError) as error:
            if isinstance(error, PanelError):
                raise
            raise PanelError(f"{path}: not a panel manifest ({type(error).__name__}: {error})") from None

    def check(self, other: Panel) -> None:
        """Raise :class:`PanelError` in one line unless ``other`` names the same tasks in the same order."""
        if other.hash == self.hash:
            return
        if (other.env_id, other.split) != (self.env_id, self.split):
            raise PanelError(
                f"the panel is {self.env_id} {self.split}, this evaluation {other.env_id} {other.split}"
            )
        if other.task_ids != self.task_ids:
            raise PanelError(
                f"this evaluation plays other task ids than the panel ({len(other.task_ids)} vs "
                f"{len(self.task_ids)}, first difference at position {_first_difference(self.task_ids, other.task_ids)})"
            )
        position = _first_difference(self.task_keys, other.task_keys)
        raise PanelError(
            f"task {self.task_ids[position]} is another task here than in the panel (task key "
            f"{other.task_keys[position]}, the panel's {self.task_keys[position]}): the env's data "
            f"differs from the panel's ({sum(a != b for a, b in zip(self.task_keys, other.task_keys))} "
            "tasks differ)"
        )


def _first_difference(a: Sequence[Any], b: Sequence[Any]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def panel_from_episodes(
    env_id: str, split: str | None, task_ids: Sequence[int], played: Iterable[tuple[int, int]]
) -> Panel:
    """The panel of ``task_ids`` from the ``(task id, task key)`` of every episode played; raises
    :class:`PanelError` if a task id gave two keys (its task changed between episodes) or was
    not played."""
    keys: dict[int, int] = {}
    for task_id, key in played:
        if keys.setdefault(task_id, key) != key:
            raise PanelError(f"task {task_id} was two different tasks (keys {keys[task_id]} and {key})")
    missing = [t for t in task_ids if t not in keys]
    if missing:
        raise PanelError(f"tasks {missing[:8]} were not played")
    return Panel(env_id, split, tuple(task_ids), tuple(keys[t] for t in task_ids))


def build_panel(
    env_id: str,
    split: str | None = None,
    tasks: Sequence[int] | None = None,
    env_kwargs: Mapping[str, Any] | None = None,
) -> Panel:
    """The panel of a split: every task (or ``tasks``) reset once, in task-id order."""
    kwargs = {**(env_kwargs or {}), **({"split": split} if split is not None else {})}
    env = gym.make(env_id, **kwargs)
    try:
        if tasks is None:
            count = env.unwrapped.num_tasks
            if count is None:
                raise PanelError(f"{env_id} generates tasks without end: name the task ids of its panel")
            tasks = range(count)
        played = []
        for task_id in tasks:
            _, info = env.reset(seed=0, options={"task_id": int(task_id)})
            played.append((int(task_id), int(info["task_key"])))
    finally:
        env.close()
    return panel_from_episodes(env_id, split, [t for t, _ in played], played)
