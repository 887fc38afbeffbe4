"""``python -m hgpo_env audit``: which estimators an env's state key supports.

State-keyed estimators (GiGPO, GraphGPO, G2PO, CRBC) take two steps with one state key (level 0 of
the fingerprints) for one state. :func:`audit_env` plays task groups with a seeded policy and
measures, per context level k, how often a (key, action) led to another next state after another
history (*aliasing*, :func:`hgpo_env.tools.transitions.aliased_visits`), with a 95 % bootstrap interval
over task groups and an example in text; at level 0 how the group's rollouts meet (*merging*); and
whether each group's members started one task. The verdict says which estimators the key supports
and what to change where it aliases. For an env with milestones (:mod:`hgpo_env.contract.milestones`) it
also says how often each fires: in how many episodes, and on how many observations.

Under a memory kind other than the window (``memory=compaction`` or ``notes``) the audit's agent
remembers faithfully: a summary keeps every fact its turn offers, and notes keep every observation
so far. The keys are then audited under a memory that states what the agent saw, so a level that
still aliases is the keys' fault, not the memory's.
"""

from __future__ import annotations

import math
import random
import sys
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import gymnasium as gym
import numpy as np

from hgpo_env.contract.milestones import MILESTONES_KEY
from hgpo_env.prompting.memory import SUMMARY_TURN
from hgpo_env.tools.check import group_start_problem, policy_command, turn_reply
from hgpo_env.tools.transitions import aliased_visits, history_keys, merging

Policy = Literal["random", "expert"]
POLICIES: tuple[str, ...] = ("random", "expert")
STATE_KEYED = "GiGPO, GraphGPO, G2PO and CRBC"
RESAMPLES = 2000
"""Bootstrap resamples of the task groups behind each interval."""
SHOWN_STEPS = 4
"""Past commands shown of each history in an example."""


class AuditError(Exception):
    """The env could not be audited (it does not reset, or offers nothing to do): one line."""


@dataclass
class LevelAudit:
    level: int
    visits: int
    """Visits whose prompt shows this level (key not 0)."""
    aliased_share: float
    aliased_interval: tuple[float, float]
    """95 % percentile-bootstrap interval over task groups."""
    example: dict[str, Any] | None = None
    """An aliased visit: ``key`` (the state text), ``action``, and per side its ``history`` (the
    last commands) and ``successor`` (the state text it led to)."""

    @property
    def sound(self) -> bool:
        """The interval contains 0: no evidence that this key merges states."""
        return self.aliased_interval[0] == 0.0


@dataclass
class AuditReport:
    env_id: str
    policy: str
    seed: int
    history_length: int
    groups: int = 0
    episodes: int = 0
    steps: int = 0
    levels: list[LevelAudit] = field(default_factory=list)
    summary_levels: list[LevelAudit] = field(default_factory=list)
    """The summary turns of a memory kind that has them (``memory="compaction"``), audited apart
    on their own keys: a summary turn is no env step, and an action's successor is the env's next
    observation, whatever turns come between."""
    merging: dict[str, float] = field(default_factory=dict)
    """At level 0: ``eligible_share`` (visits at a key where two or more actions were taken), and
    over those ``rollouts_k0`` / ``rollouts_closure`` (mean share of the group's rollouts whose
    visits reach the key at one step / through the transitions) and ``all_rollouts_k0`` /
    ``all_rollouts_closure`` (the share of them every rollout reaches)."""
    task_group_problems: list[str] = field(default_factory=list)
    milestones: dict[str, dict[str, float]] = field(default_factory=dict)
    """Per milestone of the env (none: the env has none), ``episodes``: the share of episodes
    that reached it, ``observations``: the share of observations (resets included) that report it."""
    verdict: str = ""

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        for level in out["levels"] + out["summary_levels"]:
            level["aliased_interval"] = list(level["aliased_interval"])
        return out

    def format(self) -> str:
        played = f"{self.groups} task groups, {self.episodes} episodes, {self.steps} steps"
        lines = [
            f"{self.env_id}: {played} ({self.policy} policy, seed {self.seed}, K = {self.history_length})",
            "level  visits  aliased  95% interval",
        ]
        lines += [_level_line(level) for level in self.levels]
        if self.summary_levels:
            lines.append("summary turns, on their own keys:")
            lines += [_level_line(level) for level in self.summary_levels]
        m = self.merging
        lines.append(
            f"merging at level 0: {m['eligible_share']:.2f} of visits at keys with 2+ actions; of those, "
            f"{m['all_rollouts_k0']:.2f} visited by every rollout, {m['all_rollouts_closure']:.2f} reached by "
            "every rollout through the transitions"
        )
        example = next((level for level in self.levels if level.example), None)
        if example is not None:
            e = example.example
            lines.append(f"example at level {example.level}: {e['action']!r} at {_short(e['key'])!r}")
            for side in e["sides"]:
                lines.append(
                    f"  after {' > '.join(side['history']) or '(start)'}: -> {_short(side['successor'])!r}"
                )
        if self.milestones:
            lines.append("milestone     episodes  observations")
            lines += [
                f"{name:<12}  {share['episodes']:8.3f}  {share['observations']:12.3f}"
                for name, share in self.milestones.items()
            ]
        lines += [f"TASK GROUP PROBLEM: {problem}" for problem in self.task_group_problems]
        lines.append(f"verdict: {self.verdict}")
        return "\n".join(lines)


