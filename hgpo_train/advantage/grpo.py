"""GRPO: the episode score normalised among the rows of its task group."""

from __future__ import annotations

from typing import Any

import numpy as np

from hgpo_train.advantage.columns import Mode, check_mode, float_column, id_codes
from hgpo_train.advantage.config import AdvantageConfig
from hgpo_train.advantage.grouping import EPS, normalise
from hgpo_train.advantage.returns import episode_scores
from hgpo_train.advantage.rows import Rows, StepCredit


def episode_advantages(scores: np.ndarray, groups: np.ndarray, mode: str) -> np.ndarray:
    """GRPO over dense group codes: the episode term every estimator with one shares."""
    a = normalise(scores, groups, mode, ddof=1)
    alone = np.bincount(groups) == 1
    if alone.any():  # released code: mean 0, std 1
        single = alone[groups]
        a[single] = scores[single] / (1.0 + EPS) if mode == "mean_std_norm" else scores[single]
    return a


def grpo_advantages(scores: Any, group_ids: Any, mode: Mode = "mean_std_norm") -> np.ndarray:
    """Episode score normalised among all rows of its task group (unbiased std).

    A group with a single row uses mean 0 and std 1, as in the released code.
    """
    check_mode(mode)
    x = float_column(scores, "scores")
    return episode_advantages(x, id_codes(group_ids, "group_ids", len(x)), mode)


def credit(rows: Rows, config: AdvantageConfig) -> StepCredit:
    """GRPO's advantages, crediting each row with its episode score."""
    scores = episode_scores(rows.reward, rows.rollouts, rows.invalid, config.invalid_penalty)
    return StepCredit(episode_advantages(scores, rows.groups, config.mode), scores)
