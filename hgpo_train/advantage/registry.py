"""Every estimator by its config name (``advantage.estimator``). Adding one is a module with a
``credit(rows, config) -> StepCredit`` function, its name in ``settings.ESTIMATORS`` and one entry
here (its settings, if any, in :mod:`~hgpo_train.advantage.settings`, held by
:class:`~hgpo_train.advantage.config.AdvantageConfig`)."""

from __future__ import annotations

from collections.abc import Callable

from hgpo_train.advantage import crbc, g2po, gigpo, grpo, hgpo
from hgpo_train.advantage.config import AdvantageConfig
from hgpo_train.advantage.rows import Rows, StepCredit
from hgpo_train.advantage.settings import ESTIMATORS

CREDIT: dict[str, Callable[[Rows, AdvantageConfig], StepCredit]] = {
    "grpo": grpo.credit,
    "gigpo": gigpo.credit,
    "hgpo": hgpo.credit,
    "graphgpo": gigpo.credit,  # GiGPO's grouping; its config default is the graph return
    "g2po": g2po.credit,
    "crbc": crbc.credit,
}
if tuple(CREDIT) != ESTIMATORS:  # one list of names: a new estimator goes in both, in one order
    raise ImportError(
        f"the registry's estimators {tuple(CREDIT)} differ from settings.ESTIMATORS {ESTIMATORS}"
    )
