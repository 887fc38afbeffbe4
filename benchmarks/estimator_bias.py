"""How close GRPO, GiGPO, HGPO, GraphGPO, G2PO and CRBC step advantages come to the true advantage, on HGPO-Rooms-v0.

    python benchmarks/estimator_bias.py [--seeds 5] [--groups 16] [--continuations 32] [--quick]

Rooms hides what the agent carries from room descriptions, so one observation text follows
different histories with different values: the context inconsistency HGPO's higher levels
are meant to correct. Per seed, ``--groups`` tasks (default difficulty, 15-step limit) are drawn
and each is rolled out N = 8 times (a task group) by a fixed stochastic policy that reads only
its prompt (``rooms_policy.PromptPolicy``; the prompt shows the last ``--policy-window`` steps).

Truth. At every sampled step the env stack (Rooms state, step counter, memory window) is
deep-copied and ``--continuations`` rollouts are run from it under the same policy: Q takes the
sampled action first, V draws the first action from the policy; each Q/V pair shares one random
stream. The true advantage is ``mean(Q) - mean(V)`` in the estimators' own return (gamma 0.95,
invalid penalty 0.1, no bootstrap at the step limit); its Monte-Carlo variance is reported, as
it is part of every MSE.

Estimators see only the batch: rewards, ids and fingerprints. Fingerprints for every K and mode
are recomputed from the recorded (state text, parsed action) sequence with the wrapper's own
``Fingerprinter`` (checked against the wrapper's keys at the policy's K), so all variants score
the same rollouts. MSE and bias (mean signed error, estimate - truth) use ``mean_norm``, the
only mode on the scale of Q - V; Spearman rank correlation is given for both modes. The
*systematic MSE* feeds each estimator the expected returns (from the Q continuations) instead of
the sampled ones, which leaves the error of its baseline. ``A = 0`` is the reference that
predicts no advantage at all. GraphGPO and HGPO with graph returns credit a step with
``10 * 0.1 ** distance-to-success`` in the task's state graph, not with the discounted return the
truth is measured in: their MSE is on another scale (shown, not comparable) and they have no
systematic MSE; their Spearman is comparable. G2PO credits a step with the value of the state it
led to, computed from the batch's episode rewards (its own discounting), so it has no systematic MSE
either. CRBC's step credit is its closure's Q - V (discounted success, beta 0.98) divided by the
anchor's spread, weighed 5 against GRPO's episode term: its MSE is on another scale too, and it has
no systematic MSE; its Spearman is comparable. Every number is the mean ± std over seeds of a statistic over all
steps of the seed's batch. ``--quick`` is a smoke run (seconds) that writes no files.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import gymnasium as gym
import numpy as np
from rooms_policy import PromptPolicy

from hgpo_env.contract.fingerprint import FINGERPRINT_MODES, Fingerprinter
from hgpo_env.envs.rooms import HELD_OUT_TASKS, RoomsEnv
from hgpo_env.textenv.registration import make_agent_env
from hgpo_train import advantage as adv
from hgpo_train.run.diagnostics import grouping_diagnostics

GAMMA = 0.95
INVALID_PENALTY = 0.1
GRAPH_GAMMA = 0.1
"""Base of GraphGPO's ``gamma ** distance`` (its recipe's ALFWorld setting)."""
GROUP_SIZE = 8
MAX_STEPS = 15
"""Step limit; with the default Rooms difficulty the policy wins about half its episodes."""
LEVELS = (1, 2, 4)
ALPHAS = (0.0, 1.0, 2.0)
MODE_NAMES = {"observations_actions": "obs+act", "observations": "obs"}
METRICS = ("mse", "systematic_mse", "bias", "spearman", "spearman_std", "exact_zero_share")
HEADERS = ("MSE", "systematic MSE", "bias", "Spearman", "Spearman (mean_std_norm)", "exact-zero steps")
GROUPING_METRICS = ("context_inconsistency", "level0_grouped", "levelK_grouped", "clustered_differently")
GROUPING_HEADERS = (
    "context inconsistency",
    "level-0 rows grouped",
    "level-K rows grouped",
    "rows clustered unlike obs+act",
)
MARKDOWN_TITLE = """# Step-advantage estimators against the true advantage (HGPO-Rooms-v0)