def _level_line(level: LevelAudit) -> str:
    low, high = level.aliased_interval
    return f"{level.level:>5}  {level.visits:>6}  {level.aliased_share:7.3f}  [{low:.3f}, {high:.3f}]"


def _short(text: str, limit: int = 100) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass
class _Visits:
    """The audit's rows: one per step, with what its report needs in text."""

    group: list[int] = field(default_factory=list)
    rollout: list[int] = field(default_factory=list)
    fingerprints: list[tuple[int, ...]] = field(default_factory=list)
    action_key: list[int] = field(default_factory=list)
    next_state: list[int] = field(default_factory=list)
    state_text: list[str] = field(default_factory=list)
    command: list[str] = field(default_factory=list)
    next_text: list[str] = field(default_factory=list)
    past: list[tuple[str, ...]] = field(default_factory=list)
    summary: list[bool] = field(default_factory=list)
    """Per row, whether it is a summary turn (its prompt asked for a summary, not a command)."""
    flags: list[tuple[int, ...]] = field(default_factory=list)
    """Per observation (resets included) of an env with milestones, its flags."""
    reached: list[tuple[bool, ...]] = field(default_factory=list)
    """Per episode of such an env, the milestones any of its observations reported."""


def faithful_notes(env: gym.Env, info: Mapping[str, Any], reply: str) -> str:
    """``reply``, and under ``memory="notes"`` before it notes that keep every observation so far."""
    try:
        tag, notes = env.get_wrapper_attr("notes_tag"), env.get_wrapper_attr("notes")
    except AttributeError:
        return reply
    return f"<{tag}>{notes} {info['state_text']}</{tag}> {reply}"


def _play_episode(
    env: gym.Env,
    visits: _Visits,
    group: int,
    rollout: int,
    task: tuple[int, int],
    choose: Callable,
    max_steps: int,
) -> Mapping[str, Any]:
    seed, task_id = task
    try:
        _, info = env.reset(seed=seed, options={"task_id": task_id})
    except Exception as error:  # noqa: BLE001  (any failure to reset ends the audit in one line)
        raise AuditError(
            f"the env could not reset (task {task_id}): {type(error).__name__}: {error}"
        ) from None
    reset_info, past, flags, step = info, (), [info.get(MILESTONES_KEY)], 0
    waiting: list[int] = []  # actions whose successor, the env's next observation, a summary turn hides
    while step < max_steps or waiting:  # env steps (a summary turn is none), the last one's successor
        if not info.get("admissible_actions"):
            raise AuditError(
                f"the env offers no admissible actions (task {task_id}, step {step}): the audit's policy "
                "picks among them (--policy expert plays the env's expert where it has one)"
            )
        summary = info.get("turn") == SUMMARY_TURN
        step += not summary
        command, reply = choose(env, info)
        visits.summary.append(summary)
        visits.group.append(group)
        visits.rollout.append(rollout)
        visits.fingerprints.append(tuple(info["fingerprints"]))
        visits.state_text.append(str(info.get("state_text", "")))
        visits.past.append(past[-SHOWN_STEPS:])
        _, _, terminated, truncated, info = env.step(reply)
        visits.command.append(command)
        visits.action_key.append(int(info["action_key"]))
        visits.next_state.append(int(info["fingerprints"][0]))
        visits.next_text.append(str(info.get("state_text", "")))
        if not summary:
            waiting.append(len(visits.next_state) - 1)
        if info.get("turn") != SUMMARY_TURN:  # the env's observation is shown: it is their successor
            for row in waiting:
                visits.next_state[row] = int(info["fingerprints"][0])
                visits.next_text[row] = str(info.get("state_text", ""))
            waiting = []
        past = (*past, command)
        flags.append(info.get(MILESTONES_KEY))
        if terminated or truncated:
            break
    if flags[0] is not None:
        visits.flags += flags
        visits.reached.append(tuple(np.any(flags, axis=0)))
    return reset_info


