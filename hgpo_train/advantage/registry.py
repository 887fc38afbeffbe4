"""Every estimator by its config name (``advantage.estimator``). Adding one is a module with a
``credit(rows, config) -> StepCredit`` function and one entry here (its settings, if any, go in
:class:`~hgpo_train.advantage.config.AdvantageConfig`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from hgpo_train.advantage import crbc, g2po, gigpo, grpo, hgpo
from hgpo_train.advantage.rows import Rows, StepCredit

if TYPE_CHECKING:
    from hgpo_train.advantage.config import AdvantageConfig

CREDIT: dict[str, Callable[[Rows, AdvantageConfig], StepCredit]] = {
    "grpo": grpo.credit,
    "gigpo": gigpo.credit,
    "hgpo": hgpo.credit,
    "graphgpo": gigpo.credit,  # GiGPO's grouping; its config default is the graph return
    "g2po": g2po.credit,
    "crbc": crbc.credit,
}
ESTIMATORS: tuple[str, ...] = tuple(CREDIT)
