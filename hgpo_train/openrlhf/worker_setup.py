"""Ray's ``worker_process_setup_hook`` of a run: what every actor process applies before its first task.

The driver puts this in the run's runtime env; what applies depends on the env vars it sets
there: the CPU stand-ins of a ``device: cpu`` run (:mod:`~hgpo_train.openrlhf.cpu`) and the
constrained log-probs of a ``generation.constrained`` run (:mod:`~hgpo_train.openrlhf.constraints`).
A GPU run without constraints applies nothing.
"""

from __future__ import annotations

import os

from hgpo_train.openrlhf.process_env import DEVICE_VAR

HOOK = "hgpo_train.openrlhf.worker_setup.setup"


def setup() -> None:
    if os.environ.get(DEVICE_VAR) == "cpu":
        from hgpo_train.openrlhf import cpu

        cpu.install()
    from hgpo_train.openrlhf import constraints

    constraints.install()
