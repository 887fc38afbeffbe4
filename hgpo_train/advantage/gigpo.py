"""GiGPO (and GraphGPO, its grouping with graph returns): GRPO's episode term plus the step's
return normalised among the steps of its task group that act in the same state (level 0)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from hgpo_train.advantage.columns import (
    Mode,
    check_mode,
    float_column,
    id_codes,
    level0,
    real_setting,
)
from hgpo_train.advantage.grouping import PairSorter, normalise_clusters
from hgpo_train.advantage.grpo import episode_advantages
from hgpo_train.advantage.returns import credited_returns, episode_scores
from hgpo_train.advantage.rows import Rows, StepCredit

if TYPE_CHECKING:
    from hgpo_train.advantage.config import AdvantageConfig


def gigpo_advantages(
    returns: Any,
    scores: Any,
    group_ids: Any,
    fingerprints: Any,
    mode: Mode = "mean_std_norm",
    step_weight: float = 1.0,
    episode_weight: float = 1.0,
) -> np.ndarray:
    """GiGPO: ``episode_weight * A_episode + step_weight * A_step`` (GiGPO's episode weight is 1;
    GraphGPO's is a setting, and its returns are :func:`graph_returns`).

    ``A_step`` normalises the return among the rows of the task group that share the level-0
    fingerprint (unbiased std); a singleton cluster or a missing level 0 gives 0. Only level 0 of
    ``fingerprints`` is used.
    """
    check_mode(mode)
    w = real_setting(step_weight, "step_weight")
    w_episode = real_setting(episode_weight, "episode_weight")
    ret = float_column(returns, "returns")
    n = len(ret)
    x = float_column(scores, "scores", n)
    groups = id_codes(group_ids, "group_ids", n)
    state = level0(fingerprints, n)
    rows, values = normalise_clusters(ret, PairSorter(groups), state, mode, ddof=1)
    step = np.zeros(n)
    step[rows] = values
    if w_episode == 0:  # as the recipe, which then skips the episode term
        return w * step
    return w_episode * episode_advantages(x, groups, mode) + w * step


def credit(rows: Rows, config: AdvantageConfig) -> StepCredit:
    """GiGPO's (or GraphGPO's) advantages, crediting each step with ``config.returns``."""
    returns = credited_returns(rows, config)
    scores = episode_scores(rows.reward, rows.rollouts, rows.invalid, config.invalid_penalty)
    advantages = gigpo_advantages(
        returns,
        scores,
        rows.groups,
        rows.fingerprints,
        config.mode,
        config.step_weight,
        config.episode_weight,
    )
    return StepCredit(advantages, returns)