Written by `python benchmarks/estimator_bias.py` (see its docstring for the design).
"""
MARKDOWN_NOTES = """\
How to read it. Each cell is mean ± std over seeds of a statistic over all steps of a seed's batch.
The truth is the Monte-Carlo Q(h, a) - V(h) from the step's exact env state and memory window.
*MSE* and *bias* (mean of estimate - truth) compare the `mean_norm` estimates, which share the
truth's scale; *Spearman* is scale-free. *Systematic MSE* gives each estimator the expected
returns (from the continuations) instead of the sampled ones: what is left is the error of its
baseline (and of rows it gives no item), plus the Monte-Carlo noise of the expectations.
*A = 0* predicts no advantage: its MSE is the variance of the truth. GraphGPO, graph returns, G2PO
and CRBC credit values of their own (graph distances, state values, discounted success): their
MSE is on another scale and not comparable, their Spearman is. *Exact-zero steps* is the share of
steps the estimator gives no credit at all (advantage exactly 0: a group whose returns are all
equal). *Context inconsistency*
is the share of rows whose level-0 cluster holds more than one K-step context
(`hgpo_train.run.diagnostics`).
"""


# ------------------------------------------------------------------------------ rollouts


@dataclass(frozen=True)
class Truth:
    """Monte-Carlo values of one sampled step (h, a), from its exact state and memory window."""

    advantage: float
    """``mean(Q) - mean(V)``: the true advantage in the estimators' return."""
    noise: float
    """Variance of ``advantage`` over the continuations' randomness."""
    q_return: float
    """``mean(Q)``: the expected value of the step's return ``R~``."""
    q_reward: float
    """Expected undiscounted reward from this step on (for the expected episode score)."""


@dataclass
class Batch:
    """One seed's step rows, in rollout order, each with its :class:`Truth`."""

    group: list[int] = field(default_factory=list)
    traj: list[int] = field(default_factory=list)
    reward: list[float] = field(default_factory=list)
    invalid: list[bool] = field(default_factory=list)
    state_text: list[str] = field(default_factory=list)
    next_state_text: list[str] = field(default_factory=list)
    """The state text the step led to (the terminal observation's on a last step)."""
    action: list[str | None] = field(default_factory=list)
    action_key: list[int] = field(default_factory=list)
    won: list[bool] = field(default_factory=list)
    """The env's ``won`` after each step."""
    wrapper_fingerprints: list[tuple[int, ...]] = field(default_factory=list)
    truth: list[Truth] = field(default_factory=list)

    def column(self, name: str) -> np.ndarray:
        """A :class:`Truth` field over all rows."""
        return np.array([getattr(t, name) for t in self.truth])


def make_env(window: int) -> gym.Env[str, str]:
    """HGPO-Rooms-v0 as ``gymnasium.make`` builds it, without the checker wrappers."""
    return make_agent_env(
        "hgpo_env.envs.rooms:RoomsEnv", history_length=window, response_format="plain", max_steps=MAX_STEPS
    )


def restore(env: gym.Env[str, str]) -> gym.Env[str, str]:
    """An independent copy of the env stack in its exact state and memory window.

    The task, text spaces, prompt template and fingerprinter are shared, not copied: no step
    mutates them, and copying them would cost 7x more than the rest of the stack.
    """
    unwrapped = env.unwrapped
    shared = (
        unwrapped.task_spec,
        unwrapped.observation_space,
        unwrapped.action_space,
        env.template,
        env.fingerprinter,
    )
    return copy.deepcopy(env, {id(part): part for part in shared})


def continuation(
    env: gym.Env[str, str], action: str, policy: PromptPolicy, rng: random.Random
) -> tuple[float, float]:
    """Take ``action`` in ``env`` (consumed), then follow the policy to the end of the episode.

    Returns the estimators' return ``R~`` of the step (discounted, minus its invalid penalty, no
    bootstrap at the step limit) and the undiscounted reward collected.
    """
    prompt, reward, terminated, truncated, info = env.step(action)
    ret = float(reward) - INVALID_PENALTY * (not info["action_valid"])
    total, discount = float(reward), 1.0
    while not (terminated or truncated):
        discount *= GAMMA
        prompt, reward, terminated, truncated, info = env.step(
            policy.sample(prompt, info["admissible_actions"], rng)
        )
        ret += discount * float(reward)
        total += float(reward)
    return ret, total


