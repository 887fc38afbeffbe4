"""GRPO, GiGPO, HGPO, GraphGPO, G2PO, CRBC and MVPO step advantages over columnar arrays
(shared/HGPO_SPEC.md, shared/CRBC_SPEC.md, shared/MVPO_SPEC.md).

One row is one step sample. Inputs are numpy arrays (torch tensors and lists are converted),
outputs are float64 numpy arrays in row order. Ids (group, rollout) may be ints or strings.
Rows of one rollout must be in chronological order; rollouts need not be contiguous.

Everything is vectorised: ids become dense codes once, clusters are contiguous runs after one
sort, statistics are ``np.bincount`` reductions, and the only Python loops run over context
levels, step positions or graph distances, never over rows or clusters.

:func:`step_credit` is the entry point; :mod:`~hgpo_train.advantage.registry` names the
estimators, one module each (``grpo``, ``gigpo``, ``hgpo``, ``g2po``, ``crbc``, ``mvpo``); the shared
pieces are ``columns`` (input checks), ``grouping`` (clusters) and ``returns``.

Stage 2 of an iteration (credit), and the bottom of hgpo_train: it imports nothing else of it, so
any trainer can take it alone.
"""

from hgpo_train.advantage.columns import MODES, Mode, as_fingerprints
from hgpo_train.advantage.config import STEP_RETURNS, AdvantageConfig, Estimator, StepReturn
from hgpo_train.advantage.crbc import crbc_advantages
from hgpo_train.advantage.credit import compute_advantages, credit_rows, step_credit
from hgpo_train.advantage.g2po import g2po_advantages
from hgpo_train.advantage.gigpo import gigpo_advantages
from hgpo_train.advantage.grouping import level_clusters, pair_codes
from hgpo_train.advantage.grpo import grpo_advantages
from hgpo_train.advantage.hgpo import hgpo_advantages, hgpo_level_items
from hgpo_train.advantage.mvpo import MVPOCredit, MVPOState, mvpo_advantages
from hgpo_train.advantage.returns import (
    GRAPH_RETURN_SCALE,
    episode_scores,
    graph_distances,
    graph_returns,
    step_returns,
)
from hgpo_train.advantage.rows import ProgressColumns, Rows, StepCredit
from hgpo_train.advantage.settings import ESTIMATORS, CRBCSettings, MVPOSettings

__all__ = [
    "ESTIMATORS",
    "GRAPH_RETURN_SCALE",
    "MODES",
    "STEP_RETURNS",
    "AdvantageConfig",
    "CRBCSettings",
    "Estimator",
    "MVPOCredit",
    "MVPOSettings",
    "MVPOState",
    "Mode",
    "ProgressColumns",
    "Rows",
    "StepCredit",
    "StepReturn",
    "as_fingerprints",
    "compute_advantages",
    "crbc_advantages",
    "credit_rows",
    "episode_scores",
    "g2po_advantages",
    "gigpo_advantages",
    "graph_distances",
    "graph_returns",
    "grpo_advantages",
    "hgpo_advantages",
    "hgpo_level_items",
    "level_clusters",
    "mvpo_advantages",
    "pair_codes",
    "step_credit",
    "step_returns",
]
