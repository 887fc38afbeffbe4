"""Every estimator by its config name (``advantage.estimator``). Adding one is a module with a
``credit(rows, config) -> StepCredit`` function (``credit(rows, config, state)`` for one that
carries state across iterations), its name in ``settings.ESTIMATORS`` and one entry here (its
settings, if any, in :mod:`~hgpo_train.advantage.settings`, held by
:class:`~hgpo_train.advantage.config.AdvantageConfig`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hgpo_train.advantage import crbc, g2po, gigpo, grpo, hgpo, mvpo
from hgpo_train.advantage.config import AdvantageConfig
from hgpo_train.advantage.rows import Rows, StepCredit
from hgpo_train.advantage.settings import ESTIMATORS

State = dict[str, Any] | None
Credit = Callable[[Rows, AdvantageConfig, State], StepCredit]


def stateless(credit: Callable[[Rows, AdvantageConfig], StepCredit]) -> Credit:
    """An estimator that carries nothing across iterations, called as every estimator is."""

    def call(rows: Rows, config: AdvantageConfig, state: State) -> StepCredit:
        return credit(rows, config)

    return call


CREDIT: dict[str, Credit] = {
    "grpo": stateless(grpo.credit),
    "gigpo": stateless(gigpo.credit),
    "hgpo": stateless(hgpo.credit),
    "graphgpo": stateless(gigpo.credit),  # GiGPO's grouping; its config default is the graph return
    "g2po": stateless(g2po.credit),
    "crbc": stateless(crbc.credit),
    "mvpo": mvpo.credit,
}
if tuple(CREDIT) != ESTIMATORS:  # one list of names: a new estimator goes in both, in one order
    raise ImportError(
        f"the registry's estimators {tuple(CREDIT)} differ from settings.ESTIMATORS {ESTIMATORS}"
    )