def audit_env(
    env_id: str,
    env_kwargs: Mapping[str, Any] | None = None,
    *,
    episodes: int = 64,
    group_size: int = 8,
    max_steps: int = 30,
    history_length: int = 4,
    seed: int = 0,
    policy: Policy = "random",
    progress: Callable[[int, int], None] | None = None,
) -> AuditReport:
    """Play ``episodes`` episodes of ``env_id`` in task groups of ``group_size`` (each group one task,
    from seed ``seed + group``) and measure its keys at levels 0..``history_length``. ``policy``:
    ``random`` picks uniformly among the admissible commands (seeded), ``expert`` follows the env's
    expert where it has one, else random. ``progress(episodes_done, episodes)`` is called after each
    episode. Raises :class:`AuditError` for an env that cannot be audited."""
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; expected one of {POLICIES}")
    for name, value in (("episodes", episodes), ("group_size", group_size), ("max_steps", max_steps)):
        if value < 1:
            raise ValueError(f"{name} must be at least 1, got {value}")
    if history_length < 0:
        raise ValueError(f"history_length must be >= 0, got {history_length}")
    kwargs = {"history_length": history_length, "response_format": "plain", **(env_kwargs or {})}
    rng = random.Random(seed)

    def choose(env: gym.Env, info: Mapping[str, Any]) -> tuple[str, str]:
        """What the audit plays (a command, or a summary that keeps every fact offered) and the
        reply that gives it."""
        if info.get("turn") == SUMMARY_TURN:
            summary = " ".join(info["admissible_actions"])
            return summary, turn_reply(env, info, summary)
        command = policy_command(env, info, rng, policy == "expert", ())
        return command, faithful_notes(env, info, turn_reply(env, info, command))

    report = AuditReport(env_id, policy, seed, history_length)
    visits = _Visits()
    env = gym.make(env_id, **kwargs)
    try:
        groups = math.ceil(episodes / group_size)
        for group in range(groups):
            try:
                env.reset(seed=seed + group)
            except Exception as error:  # noqa: BLE001
                raise AuditError(f"the env could not reset: {type(error).__name__}: {error}") from None
            task = (seed + group, getattr(env.unwrapped, "task_id", None))
            members = min(group_size, episodes - group * group_size)
            starts = []
            for member in range(members):
                starts.append(
                    _play_episode(env, visits, group, group * group_size + member, task, choose, max_steps)
                )
                report.episodes += 1
                if progress is not None:
                    progress(report.episodes, episodes)
            problem = group_start_problem(group, task[1], starts)
            if problem:
                report.task_group_problems.append(problem)
            report.groups += 1
    finally:
        env.close()
    report.steps = len(visits.group)
    _measure(report, visits, np.random.default_rng(seed))
    if visits.flags:
        names = getattr(env.unwrapped, "milestones", ()) or [f"m{m + 1}" for m in range(len(visits.flags[0]))]
        observed, reached = np.mean(visits.flags, axis=0), np.mean(visits.reached, axis=0)
        report.milestones = {
            name: {"episodes": float(reached[m]), "observations": float(observed[m])}
            for m, name in enumerate(names)
        }
    return report


def _measure(report: AuditReport, visits: _Visits, rng: np.random.Generator) -> None:
    """The levels of the action turns and, apart, of the summary turns; merging over the actions."""
    summary = np.array(visits.summary, dtype=bool)
    rows = np.flatnonzero(~summary)
    group, rollout, fingerprints, actions, _ = _columns(visits, rows)
    report.levels = _levels(visits, rows, rng)
    summaries = _levels(visits, np.flatnonzero(summary), rng) if summary.any() else []
    report.summary_levels = [level for level in summaries if level.visits]  # the levels they show
    met = merging(group, rollout, fingerprints[:, 0], actions)
    eligible = met.eligible
    report.merging = {
        "eligible_share": float(eligible.mean()) if len(eligible) else 0.0,
        "rollouts_k0": _mean_over(met.visited, eligible),
        "rollouts_closure": _mean_over(met.reached, eligible),
        "all_rollouts_k0": _mean_over(met.visited == 1, eligible),
        "all_rollouts_closure": _mean_over(met.reached == 1, eligible),
    }
    report.verdict = _verdict(report)


