"""GiGPO (and GraphGPO, its grouping with graph returns): GRPO's episode term plus the step's
return normalised among the steps of its task group that act in the same state (level 0)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from hgpo_train.advantage.columns import (
    Mode,
    check_mode,
    float_column,
    id_codes,
    level0,
    real_setting,
)
from hgpo_train.advantage.config import AdvantageConfig
from hgpo_train.advantage.grouping import PairSorter, normalise, normalise_clusters, threads_for
from hgpo_train.advantage.grpo import episode_advantages
from hgpo_train.advantage.returns import credited_returns, episode_scores
from hgpo_train.advantage.rows import Rows, StepCredit


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
    step = _step_term(ret, groups, level0(fingerprints, n), mode)
    return _blend(step, episode_advantages(x, groups, mode) if w_episode else None, w, w_episode)


def _step_term(
    ret: np.ndarray, groups: np.ndarray, state: np.ndarray, mode: str, state_nodes: np.ndarray | None = None
) -> np.ndarray:
    """``A_step``; ``state_nodes``, dense codes of each row's (group, state) where the caller has
    them (GraphGPO's graph), are its clusters already and spare a sort."""
    if state_nodes is None:
        rows, values = normalise_clusters(ret, PairSorter(groups), state, mode, ddof=1)
        step = np.zeros(len(ret))
        step[rows] = values
        return step
    step = normalise(ret, state_nodes, mode, ddof=1)  # sums still add in row order: the same bits
    step[state == 0] = 0.0
    return step


def _blend(step: np.ndarray, episode: np.ndarray | None, w: float, w_episode: float) -> np.ndarray:
    if w_episode == 0:  # as the recipe, which then skips the episode term
        return w * step
    return w_episode * episode + w * step


def credit(rows: Rows, config: AdvantageConfig) -> StepCredit:
    """GiGPO's (or GraphGPO's) advantages, crediting each step with ``config.returns``."""

    def episode_term() -> np.ndarray | None:
        if config.episode_weight == 0:
            return None
        scores = episode_scores(rows.reward, rows.rollouts, rows.invalid, config.invalid_penalty)
        return episode_advantages(scores, rows.groups, config.mode)

    # the episode term needs no return: on a large batch it runs on a thread meanwhile
    with ThreadPoolExecutor(threads_for(len(rows), 2)) as pool:
        episode = pool.submit(episode_term)
        returns, state_nodes = credited_returns(rows, config)
        state = level0(rows.state_keys(config.estimator))
        step = _step_term(returns, rows.groups, state, config.mode, state_nodes)
        advantages = _blend(step, episode.result(), config.step_weight, config.episode_weight)
    return StepCredit(advantages, returns)
