"""Ray's ``worker_process_setup_hook`` of a run: what every actor process applies before its first task.

The driver puts this in the run's runtime env; what applies depends on the env vars it sets
there: the CPU stand-ins of a ``device: cpu`` run (:mod:`~hgpo_train.openrlhf.cpu`) and the
constrained log-probs of a ``generation.constrained`` run (:mod:`~hgpo_train.openrlhf.constraints`).
A GPU run without constraints applies nothing.
"""

from __future__ import annotations

import os

HOOK = "hgpo_train.openrlhf.worker_setup.setup"
DEVICE_VAR = "HGPO_OPENRLHF_DEVICE"
FP32_VAR = "HGPO_OPENRLHF_FP32"
"""Set in a CPU run's processes when ``openrlhf.param_dtype`` is fp32: OpenRLHF's parser takes bf16
or fp16 only, so the run is launched as bf16 and the CPU stand-ins make its models and engines fp32."""


def setup() -> None:
    if os.environ.get(DEVICE_VAR) == "cpu":
        from hgpo_train.openrlhf import cpu

        cpu.install()
    from hgpo_train.openrlhf import constraints

    constraints.install()
