"""The variables the driver sets in the environment of every process of its run (its runtime env),
which the actors' setup (:mod:`~hgpo_train.openrlhf.worker_setup`), the CPU stand-ins
(:mod:`~hgpo_train.openrlhf.cpu`) and the engines (:mod:`~hgpo_train.openrlhf.engines`) read: a
leaf, so none of those imports another to learn a name."""

DEVICE_VAR = "HGPO_OPENRLHF_DEVICE"
"""``cpu`` in a ``device: cpu`` run: every actor applies the CPU stand-ins."""
FP32_VAR = "HGPO_OPENRLHF_FP32"
"""Set in a CPU run's processes when ``openrlhf.param_dtype`` is fp32: OpenRLHF's parser takes bf16
or fp16 only, so the run is launched as bf16 and the CPU stand-ins make its models and engines fp32."""
