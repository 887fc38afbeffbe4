"""Where each env of a pool lives: its group, its member index and the worker that hosts it.

Env ``i`` is member ``i % group_size`` of group ``i // group_size`` and lives on worker
``i % num_workers``: round-robin over the flat index. Envs cannot move between workers (their
state lives there), so the placement must balance the *active* envs, not just the envs. Members
of one group play the same task and tend to last equally long, and whole groups finish early
together on easy tasks; round-robin spreads every group over ``min(group_size, num_workers)``
workers, so whichever groups are still running keep all workers busy, and no worker hosts more
than one env above any other.
"""

from __future__ import annotations

from dataclasses import dataclass


def check_positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


@dataclass(frozen=True)
class Layout:
    num_groups: int
    group_size: int
    num_workers: int

    def __post_init__(self) -> None:
        for name in ("num_groups", "group_size", "num_workers"):
            check_positive_int(name, getattr(self, name))
        if self.num_workers > self.num_envs:
            raise ValueError(f"num_workers ({self.num_workers}) exceeds the number of envs ({self.num_envs})")

    @property
    def num_envs(self) -> int:
        return self.num_groups * self.group_size

    def group_of(self, env_index: int) -> tuple[int, int]:
        """``(group, member)`` of an env."""
        return divmod(env_index, self.group_size)

    def members(self, group: int) -> range:
        """The env indices of a group's members."""
        return range(group * self.group_size, (group + 1) * self.group_size)

    def worker_of(self, env_index: int) -> int:
        return env_index % self.num_workers

    def hosted(self, worker: int) -> range:
        """The env indices a worker hosts."""
        return range(worker, self.num_envs, self.num_workers)
