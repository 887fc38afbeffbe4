"""Vector execution: :class:`GroupedEnvPool` runs task groups of env copies on worker processes.

Ray is imported only by a pool made with ``backend="ray"``. The top floor of hgpo_env below its
command line: may import any other floor (the server's client for ``backend="openenv"``).
"""

from hgpo_env.vector.host import EnvSpec
from hgpo_env.vector.pool import BACKENDS, GroupedEnvPool
from hgpo_env.vector.results import GroupMismatchError, PoolError, ResetResult, StepResult

__all__ = [
    "BACKENDS",
    "EnvSpec",
    "GroupMismatchError",
    "GroupedEnvPool",
    "PoolError",
    "ResetResult",
    "StepResult",
]