def _columns(visits: _Visits, rows: np.ndarray) -> tuple[np.ndarray, ...]:
    """Task group, rollout, fingerprints, action key and successor of ``rows``."""
    fingerprints = np.array(visits.fingerprints, dtype=np.uint64).reshape(len(visits.group), -1)
    return (
        np.array(visits.group, dtype=np.int64)[rows],
        np.array(visits.rollout, dtype=np.int64)[rows],
        fingerprints[rows],
        np.array(visits.action_key, dtype=np.uint64)[rows],
        np.array(visits.next_state, dtype=np.uint64)[rows],
    )


def _levels(visits: _Visits, rows: np.ndarray, rng: np.random.Generator) -> list[LevelAudit]:
    """Each level's aliasing over ``rows``, their histories made of those rows alone."""
    group, rollout, fingerprints, actions, successors = _columns(visits, rows)
    histories = history_keys(rollout, fingerprints[:, 0], actions)
    levels = []
    for k in range(fingerprints.shape[1]):
        keys = fingerprints[:, k]
        aliased = aliased_visits(group, keys, actions, histories, successors)
        shown = keys != 0
        example = _example(visits, rows, keys, actions, histories, successors, aliased)
        share = float(aliased.sum() / shown.sum()) if shown.any() else 0.0
        levels.append(LevelAudit(k, int(shown.sum()), share, _interval(group, aliased, shown, rng), example))
    return levels


def _mean_over(values: np.ndarray, rows: np.ndarray) -> float:
    return float(values[rows].mean()) if rows.any() else 0.0


def _interval(
    group: np.ndarray, aliased: np.ndarray, shown: np.ndarray, rng: np.random.Generator
) -> tuple[float, float]:
    """95 % percentile bootstrap of the aliased share, resampling whole task groups."""
    codes = np.unique(group, return_inverse=True)[1]
    hits = np.bincount(codes, weights=aliased & shown)
    totals = np.bincount(codes, weights=shown)
    if totals.sum() == 0:
        return (0.0, 0.0)
    draws = rng.integers(0, len(hits), size=(RESAMPLES, len(hits)))
    shares = hits[draws].sum(axis=1) / np.maximum(totals[draws].sum(axis=1), 1)
    low, high = np.percentile(shares, [2.5, 97.5])
    return (float(low), float(high))


def _example(
    visits: _Visits,
    rows: np.ndarray,
    keys: np.ndarray,
    actions: np.ndarray,
    histories: np.ndarray,
    successors: np.ndarray,
    aliased: np.ndarray,
) -> dict[str, Any] | None:
    """Two visits that show the aliasing: one key and action, two histories, two successors."""
    if not aliased.any():
        return None
    group = np.array(visits.group, dtype=np.int64)[rows]
    i = int(np.flatnonzero(aliased)[0])
    same = (group == group[i]) & (keys == keys[i]) & (actions == actions[i])
    j = int(np.flatnonzero(same & (histories != histories[i]) & (successors != successors[i]))[0])
    sides = [{"history": list(visits.past[r]), "successor": visits.next_text[r]} for r in (rows[i], rows[j])]
    return {"key": visits.state_text[rows[i]], "action": visits.command[rows[i]], "sides": sides}


def _verdict(report: AuditReport) -> str:
    state = report.levels[0]
    sparse = report.merging["eligible_share"] < 0.1
    meeting = (
        f"; but only {report.merging['eligible_share']:.0%} of visits are at keys where two or more "
        "actions were tried, so state-keyed step credit will be sparse"
        if sparse
        else ""
    )
    if state.sound:
        return f"the state key is sound here: every estimator is supported ({STATE_KEYED} key on it){meeting}"
    revealing = next((level.level for level in report.levels[1:] if level.sound), None)
    where = (
        f"HGPO with K >= {revealing} keys on enough history to tell them apart"
        if revealing is not None
        else f"no level up to K = {report.history_length} tells them apart: raise K (HGPO)"
    )
    return (
        f"the state key aliases ({state.aliased_share:.1%} of visits, 95% interval "
        f"[{state.aliased_interval[0]:.3f}, {state.aliased_interval[1]:.3f}]): {STATE_KEYED} would take "
        f"different states for one; {where}, or make the key include what the history shows "
        "(TextEnvSpec.state_text)"
    )


def print_progress(done: int, total: int) -> None:
    """A one-line progress bar on stderr, redrawn in place (only on a terminal)."""
    if not sys.stderr.isatty():
        return
    width = 30
    filled = width * done // total
    print(
        f"\raudit [{'#' * filled}{'.' * (width - filled)}] {done}/{total} episodes", end="", file=sys.stderr
    )
    if done == total:
        print(file=sys.stderr)