def true_advantage(
    env: gym.Env[str, str],
    prompt: str,
    admissible: Sequence[str],
    action: str,
    policy: PromptPolicy,
    continuations: int,
    stream: str,
) -> Truth:
    """Q(h, action), V(h) and their difference by continuations from the env's current state.

    Continuation j draws its first action on stream j; its Q twin takes ``action`` instead and
    goes on with the same stream (common random numbers cut the variance of the difference),
    so when the draw equals ``action`` both are one rollout and V reuses Q's return.
    """
    q = np.empty((continuations, 2))
    diffs = np.empty(continuations)
    for j in range(continuations):
        rng = random.Random(f"{stream}/{j}")
        drawn = policy.sample(prompt, admissible, rng)
        after_draw = rng.getstate()
        q[j] = continuation(restore(env), action, policy, rng)
        if drawn == action:
            diffs[j] = 0.0
            continue
        rng.setstate(after_draw)
        diffs[j] = q[j, 0] - continuation(restore(env), drawn, policy, rng)[0]
    noise = diffs.var(ddof=1) / continuations if continuations > 1 else float("nan")
    return Truth(float(diffs.mean()), float(noise), float(q[:, 0].mean()), float(q[:, 1].mean()))


def collect_group(
    batch: Batch,
    env: gym.Env[str, str],
    policy: PromptPolicy,
    task_id: int,
    group: int,
    stream: str,
    continuations: int,
) -> None:
    """Roll out one task group and append its steps, each with its truth, to ``batch``."""
    for traj in range(GROUP_SIZE):
        rng = random.Random(f"{stream}/{traj}")
        prompt, info = env.reset(options={"task_id": task_id})
        for step in range(MAX_STEPS):
            action = policy.sample(prompt, info["admissible_actions"], rng)
            batch.truth.append(
                true_advantage(
                    env,
                    prompt,
                    info["admissible_actions"],
                    action,
                    policy,
                    continuations,
                    f"{stream}/{traj}/{step}",
                )
            )
            batch.group.append(group)
            batch.traj.append(group * GROUP_SIZE + traj)
            batch.state_text.append(info["state_text"])
            batch.wrapper_fingerprints.append(info["fingerprints"])
            prompt, reward, terminated, truncated, info = env.step(action)
            batch.reward.append(float(reward))
            batch.invalid.append(not info["action_valid"])
            batch.action.append(info["parsed_action"])
            batch.action_key.append(info["action_key"])
            batch.won.append(bool(info["won"]))
            batch.next_state_text.append(info["state_text"])
            if terminated or truncated:
                break


def check_restore(policy: PromptPolicy, window: int, task_id: int) -> None:
    """Restoring at any step and replaying the same actions reproduces the rollout exactly."""
    env, rng = make_env(window), random.Random(task_id)
    prompt, info = env.reset(options={"task_id": task_id})
    snapshots, actions, outcomes = [], [], []
    done = False
    while not done:
        snapshots.append(restore(env))
        actions.append(policy.sample(prompt, info["admissible_actions"], rng))
        prompt, reward, terminated, truncated, info = env.step(actions[-1])
        outcomes.append((prompt, reward, terminated, truncated, info["fingerprints"]))
        done = terminated or truncated
    for t, snapshot in enumerate(snapshots):
        for action, expected in zip(actions[t:], outcomes[t:]):
            prompt, reward, terminated, truncated, info = snapshot.step(action)
            if (prompt, reward, terminated, truncated, info["fingerprints"]) != expected:
                raise AssertionError(f"restoring task {task_id} at step {t} did not reproduce the rollout")


# ------------------------------------------------------------------------------ estimators


