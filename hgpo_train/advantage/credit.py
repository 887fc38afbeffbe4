"""The entry point every trainer and integration calls: raw columns in, :class:`StepCredit` out."""

from __future__ import annotations

from typing import Any

import numpy as np

from hgpo_train.advantage.config import AdvantageConfig
from hgpo_train.advantage.registry import CREDIT
from hgpo_train.advantage.rows import ProgressColumns, Rows, StepCredit


def step_credit(
    rewards: Any,
    traj_ids: Any,
    group_ids: Any,
    fingerprints: Any = None,
    invalid: Any = None,
    config: AdvantageConfig = AdvantageConfig(),
    next_states: Any = None,
    action_keys: Any = None,
    won: Any = None,
    progress: ProgressColumns | None = None,
    state: dict[str, Any] | None = None,
) -> StepCredit:
    """Step advantages of a batch from its raw columns, as every trainer computes them, with the
    values they were made from.

    A rollout is keyed by (group_id, traj_id), so traj ids may restart in every group.
    ``fingerprints`` may be None for GRPO only. ``next_states`` (graph returns only) is each
    step's next-state key: level 0 of the fingerprints the step returned, the terminal
    observation's for a rollout's last step. ``action_keys`` and ``won`` (CRBC only) are each
    step's ``info["action_key"]`` and ``info["won"]`` (G2PO reads ``won`` when given; MVPO needs it
    too, and ``progress``, each step's milestones). ``state``: what the estimator carried from the
    last iteration (:meth:`StepCredit.carried`; MVPO's), None for the first.
    """
    rows = Rows.from_columns(
        rewards, traj_ids, group_ids, fingerprints, invalid, next_states, action_keys, won, progress
    )
    return credit_rows(rows, config, state)


def credit_rows(rows: Rows, config: AdvantageConfig, state: dict[str, Any] | None = None) -> StepCredit:
    """:func:`step_credit` of rows already checked (:meth:`Rows.from_columns`)."""
    return CREDIT[config.estimator](rows, config, state)


def compute_advantages(*columns: Any, **options: Any) -> np.ndarray:
    """Step advantages of a batch from its raw columns: :func:`step_credit` (same arguments)
    without the values they were made from."""
    return step_credit(*columns, **options).advantages
