"""The estimators' names and the settings of their own that ``AdvantageConfig`` holds: the bottom
of the package's one import direction, settings <- config <- estimators <- registry."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from hgpo_train.advantage.columns import real_setting

ESTIMATORS: tuple[str, ...] = ("grpo", "gigpo", "hgpo", "graphgpo", "g2po", "crbc")
"""Every estimator by its config name (``advantage.estimator``); the registry maps each to its
credit function."""
SUCCESS_REWARD = 10.0
"""The episode reward G2PO's code counts as success, and the value of its success terminal."""

CLOSURE = "inf"
"""The depth that solves the closure (the paper's K = infinity)."""


@dataclass(frozen=True)
class CRBCSettings:
    """CRBC's own settings; defaults are appendix C.3's. Its trajectory term's weight (w_G) is
    ``advantage.episode_weight`` and uses ``advantage.mode`` and ``advantage.invalid_penalty``."""

    beta: float = 0.98
    """Discount, in (0, 1): at 1 the closure can be singular (the paper's ablation: 0.95 and
    0.99 train about as well, 1.0 worse)."""
    depth: int | Literal["inf"] = CLOSURE
    """K: ``inf`` solves the closure; K >= 0 applies the Bellman operator K times to the
    visit-averaged discounted success (K = 0: visit-local averaging, like GiGPO)."""
    step_weight: float = 5.0
    """w_S, the weight of the step credit."""
    sigma_min: float = 0.1
    """Floor of the anchor's spread that divides its advantages."""

    def __post_init__(self) -> None:
        beta = real_setting(self.beta, "crbc.beta", 0.0, 1.0)
        if beta in (0.0, 1.0):
            raise ValueError(f"crbc.beta must be strictly between 0 and 1, got {self.beta!r}")
        if self.depth != CLOSURE and not (type(self.depth) is int and self.depth >= 0):
            raise ValueError(f"crbc.depth must be an integer >= 0 or 'inf', got {self.depth!r}")
        real_setting(self.step_weight, "crbc.step_weight")
        if real_setting(self.sigma_min, "crbc.sigma_min") <= 0:
            raise ValueError(f"crbc.sigma_min must be > 0, got {self.sigma_min!r}")
