"""Even batches for DeepSpeed: the number of step samples must divide over the ranks exactly.

An iteration yields as many samples as its episodes took steps, a different number every time.
OpenRLHF hands ``rollout.micro_batch_size``-sample chunks to the data-parallel ranks round-robin
(``RayActorGroup.async_run_method_batch``) and every rank then runs ``train.batch_size / dp``
samples per optimizer step. If one rank got fewer samples it would run fewer collective calls
than the others and the job would hang, and a partial gradient-accumulation window would leak
gradients into the next iteration. So the batch is padded up to a multiple of both, with copies
of real samples whose action mask is all zero: they cost a forward/backward pass and contribute
exactly nothing to the loss or its token-mean normaliser.
"""

from __future__ import annotations

import math

import numpy as np


def pad_multiple(dp_size: int, rollout_micro_batch_size: int, train_batch_size: int) -> int:
    """The smallest sample count unit that splits evenly for experience making and for training."""
    for name, value in {
        "dp_size": dp_size,
        "rollout_micro_batch_size": rollout_micro_batch_size,
        "train_batch_size": train_batch_size,
    }.items():
        if value < 1:
            raise ValueError(f"{name} must be at least 1, got {value}")
    return math.lcm(dp_size * rollout_micro_batch_size, train_batch_size)


def padded_size(n: int, multiple: int) -> int:
    """``n`` rounded up to a multiple of ``multiple`` (at least one multiple)."""
    return max(1, math.ceil(n / multiple)) * multiple


def padding_sources(lengths: np.ndarray, count: int) -> np.ndarray:
    """Rows to copy as ``count`` padding samples: the shortest ones, so padding costs least."""
    if count and not len(lengths):
        raise ValueError("cannot pad an empty batch")
    shortest = np.argsort(lengths, kind="stable")
    return shortest[np.arange(count) % len(shortest)]