def level_fingerprints(batch: Batch, levels: int, mode: str) -> np.ndarray:
    """(n, levels+1) keys, exactly as ``KStepMemory(history_length=levels)`` would emit them."""
    fingerprinter = Fingerprinter(RoomsEnv.env_family, mode)
    rows, records, previous = [], [], None
    for traj, text, action in zip(batch.traj, batch.state_text, batch.action):
        if traj != previous:
            records, previous = [], traj
        state = fingerprinter.state(text)
        rows.append(fingerprinter.levels(state, records[:levels], levels + 1))
        records.insert(0, fingerprinter.record(state, action))
    return np.array(rows, dtype=np.uint64).reshape(len(rows), levels + 1)


def next_state_keys(batch: Batch, mode: str) -> np.ndarray:
    """Level-0 keys of the states the steps led to, as the wrapper's level 0 in ``mode``."""
    fingerprinter = Fingerprinter(RoomsEnv.env_family, mode)
    return np.array([fingerprinter.state(text) for text in batch.next_state_text], dtype=np.uint64)


def estimator_configs() -> dict[str, tuple[adv.AdvantageConfig, int, str]]:
    """Row name -> (config in mean_norm, K, fingerprint mode) for every estimator in the table."""
    base = {"gamma": GAMMA, "invalid_penalty": INVALID_PENALTY, "mode": "mean_norm"}
    graph = {**base, "gamma": GRAPH_GAMMA}
    rows = {
        "GRPO": (adv.AdvantageConfig("grpo", **base), 0, FINGERPRINT_MODES[0]),
        "GiGPO": (adv.AdvantageConfig("gigpo", **base), 0, FINGERPRINT_MODES[0]),
        "GraphGPO": (adv.AdvantageConfig("graphgpo", **graph), 0, FINGERPRINT_MODES[0]),
        "G2PO": (adv.AdvantageConfig("g2po", **base), 0, FINGERPRINT_MODES[0]),
        "CRBC (closure)": (adv.AdvantageConfig("crbc", **base), 0, FINGERPRINT_MODES[0]),
        "CRBC K=0": (
            adv.AdvantageConfig("crbc", crbc=adv.CRBCSettings(depth=0), **base),
            0,
            FINGERPRINT_MODES[0],
        ),
        "HGPO K=2 α=1 + graph returns": (
            adv.AdvantageConfig("hgpo", step_return="graph", **graph),
            2,
            FINGERPRINT_MODES[0],
        ),
    }
    for mode in FINGERPRINT_MODES:
        for levels in LEVELS:
            for alpha in ALPHAS:
                name = f"HGPO K={levels} α={alpha:g} {MODE_NAMES[mode]}"
                rows[name] = (adv.AdvantageConfig("hgpo", alpha=alpha, **base), levels, mode)
    return rows


def estimate(
    config: adv.AdvantageConfig,
    returns: np.ndarray,
    scores: np.ndarray,
    groups: np.ndarray,
    fp: np.ndarray,
    steps: tuple[np.ndarray, ...] | None = None,
) -> np.ndarray:
    """``config``'s advantages from given returns and episode scores (sampled or expected); G2PO
    and CRBC, which compute their own values, from the batch's ``steps`` (rewards, rollouts,
    invalid flags, action keys, won flags)."""
    if config.estimator in ("g2po", "crbc"):
        reward, traj, invalid, action_keys, won = steps
        if config.estimator == "crbc":
            return adv.crbc_advantages(reward, traj, groups, fp, action_keys, won, invalid, config)
        return adv.g2po_advantages(
            reward, traj, groups, fp, invalid, config.mode, config.gamma, INVALID_PENALTY
        )
    if config.estimator == "grpo":
        return adv.grpo_advantages(scores, groups, config.mode)
    if config.estimator in ("gigpo", "graphgpo"):
        return adv.gigpo_advantages(
            returns, scores, groups, fp, config.mode, config.step_weight, config.episode_weight
        )
    return adv.hgpo_advantages(
        returns, groups, fp, config.mode, config.alpha, config.base_group, scores, config.weight_offset
    )


