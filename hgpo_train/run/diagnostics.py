"""How well a batch's steps group into HGPO clusters, as flat metrics for logging.

Advantage quality depends on the grouping: singleton clusters give no signal, and a level-0
cluster that pools steps seen under different prompts (different memory windows) compares
samples that were not in the same situation. These metrics make both visible per level.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from hgpo_env.tools.transitions import aliased_visits, history_keys, merging
from hgpo_train.advantage import (
    AdvantageConfig,
    Mode,
    MVPOCredit,
    StepCredit,
    as_fingerprints,
    hgpo_level_items,
    level_clusters,
    pair_codes,
)
from hgpo_train.advantage.columns import id_codes
from hgpo_train.advantage.mvpo import BRANCHES

if TYPE_CHECKING:
    from hgpo_train.rollout.batch import StepBatch

SIZE_BINS: tuple[str, ...] = ("1", "2", "3-4", "5-8", "9-16", "17+")
"""Cluster-size histogram bins (powers of two)."""
_QUANTILES = (50, 90)


def _context_codes(fp: np.ndarray) -> np.ndarray:
    """Dense code of each row's whole fingerprint tuple (its prompt context), 0s included."""
    codes = np.zeros(len(fp), dtype=np.int64)
    for column in fp.T:
        codes = pair_codes(codes, column)
    return codes


