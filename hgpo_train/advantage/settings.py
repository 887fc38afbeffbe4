"""The estimators' names and the settings of their own that ``AdvantageConfig`` holds: the bottom
of the package's one import direction, settings <- config <- estimators <- registry."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from hgpo_train.advantage.columns import real_setting

ESTIMATORS: tuple[str, ...] = ("grpo", "gigpo", "hgpo", "graphgpo", "g2po", "crbc", "mvpo")
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


MILESTONES = ("target", "operation", "place", "success", "invalid")
"""The trigger columns in order (ALFWorld's names; WebShop's are search, item, option, success,
invalid): the order of the paper's tables and of :data:`INITIAL_WEIGHTS` (spec A18)."""
INVALID = MILESTONES.index("invalid")
INITIAL_WEIGHTS = (0.2, 0.3, 0.5, 10.0, 0.0)
"""w_0, the paper's initial milestone weights (both envs)."""


@dataclass(frozen=True)
class MVPOSettings:
    """MVPO's hyper-parameters (spec section 4); defaults are the paper's for ALFWorld, and the
    spec's choices where the paper gives none."""

    omega: float = 0.5
    """ω, the weight of the routed step credit (search-QA: 1.0)."""
    kappa_min: float = 0.05
    """κ_min, the floor of κ (WebShop: 0.01)."""
    success_rate: float = 0.05
    """α_κ, the EMA rate of the batch success rate."""
    weight_rate: float = 0.05
    """β_amp, the EMA rate of the milestone weights (choice A3)."""
    success_weight: float = 0.2
    """α_s, the weight of a region's success rate in its potential (choice A2)."""
    loop_weight: float = 0.2
    """α_l, the weight of a region's loop rate (choice A2)."""
    count_smoothing: float = 1.0
    """λ_cnt: a region seen once keeps ``1 / (1 + λ)`` of its potential (choice A4)."""
    zero_spread: float = 1e-6
    """ε_r: an anchor group whose returns spread no more than this takes the potential (A5)."""
    initial_weights: tuple[float, ...] = INITIAL_WEIGHTS
    """w_0, one per milestone in :data:`MILESTONES` order."""
    potential: Literal["eq15", "appendix"] = "eq15"
    """eq15: the section's potential (default); appendix: A.3's return-to-go form (choice A1)."""
    appendix_mix: float = 0.2
    """δ of the appendix potential."""
    potential_norm: Literal["rms", "zscore"] = "rms"
    """How a task group's potential differences are scaled: by their RMS, keeping their signs
    (default, choice A9), or z-scored."""
    latch: bool = True
    """Milestones 1-4 stay reached once reached (choice A12); False reads each observation alone."""

    def __post_init__(self) -> None:
        for name in ("omega", "success_weight", "loop_weight", "appendix_mix"):
            real_setting(getattr(self, name), f"mvpo.{name}")
        for name in ("kappa_min", "success_rate", "weight_rate"):
            real_setting(getattr(self, name), f"mvpo.{name}", 0.0, 1.0)
        real_setting(self.count_smoothing, "mvpo.count_smoothing", 0.0)
        real_setting(self.zero_spread, "mvpo.zero_spread", 0.0)
        if len(self.initial_weights) != len(MILESTONES) or min(self.initial_weights) < 0:
            raise ValueError(
                f"mvpo.initial_weights must be {len(MILESTONES)} non-negative numbers, one per {MILESTONES}"
            )
        if self.potential not in ("eq15", "appendix"):
            raise ValueError(f"mvpo.potential must be 'eq15' or 'appendix', got {self.potential!r}")
        if self.potential_norm not in ("rms", "zscore"):
            raise ValueError(f"mvpo.potential_norm must be 'rms' or 'zscore', got {self.potential_norm!r}")