def rewards_before(reward: np.ndarray, traj: np.ndarray) -> np.ndarray:
    """Reward collected by each row's rollout before that row (rollouts are contiguous)."""
    before = np.cumsum(reward) - reward
    _, first, inverse = np.unique(traj, return_index=True, return_inverse=True)
    return before - before[first][inverse]


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman rank correlation, ties given their average rank."""

    def ranks(v: np.ndarray) -> np.ndarray:
        _, inverse, counts = np.unique(v, return_inverse=True, return_counts=True)
        return (np.cumsum(counts) - (counts - 1) / 2.0)[inverse]

    rx, ry = ranks(x), ranks(y)
    if rx.std() == 0 or ry.std() == 0:
        return float("nan")
    return float(np.corrcoef(rx, ry)[0, 1])


def score_estimators(
    batch: Batch, fingerprints: dict[tuple[int, str], np.ndarray]
) -> dict[str, dict[str, float]]:
    """Per table row: MSE, systematic MSE, bias and Spearman (both modes) against the truth.

    The systematic MSE feeds every row its *expected* return and episode score (from the Q
    continuations) instead of the sampled ones: what error remains comes from the baseline the
    estimator subtracts (cluster means instead of V(h)), not from the noise of single returns.
    """
    groups, traj = np.asarray(batch.group), np.asarray(batch.traj)
    reward, invalid = np.asarray(batch.reward), np.asarray(batch.invalid, dtype=np.float64)
    truth = batch.column("advantage")
    sampled = (
        adv.step_returns(reward, traj, GAMMA, invalid, INVALID_PENALTY),
        adv.episode_scores(reward, traj, invalid, INVALID_PENALTY),
    )
    expected = (
        batch.column("q_return"),
        rewards_before(reward, traj) + batch.column("q_reward") - INVALID_PENALTY * invalid,
    )
    steps = (reward, traj, invalid, np.asarray(batch.action_key, dtype=np.uint64), np.asarray(batch.won))
    zero = float(np.mean(truth**2))
    rows = {"A = 0 (reference)": {"mse": zero, "systematic_mse": zero, "bias": 0.0, "exact_zero_share": 1.0}}
    for name, (config, levels, mode) in estimator_configs().items():
        fp = fingerprints[levels, mode]
        returns = sampled[0]
        if config.returns == "graph":  # no expected version: the graph is the batch's own
            after = next_state_keys(batch, mode)
            returns = adv.graph_returns(
                reward, traj, groups, fp[:, 0], after, config.gamma, invalid, INVALID_PENALTY
            )

        advantages = estimate(config, returns, sampled[1], groups, fp, steps)
        error = advantages - truth
        own_returns = config.returns == "graph" or config.estimator in ("g2po", "crbc")
        systematic = None if own_returns else estimate(config, *expected, groups, fp)
        rows[name] = {
            "mse": float(np.mean(error**2)),
            "systematic_mse": float(np.mean((systematic - truth) ** 2)) if systematic is not None else np.nan,
            "bias": float(np.mean(error)),
            "spearman": spearman(advantages, truth),
            "exact_zero_share": float(np.mean(advantages == 0)),
            "spearman_std": spearman(
                estimate(
                    dataclasses.replace(config, mode="mean_std_norm"), returns, sampled[1], groups, fp, steps
                ),
                truth,
            ),
        }
    return rows


def score_grouping(
    batch: Batch, fingerprints: dict[tuple[int, str], np.ndarray]
) -> dict[str, dict[str, float]]:
    """Per (K, mode): context inconsistency, grouped shares, and rows the two modes cluster apart."""
    grouping = {}
    for levels in LEVELS:
        for mode in FINGERPRINT_MODES:
            fp = fingerprints[levels, mode]
            d = grouping_diagnostics(batch.group, fp)
            grouping[f"K={levels} {MODE_NAMES[mode]}"] = {
                "context_inconsistency": d["grouping/context_inconsistency"],
                "level0_grouped": d["grouping/level0/grouped_share"],
                "levelK_grouped": d[f"grouping/level{levels}/grouped_share"],
                "clustered_differently": clustered_differently(
                    batch.group, fp, fingerprints[levels, FINGERPRINT_MODES[0]]
                ),
            }
    return grouping


def clustered_differently(groups: Sequence[int], fp: np.ndarray, other: np.ndarray) -> float:
    """Share of rows whose cluster differs, at some level, between two fingerprint sets."""
    differs = np.zeros(len(fp), dtype=bool)
    for a, b in zip(adv.level_clusters(groups, fp).T, adv.level_clusters(groups, other).T):
        pairs = np.unique(np.stack([a, b], axis=1), axis=0)
        # a cluster of one set that meets two clusters of the other (-1, missing, counts as one)
        differs |= np.bincount(pairs[:, 0] + 1)[a + 1] > 1
        differs |= np.bincount(pairs[:, 1] + 1)[b + 1] > 1
    return float(differs.mean())


# ------------------------------------------------------------------------------ the study


@dataclass(frozen=True)
class Study:
    seeds: int
    groups: int
    continuations: int
    policy_window: int


@dataclass(frozen=True)
class SeedResult:
    batch: Batch
    estimators: dict[str, dict[str, float]]
    """Table row name -> metric -> value (see :func:`score_estimators`)."""
    grouping: dict[str, dict[str, float]]
    """``K=k mode`` -> metric -> value (see :func:`score_grouping`)."""


def run_seed(study: Study, seed: int, policy: PromptPolicy) -> SeedResult:
    """Collect one seed's batch with its truth and score every estimator on it."""
    env = make_env(study.policy_window)
    tasks = np.random.default_rng(seed).integers(HELD_OUT_TASKS, 2**31 - 1, study.groups)
    batch = Batch()
    for group, task_id in enumerate(tasks.tolist()):
        collect_group(batch, env, policy, task_id, group, f"{seed}/{group}", study.continuations)
    fingerprints = {
        (k, mode): level_fingerprints(batch, k, mode)
        for k in {0, *LEVELS, study.policy_window}
        for mode in FINGERPRINT_MODES
    }
    wrapper_keys = np.array(batch.wrapper_fingerprints, dtype=np.uint64)
    if not np.array_equal(fingerprints[study.policy_window, FINGERPRINT_MODES[0]], wrapper_keys):
        raise AssertionError("recomputed fingerprints differ from the wrapper's")
    return SeedResult(batch, score_estimators(batch, fingerprints), score_grouping(batch, fingerprints))


