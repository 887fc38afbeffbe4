"""``AdvantageConfig``: which estimator and its settings, checked when made."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from hgpo_train.advantage.columns import Mode, check_mode, real_setting
from hgpo_train.advantage.settings import ESTIMATORS, SUCCESS_REWARD, CRBCSettings, MVPOSettings

Estimator = Literal[ESTIMATORS]  # type: ignore[valid-type]  # the estimators' names
StepReturn = Literal["discounted", "graph"]
STEP_RETURNS: tuple[str, ...] = ("discounted", "graph")
_CREDITS = {
    "grpo": "the episode score",
    "g2po": "the value of the state a step leads to",
    "crbc": "Q(s, a) of its group's empirical process",
    "mvpo": "GiGPO's return, or a milestone potential where its anchor's returns are equal",
}
"""What the estimators without a choice of step return credit a step with."""


@dataclass(frozen=True)
class AdvantageConfig:
    """Which estimator and its settings; defaults are the paper's (ALFWorld).

    An estimator is a pair of choices: the return a step is credited with and how steps are
    grouped. ``grpo`` normalises the episode score in the task group; ``gigpo`` the discounted
    return among steps of the task in the same state (plus GRPO's episode term); ``hgpo`` the
    discounted return at K+1 context levels; ``graphgpo`` is GiGPO's grouping with the graph
    return (:func:`graph_returns`). ``step_return`` swaps the return of the three stepwise ones,
    e.g. ``hgpo`` with ``graph``: graph returns under HGPO's context hierarchy. ``g2po`` credits
    the value of the state a step leads to (:func:`g2po_advantages`); ``crbc`` the closure of
    the group's own transitions (:mod:`hgpo_train.advantage.crbc`); ``mvpo`` GiGPO's credit,
    and where an anchor's returns are all equal a potential of the milestones the env reports
    (:mod:`hgpo_train.advantage.mvpo`).
    """

    estimator: Estimator = "hgpo"
    """grpo (episode level), gigpo (episode + level-0 step groups), hgpo (K+1 context levels),
    graphgpo (gigpo's groups, distance-to-success returns in the task's state graph), g2po (the
    value of the state a step leads to, within its state and its task), crbc (Q - V of the
    group's empirical process, at anchors with two or more actions) or mvpo (gigpo, with a
    milestone potential for anchors whose returns are equal)."""
    gamma: float = 0.95
    """Discount (HGPO and GiGPO: 0.95); for graph returns the base of ``gamma ** distance``
    (GraphGPO's scripts: 0.1 on ALFWorld, 0.2 on WebShop)."""
    invalid_penalty: float = 0.1
    """Subtracted from the return of a step whose response was invalid."""
    mode: Mode = "mean_std_norm"
    """mean_norm or mean_std_norm inside groups (paper: ALFWorld mean_std_norm, WebShop mean_norm)."""
    alpha: float = 1.0
    """HGPO level weights grow as L**alpha (0: uniform)."""
    base_group: bool = False
    """HGPO: add the episode-level (GRPO) item to every row."""
    weight_offset: float = 2.0
    """HGPO: level k has length L = k + weight_offset (released code: 2)."""
    step_weight: float = 1.0
    """GiGPO, GraphGPO and G2PO: weight of the step-level advantage (CRBC's is ``crbc.step_weight``)."""
    episode_weight: float = 1.0
    """Weight of the episode (GRPO) term of ``gigpo``, ``graphgpo`` and ``crbc`` (its w_G); 0 drops it."""
    step_return: StepReturn | None = None
    """``discounted`` or ``graph``; None: the estimator's own (``graph`` for graphgpo)."""
    normalize_distance: bool = False
    """Graph returns: ``gamma ** (d(next) - d(state) + 1)`` instead of ``gamma ** d(next)``."""
    success_reward: float = SUCCESS_REWARD
    """G2PO: the episode reward that counts as success (its code's constant, the win reward of
    verl-agent's ALFWorld and WebShop and of every env here)."""
    crbc: CRBCSettings = field(default_factory=CRBCSettings)
    """CRBC: discount, depth, step weight and spread floor (appendix C.3's defaults)."""
    mvpo: MVPOSettings = field(default_factory=MVPOSettings)
    """MVPO: the routed credit's weight ω, κ's floor, the EMA rates and the potential's options
    (the paper's ALFWorld values, and MVPO_SPEC's choices)."""

    def __post_init__(self) -> None:
        if self.estimator not in ESTIMATORS:
            raise ValueError(f"unknown estimator {self.estimator!r}; expected one of {ESTIMATORS}")
        check_mode(self.mode)
        real_setting(self.gamma, "gamma", 0.0, 1.0)
        real_setting(self.invalid_penalty, "invalid_penalty", 0.0)
        real_setting(self.alpha, "alpha")
        real_setting(self.step_weight, "step_weight")
        real_setting(self.episode_weight, "episode_weight")
        if real_setting(self.weight_offset, "weight_offset") <= 0:
            raise ValueError(f"weight_offset must be > 0, got {self.weight_offset!r}")
        if self.step_return is not None and self.step_return not in STEP_RETURNS:
            raise ValueError(f"unknown step_return {self.step_return!r}; expected one of {STEP_RETURNS}")
        real_setting(self.success_reward, "success_reward")
        if self.step_return is not None and self.estimator in _CREDITS:
            raise ValueError(
                f"{self.estimator} credits {_CREDITS[self.estimator]}; step_return applies to gigpo, "
                "hgpo and graphgpo"
            )
        for name, symbol, setting in (("crbc", "w_S", "crbc.step_weight"), ("mvpo", "ω", "mvpo.omega")):
            if self.estimator == name and self.step_weight != 1.0:
                raise ValueError(
                    f"{name}'s step weight ({symbol}) is {setting}; step_weight is not read by {name}"
                )

    @property
    def returns(self) -> StepReturn:
        """The step return this estimator credits (stepwise estimators only)."""
        return self.step_return or ("graph" if self.estimator == "graphgpo" else "discounted")