def _mixed_rows(codes: np.ndarray, context: np.ndarray) -> np.ndarray:
    """Rows whose cluster (``codes``, -1 = none) holds at least two different contexts."""
    present = codes >= 0
    n_contexts = int(context.max(initial=0)) + 1
    # distinct (cluster, context) pairs; a sort, as np.unique's hash table is slower here
    pairs = np.sort(codes[present] * n_contexts + context[present])
    distinct = pairs[np.diff(pairs, prepend=-1) != 0]
    contexts_per_cluster = np.bincount(distinct // n_contexts)
    mixed = np.zeros(len(codes), dtype=bool)
    mixed[present] = contexts_per_cluster[codes[present]] >= 2
    return mixed


def grouping_diagnostics(
    group_ids: Any, fingerprints: Any, returns: Any = None, mode: Mode = "mean_std_norm"
) -> dict[str, float]:
    """Per-level grouping metrics, named ``grouping/level{k}/<metric>``, plus batch totals.

    Shares are over all rows of the batch. Per level k:
      - ``missing_share``, ``singleton_share``, ``grouped_share``: rows without a level-k
        fingerprint, alone in their cluster, in a cluster of >= 2 rows (they sum to 1);
      - ``size_hist/<bin>``: share of rows in clusters whose size falls in the bin (``SIZE_BINS``);
      - ``clusters``, ``cluster_size_mean``, ``cluster_size_p50``, ``cluster_size_p90``,
        ``cluster_size_max``: over clusters, not rows;
      - ``context_mixed_share``: rows whose level-k cluster holds two or more different contexts;
      - ``nonzero_share`` (only with ``returns``): rows that get a kept, non-zero HGPO item at
        level k under ``mode``.
    ``grouping/context_inconsistency`` is ``level0/context_mixed_share``. The *context* of a row
    is its whole fingerprint tuple (level 0..K) with a missing level read as 0: two rows have
    the same context exactly when their prompts show the same memory window. A row whose level K
    is missing (fewer than K past steps shown) therefore never shares a context with a row that
    has level K; rows without a level-0 fingerprint are in no cluster and count as consistent.
    With ``returns``, ``grouping/any_nonzero_share`` is the share of rows with any kept item.
    """
    fp = as_fingerprints(fingerprints)
    clusters = level_clusters(group_ids, fp)
    n, levels = clusters.shape
    metrics: dict[str, float] = {"grouping/rows": float(n), "grouping/levels": float(levels)}
    if n == 0:
        return metrics
    kept = hgpo_level_items(returns, clusters, mode)[1] if returns is not None else None
    context = _context_codes(fp)
    for k in range(levels):
        prefix = f"grouping/level{k}/"
        codes = clusters[:, k]
        present = codes >= 0
        sizes = np.bincount(codes[present])
        row_size = sizes[codes[present]]
        metrics[prefix + "missing_share"] = 1.0 - present.mean()
        metrics[prefix + "singleton_share"] = np.count_nonzero(row_size == 1) / n
        metrics[prefix + "grouped_share"] = np.count_nonzero(row_size >= 2) / n
        bins = np.minimum(np.ceil(np.log2(row_size)).astype(np.int64), len(SIZE_BINS) - 1)
        for label, rows in zip(SIZE_BINS, np.bincount(bins, minlength=len(SIZE_BINS))):
            metrics[f"{prefix}size_hist/{label}"] = rows / n
        metrics[prefix + "clusters"] = float(len(sizes))
        metrics[prefix + "cluster_size_mean"] = float(sizes.mean()) if len(sizes) else 0.0
        for q in _QUANTILES:
            metrics[f"{prefix}cluster_size_p{q}"] = float(np.percentile(sizes, q)) if len(sizes) else 0.0
        metrics[prefix + "cluster_size_max"] = float(sizes.max(initial=0))
        metrics[prefix + "context_mixed_share"] = _mixed_rows(codes, context).mean()
        if kept is not None:
            metrics[prefix + "nonzero_share"] = kept[:, k].mean()
    metrics["grouping/context_inconsistency"] = metrics["grouping/level0/context_mixed_share"]
    if kept is not None:
        metrics["grouping/any_nonzero_share"] = kept.any(axis=1).mean()
    return {name: float(value) for name, value in metrics.items()}


STATE_KEYED: tuple[str, ...] = ("gigpo", "graphgpo", "g2po", "crbc", "mvpo")
"""Estimators that take two steps with one state key (level 0) for one state."""
ALIASING_WARNING = 0.05
"""Level-0 aliasing above this share of a batch's visits warns (once) under a state-keyed estimator."""
NONZERO = 1e-9
"""A step credit above this in size counts as non-zero."""
_warned: set[str] = set()


def key_metrics(batch: StepBatch) -> dict[str, float]:
    """Whether the batch's keys see the state (:mod:`hgpo_env.tools.transitions`): per level k, the share of
    visits whose key and action led elsewhere under another history (``keys/level{k}/aliased_share``,
    over the visits that show level k), and at level 0 how the rollouts meet
    (``keys/merging/eligible_share``: visits at a key where two or more actions were taken; of
    those, ``all_rollouts_share/k0`` and ``/closure``: the share whose key every rollout of the
    group visited, or reaches through the transitions)."""
    rollouts = batch.rows.rollouts
    states = batch.fingerprints[:, 0]
    histories = history_keys(rollouts, states, batch.action_key)
    out = {}
    for k, keys in enumerate(batch.fingerprints.T):
        aliased = aliased_visits(batch.group_id, keys, batch.action_key, histories, batch.next_state)
        out[f"keys/level{k}/aliased_share"] = _share(aliased, keys != 0)
    met = merging(batch.group_id, rollouts, states, batch.action_key)
    out["keys/merging/eligible_share"] = _share(met.eligible)
    out["keys/merging/all_rollouts_share/k0"] = _share(met.visited == 1, met.eligible)
    out["keys/merging/all_rollouts_share/closure"] = _share(met.reached == 1, met.eligible)
    return out


def _share(mask: np.ndarray, among: np.ndarray | None = None) -> float:
    """The share of ``among``'s rows (all rows when None) where ``mask`` is set; 0 of none."""
    among = np.ones_like(mask) if among is None else among
    return float((mask & among).sum() / among.sum()) if among.any() else 0.0


def zero_credit_metrics(group_ids: Any, won: np.ndarray, advantages: np.ndarray) -> dict[str, float]:
    """How much of a batch gets no credit at all: the share of steps whose advantage is exactly 0,
    and the shares of task groups whose rollouts all ended alike (all won or none) and all failed,
    where every estimator that compares returns has nothing to compare (``won``: per row, its
    rollout's success)."""
    groups = id_codes(group_ids, "group_ids", len(advantages))
    rows = np.bincount(groups)
    wins = np.bincount(groups, weights=won.astype(np.float64))
    return {
        "advantage/exact_zero_share": _share(advantages == 0),
        "rollout/identical_outcome_groups": _share((wins == 0) | (wins == rows)),
        "rollout/all_fail_groups": _share(wins == 0),
    }


def mvpo_metrics(credit: MVPOCredit) -> dict[str, float]:
    """Where MVPO's routed credit came from (the share of steps per branch: anchor groups with
    spread, all-equal anchors given the potential, singletons), this iteration's κ and the
    milestone weights it carries on (``mvpo/weight/m1`` ... in the env's milestone order)."""
    assert credit.branch is not None
    out = {f"mvpo/{name}_share": _share(credit.branch == code) for code, name in enumerate(BRANCHES)}
    out["mvpo/kappa"] = float(credit.kappa)
    out.update({f"mvpo/weight/m{m + 1}": float(w) for m, w in enumerate(credit.state.weights)})
    return out


def credit_metrics(batch: StepBatch, credit: StepCredit, config: AdvantageConfig) -> dict[str, float]:
    """What both trainers log of an update's step credit: the advantages' spread, the grouping
    of the values the estimator credited (:func:`grouping_diagnostics`), whether the keys see the
    state (:func:`key_metrics`) and, for CRBC, the share of steps with step credit. Under a
    state-keyed estimator, a batch whose state key aliases is said once, in one line, on stderr."""
    advantages = credit.advantages
    if not len(advantages):
        return {}
    keys = key_metrics(batch)
    out = {
        "advantage/mean": float(advantages.mean()),
        "advantage/std": float(advantages.std()),
        "advantage/zero_frac": float((np.abs(advantages) <= 1e-6).mean()),
        **zero_credit_metrics(batch.group_id, batch.outcome == "won", advantages),
        **grouping_diagnostics(batch.group_id, batch.fingerprints, credit.returns, config.mode),
        **keys,
    }
    if config.estimator == "crbc":
        out["crbc/nonzero_step_credit_share"] = _share(np.abs(credit.returns - credit.state_values) > NONZERO)
    if isinstance(credit, MVPOCredit):
        out.update(mvpo_metrics(credit))
    aliased = keys["keys/level0/aliased_share"]
    if config.estimator in STATE_KEYED and aliased > ALIASING_WARNING and config.estimator not in _warned:
        _warned.add(config.estimator)
        print(
            f"warning: {config.estimator} takes one state key for one state, but in this batch "
            f"{aliased:.0%} of visits went elsewhere from the same key and action after another history: "
            "the key hides state (python -m hgpo_env audit measures it; HGPO with K >= 2 keys on the "
            "history too)",
            file=sys.stderr,
            flush=True,
        )
    return out


def plot_grouping(metrics_or_arrays: Mapping[str, float] | Sequence[Any], path: str | Path) -> Path:
    """Save a two-panel figure of the grouping per level: where rows fall (missing, cluster-size
    bins) and the context-mixing and non-zero shares.

    Takes the dict of :func:`grouping_diagnostics` or its arguments as a tuple
    ``(group_ids, fingerprints[, returns])``. matplotlib is imported here, with the Agg canvas
    and no pyplot, so nothing global changes and no display is needed.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    metrics = (
        metrics_or_arrays
        if isinstance(metrics_or_arrays, Mapping)
        else grouping_diagnostics(*metrics_or_arrays)
    )
    levels = range(int(metrics["grouping/levels"]))

    def share(k: int, name: str) -> float:
        return metrics.get(f"grouping/level{k}/{name}", float("nan"))

    fig = Figure(figsize=(10, 4), layout="constrained")
    FigureCanvasAgg(fig)
    rows_ax, mix_ax = fig.subplots(1, 2)
    bottom = np.zeros(len(levels))
    for name, label in [("missing_share", "missing")] + [(f"size_hist/{b}", f"size {b}") for b in SIZE_BINS]:
        heights = np.array([share(k, name) for k in levels])
        rows_ax.bar(list(levels), heights, bottom=bottom, label=label)
        bottom += heights
    rows_ax.set(title="rows by cluster size", xlabel="level k", ylabel="share of rows", xticks=list(levels))
    rows_ax.legend(fontsize="small")
    for name in ("context_mixed_share", "nonzero_share"):
        mix_ax.plot(list(levels), [share(k, name) for k in levels], marker="o", label=name)
    mix_ax.set(
        title="context mixing and signal",
        xlabel="level k",
        ylabel="share of rows",
        xticks=list(levels),
        ylim=(0, 1),
    )
    mix_ax.legend(fontsize="small")
    path = Path(path)
    fig.savefig(path)
    return path