def mean_std(values: Sequence[float]) -> str:
    """``mean ± std`` over seeds, or a dash where the statistic is undefined."""
    v = np.asarray(values, dtype=np.float64)
    if np.isnan(v).any():
        return "–"
    return f"{v.mean():.3f} ± {v.std(ddof=1) if len(v) > 1 else 0.0:.3f}"


def markdown_tables(results: list[SeedResult]) -> str:
    """The estimator table and the grouping table, cells ``mean ± std`` over seeds."""
    lines = ["| estimator (mean_norm) | " + " | ".join(HEADERS) + " |", "|---" * (len(HEADERS) + 1) + "|"]
    for name in results[0].estimators:
        cells = [mean_std([r.estimators[name].get(m, np.nan) for r in results]) for m in METRICS]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "| fingerprints | " + " | ".join(GROUPING_HEADERS) + " |",
        "|---" * (len(GROUPING_HEADERS) + 1) + "|",
    ]
    for name in results[0].grouping:
        cells = [mean_std([r.grouping[name][m] for r in results]) for m in GROUPING_METRICS]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def batch_summary(results: list[SeedResult]) -> str:
    """Batch size, success rate, invalid steps, spread of the truth and its Monte-Carlo variance."""
    batches = [r.batch for r in results]
    steps = [len(b.reward) for b in batches]
    wins = [np.count_nonzero(b.reward) / len(set(b.traj)) for b in batches]
    invalid = [np.mean(b.invalid) for b in batches]
    spread = [np.var(b.column("advantage")) for b in batches]
    noise = [np.mean(b.column("noise")) for b in batches]
    return (
        f"steps per seed {mean_std(steps)}, episodes won {mean_std(wins)}, invalid steps {mean_std(invalid)}; "
        f"variance of the true advantage {mean_std(spread)}, "
        f"its Monte-Carlo variance (part of every MSE) {mean_std(noise)}"
    )


def _colour(name: str) -> str:
    if name.startswith("HGPO"):
        return "C2" if name.endswith("obs+act") else "C3"
    if name.startswith("CRBC"):
        return "C4"
    return {"GRPO": "C0", "GiGPO": "C1"}.get(name, "grey")


def plot(results: list[SeedResult], path: Path) -> None:
    """MSE (systematic part darker) and Spearman per estimator; bars are seed means, whiskers stds."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    names = list(results[0].estimators)
    y = np.arange(len(names))
    colours = [_colour(name) for name in names]

    def over_seeds(metric: str) -> tuple[np.ndarray, np.ndarray]:
        values = np.array([[r.estimators[n].get(metric, np.nan) for r in results] for n in names])
        return values.mean(axis=1), values.std(axis=1, ddof=1) if len(results) > 1 else np.zeros(len(names))

    fig = Figure(figsize=(12, 0.3 * len(names) + 1.5), layout="constrained")
    FigureCanvasAgg(fig)
    mse_ax, rank_ax = fig.subplots(1, 2, sharey=True)
    mse_ax.barh(y, *over_seeds("mse")[:1], xerr=over_seeds("mse")[1], color=colours, alpha=0.45, label="MSE")
    mse_ax.barh(y, over_seeds("systematic_mse")[0], height=0.4, color=colours, label="systematic MSE")
    mse_ax.set(title="error vs true advantage, mean_norm (lower is better)")
    mse_ax.legend(fontsize="small", loc="lower right")
    rank_ax.barh(y, over_seeds("spearman")[0], xerr=over_seeds("spearman")[1], color=colours)
    rank_ax.set(title="Spearman vs true advantage (higher is better)")
    for ax in (mse_ax, rank_ax):
        ax.grid(axis="x", alpha=0.3)
    mse_ax.set_yticks(y, names, fontsize="small")
    mse_ax.invert_yaxis()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--groups", type=int, default=16, help="task groups (of 8 rollouts) per seed")
    parser.add_argument("--continuations", type=int, default=32, help="Monte-Carlo rollouts for Q and for V")
    parser.add_argument("--policy-window", type=int, default=2, help="past steps the policy's prompt shows")
    parser.add_argument(
        "--quick", action="store_true", help="2 seeds x 2 groups x 8 continuations; writes no files"
    )
    parser.add_argument("--plot", type=Path, help="figure path (default docs/estimator_bias.png)")
    parser.add_argument("--table", type=Path, help="markdown path (default docs/estimator_bias.md)")
    args = parser.parse_args(argv)
    if args.quick:
        study = Study(seeds=2, groups=2, continuations=8, policy_window=args.policy_window)
    else:
        study = Study(args.seeds, args.groups, args.continuations, args.policy_window)
        args.plot = args.plot or Path("docs/estimator_bias.png")
        args.table = args.table or Path("docs/estimator_bias.md")

    start_wall, start_cpu = time.perf_counter(), time.process_time()
    policy = PromptPolicy()
    check_restore(policy, study.policy_window, HELD_OUT_TASKS)
    results = []
    for seed in range(study.seeds):
        results.append(run_seed(study, seed, policy))
        elapsed = time.perf_counter() - start_wall
        print(f"seed {seed}: {len(results[-1].batch.reward)} steps, {elapsed:.0f}s", file=sys.stderr)
    wall, cpu = time.perf_counter() - start_wall, time.process_time() - start_cpu
    report = (
        f"{study.seeds} seeds x {study.groups} task groups x {GROUP_SIZE} rollouts, "
        f"{study.continuations} continuations each for Q and V, policy window {study.policy_window}, "
        f"gamma {GAMMA}, max_steps {MAX_STEPS}; {wall:.0f}s wall, {cpu:.0f}s cpu\n"
        f"{batch_summary(results)}\n\n{markdown_tables(results)}\n"
    )
    print(report)
    if args.table:
        args.table.parent.mkdir(parents=True, exist_ok=True)
        args.table.write_text(f"{MARKDOWN_TITLE}\n{report}\n{MARKDOWN_NOTES}")
    if args.plot:
        plot(results, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
