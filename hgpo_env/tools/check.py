"""A health check of an env's ``info`` contract and fingerprints, to run before training on it.

:func:`check_env_health` plays a few task groups the way a trainer would (each member of a group
reset to the same task), replays episodes in fresh envs, and measures how steps group per level.
*Problems* break the contract (missing keys, a replay that differs, a group whose task keys or
initial fingerprints differ, a level the prompt shows with no key) or leave it unchecked (every
episode over at its first step) and make ``python -m hgpo_env check`` exit non-zero; *warnings*
point at traps that quietly spoil training: a ``state_text`` that carries a counter or clock (level
0 never repeats), episodes that run out of turns with a positive reward (not a win unless the env
says so), and tasks that the first observation and task key cannot tell apart (an env that may
ignore its seed, or hidden state no task key names).
"""

from __future__ import annotations

import itertools
import random
import re
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym

from hgpo_env.contract.info import RESET_KEYS, STEP_KEYS
from hgpo_env.prompting.memory import DEFAULT_HISTORY_LENGTH, SUMMARY_TURN
from hgpo_env.textenv.adapter import TextAdapter
from hgpo_env.textenv.core import TextEnv

PROBES = ("look", "inventory", "wait", "help")
"""Commands tried on free-form envs without an expert."""
SEED_PROBES = 8
"""Resets with different seeds that look for an env that ignores its seed or hides its task."""
_DIGITS = re.compile(r"\d+")


@dataclass
class LevelHealth:
    """How the steps of the checked groups cluster at one level (shares of steps)."""

    level: int
    shown: float
    """Steps whose prompt shows this level (the rest have key 0)."""
    repeated: float
    """Steps whose key another step of the same group shares."""
    singleton: float
    """Steps whose key no other step of the group has."""
    mixed_context: float
    """Steps whose cluster at this level holds prompts with different memory windows."""


@dataclass
class HealthReport:
    env_id: str
    episodes: int = 0
    won: int = 0
    steps: int = 0
    levels: list[LevelHealth] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def format(self) -> str:
        lines = [f"{self.env_id}: {self.episodes} episodes ({self.won} won), {self.steps} steps"]
        lines.append("level  shown  repeated  singleton  mixed-context")
        for h in self.levels:
            lines.append(
                f"{h.level:>5}  {h.shown:5.2f}  {h.repeated:8.2f}  {h.singleton:9.2f}  {h.mixed_context:13.2f}"
            )
        lines += [f"WARNING: {text}" for text in self.warnings]
        lines += [f"PROBLEM: {text}" for text in self.problems]
        lines.append("contract: OK" if self.ok else f"contract: {len(self.problems)} problem(s)")
        return "\n".join(lines)


@dataclass
class _Step:
    group: int
    fingerprints: tuple[int, ...]


def _expert(env: gym.Env) -> Any:
    """The env's ``expert_action``: on our env, or on the third-party env an adapter wraps."""
    base = env.unwrapped
    inner = getattr(base, "env", None) if isinstance(base, TextAdapter) else None
    for candidate in (base, inner, getattr(inner, "unwrapped", None)):
        expert = getattr(candidate, "expert_action", None)
        if callable(expert):
            return expert
    return None


def policy_command(
    env: gym.Env, info: Mapping[str, Any], rng: random.Random, expert: bool, probes: Sequence[str]
) -> str:
    """The expert's command where asked and available, else a random admissible one or a probe."""
    expert_action = _expert(env) if expert else None
    if expert_action is not None:
        try:
            command = expert_action()
        except (IndexError, KeyError, RuntimeError):  # a gold path the episode has left
            command = None
        if isinstance(command, str):
            return command
    return rng.choice(list(info["admissible_actions"]) or list(probes))


def turn_reply(env: gym.Env, info: Mapping[str, Any], command: str) -> str:
    """The reply that plays ``command`` on the turn ``info`` asks for, in the env's reply format
    (the prompt memory's): on a summary turn the summary ``command``, else the command (a call of
    the env's tool where it reads calls)."""
    if info.get("turn") == SUMMARY_TURN:
        return env.get_wrapper_attr("summary_reply")(command)
    return env.get_wrapper_attr("command_reply")(command)


def _default_task_key(env: gym.Env) -> bool:
    """Whether the env's task key is the default one, which cannot see hidden state."""
    base = env.unwrapped
    if isinstance(base, TextAdapter):
        return base.text_spec.task_key is None and type(base).task_identity is TextAdapter.task_identity
    return isinstance(base, TextEnv) and type(base).task_identity is TextEnv.task_identity


def _contract_problems(
    info: Mapping[str, Any], keys: Sequence[str], history_length: int, where: str, window: bool = True
) -> list[str]:
    """What ``info`` breaks of the contract. Its keys fill levels 0..j and leave those above 0;
    under the window (``window``), j is ``history_used`` (the other memory kinds key a summary
    or notes at levels of their own, :mod:`hgpo_env.prompting.kinds`)."""
    missing = [key for key in keys if key not in info]
    if missing:
        return [f"{where}: info lacks {missing}"]
    problems = []
    levels = info["fingerprints"]
    if len(levels) != history_length + 1:
        problems.append(f"{where}: {len(levels)} fingerprints, expected {history_length + 1}")
    shown = info["history_used"]
    filled = next((level for level, key in enumerate(levels) if key == 0), len(levels))
    if filled == 0 or any(key != 0 for key in levels[filled:]):
        problems.append(f"{where}: fingerprints {levels} leave a level 0 below one that is not")
    elif window and filled != shown + 1:
        problems.append(f"{where}: fingerprints {levels} do not match history_used={shown}")
    if not all(isinstance(command, str) for command in info["admissible_actions"]):
        problems.append(f"{where}: admissible_actions must be a list of str")
    return problems


def _play(
    env: gym.Env, seed: int, task_id: int, commands: Sequence[str] | None, policy: Any, max_steps: int
) -> tuple[list[tuple[Any, ...]], list[str], list[dict[str, Any]], dict[str, Any]]:
    """One episode: the trace to compare on replay, the commands sent, the step infos, the reset info."""
    prompt, reset_info = env.reset(seed=seed, options={"task_id": task_id})
    trace: list[tuple[Any, ...]] = [(prompt, reset_info["fingerprints"])]
    sent: list[str] = []
    infos: list[dict[str, Any]] = []
    info = reset_info
    for t in range(max_steps if commands is None else len(commands)):
        command = policy(info) if commands is None else commands[t]
        prompt, reward, terminated, truncated, info = env.step(turn_reply(env, info, command))
        sent.append(command)
        infos.append(info)
        trace.append((prompt, float(reward), terminated, truncated, info["fingerprints"]))
        if terminated or truncated:
            break
    return trace, sent, infos, reset_info


def group_start_problem(group: int, task_id: Any, reset_infos: Sequence[Mapping[str, Any]]) -> str | None:
    """One line if the members of a task group did not start one task (their task keys or
    initial fingerprints differ), else None."""
    starts = {(info.get("task_key"), info.get("initial_fingerprint")) for info in reset_infos}
    if len(starts) == 1:
        return None
    return (
        f"group {group} (task {task_id}): members started different tasks "
        f"(task key, initial fingerprint): {sorted(starts, key=str)}"
    )


def _level_health(steps: list[_Step], level: int) -> LevelHealth:
    shown = [(s.group, s.fingerprints[level], s.fingerprints) for s in steps if s.fingerprints[level]]
    keys = Counter((group, key) for group, key, _ in shown)
    contexts: dict[tuple[int, int], set[tuple[int, ...]]] = defaultdict(set)
    for group, key, context in shown:
        contexts[group, key].add(context)
    n = len(steps) or 1
    repeated = sum(keys[group, key] >= 2 for group, key, _ in shown)
    mixed = sum(len(contexts[group, key]) >= 2 for group, key, _ in shown)
    return LevelHealth(level, len(shown) / n, repeated / n, (len(shown) - repeated) / n, mixed / n)


def _counter_warning(episodes: list[list[str]]) -> str | None:
    """A number in ``state_text`` that grows across an episode: a move counter or clock, which
    makes every state unique so level 0 never repeats. The k-th number of each text is followed
    through the episode (texts with fewer numbers skipped, as long as most have it); a counter
    never falls and grows on at least half of the text changes (a clock may stand still on some
    steps), in most episodes long enough to tell."""
    counting = long_enough = 0
    for texts in episodes:
        numbers = [[int(n) for n in _DIGITS.findall(text)] for text in texts]
        changes = sum(a != b for a, b in itertools.pairwise(texts))
        if changes < 4:
            continue
        long_enough += 1
        for k in range(max(map(len, numbers), default=0)):
            series = [row[k] for row in numbers if len(row) > k]
            rises = sum(b > a for a, b in itertools.pairwise(series))
            if len(series) >= 0.75 * len(texts) and rises >= changes / 2 and series == sorted(series):
                counting += 1
                break
    if long_enough >= 2 and counting >= 0.6 * long_enough:
        return (
            f"state_text seems to carry a counter or clock: in {counting} of {long_enough} episodes a "
            "number in it never falls and grows on most steps, so no two steps share a state. Strip "
            "it (TextEnvSpec.state_text), or level-0 groups stay singletons"
        )
    return None


@dataclass
class _Checker:
    """What one health check plays with and what it collects."""

    env_id: str
    kwargs: Mapping[str, Any]
    group_size: int
    max_steps: int
    seed: int
    history_length: int
    rng: random.Random
    report: HealthReport
    probes: Sequence[str] = PROBES
    steps: list[_Step] = field(default_factory=list)
    texts: list[list[str]] = field(default_factory=list)
    paid_endings: int = 0
    """Episodes the env cut (its own turn limit) with a positive reward, under a default ``won``."""
    has_expert: bool = False

    def play_group(self, group: int) -> None:
        """Play one task group, replay its episodes, and record what the report says of them."""
        envs = [gym.make(self.env_id, **self.kwargs) for _ in range(self.group_size)]
        try:
            envs[0].reset(seed=self.seed + group)
            task_id = envs[0].unwrapped.task_id
            episodes = []
            for member, env in enumerate(envs):
                expert = member % 2 == 0

                def policy(info: Mapping[str, Any], env: gym.Env = env, expert: bool = expert) -> str:
                    return policy_command(env, info, self.rng, expert, self.probes)

                episodes.append(_play(env, self.seed + group, task_id, None, policy, self.max_steps))
                self._note_ending(env)
            self.has_expert = _expert(envs[0]) is not None
            problem = group_start_problem(group, task_id, [e[3] for e in episodes])
            if problem:
                self.report.problems.append(problem)
            window = self.kwargs.get("memory", "window") == "window"
            for member, (trace, sent, infos, reset_info) in enumerate(episodes):
                where = f"group {group} member {member}"
                self.report.problems += _contract_problems(
                    reset_info, RESET_KEYS, self.history_length, f"{where} reset", window
                )
                for t, info in enumerate(infos, start=1):
                    self.report.problems += _contract_problems(
                        info, STEP_KEYS, self.history_length, f"{where} step {t}", window
                    )
                self.texts.append([info.get("state_text", "") for info in [reset_info, *infos]])
                for info in [reset_info, *infos]:
                    if "fingerprints" in info:
                        self.steps.append(_Step(group, tuple(info["fingerprints"])))
                replay_env = gym.make(self.env_id, **self.kwargs)
                try:
                    replayed = _play(replay_env, self.seed + group, task_id, sent, None, self.max_steps)[0]
                finally:
                    replay_env.close()
                if replayed != trace:
                    first = next(
                        i for i, (a, b) in enumerate(zip(trace, replayed + [None] * len(trace))) if a != b
                    )
                    self.report.problems.append(
                        f"{where}: replay differs from step {first} on (not deterministic)"
                    )
                self.report.episodes += 1
                self.report.won += bool(infos and infos[-1].get("won"))
                self.report.steps += len(sent)
        finally:
            for env in envs:
                env.close()

    def _note_ending(self, env: gym.Env) -> None:
        base = env.unwrapped
        if isinstance(base, TextAdapter) and base.text_spec.won is None:
            answer = base.last_answer
            self.paid_endings += answer.truncated and answer.reward > 0

    def probe_seeds(self, count: int = SEED_PROBES) -> None:
        """Start ``count`` tasks from different seeds; warn where nothing tells them apart."""
        env = gym.make(self.env_id, **self.kwargs)
        try:
            starts = {}
            for n in range(count):
                _, info = env.reset(seed=self.seed + 10_000 + n)
                starts[getattr(env.unwrapped, "task_id", n)] = (info["task_key"], info["initial_fingerprint"])
            default_key = _default_task_key(env)
        finally:
            env.close()
        if len({initial for _, initial in starts.values()}) > 1:
            return
        if len(set(starts.values())) == 1:
            self.report.warnings.append(
                f"{count} resets with different seeds gave one task key and one first observation: "
                "the env may ignore its seed, and then a group's members play what they happen to draw"
            )
        elif default_key:
            self.report.warnings.append(
                f"{count} resets with different seeds (tasks {sorted(starts)[:4]}...) all start with the same "
                "observation, and the task key is the default (task id, task, first text), which cannot "
                "see what the seed hides: name the hidden state (TextEnvSpec.task_key, or "
                "TextEnv.task_identity) so the pool can verify that a group's members play one task"
            )

    def conclude(self, lengths: Sequence[int]) -> None:
        """The report's findings over all groups played."""
        report = self.report
        if lengths and max(lengths) <= 1 < self.max_steps:
            if self.has_expert:  # the env's own expert plays one step: single-turn by design
                report.warnings.append(
                    "every episode, the expert's included, is one step: stepwise grouping has nothing "
                    "to group beyond the episode (GRPO)"
                )
            else:
                report.problems.append(
                    "every episode ended at its first step, so no step after it was checked: the commands "
                    f"tried (admissible ones, or the probes {list(self.probes)}) end the episode. Give the "
                    "check commands that play on (--probe), or the env an expert_action"
                )
        if self.paid_endings:
            report.warnings.append(
                f"{self.paid_endings} episode(s) ran out of turns (the env marked them truncated) with a "
                "positive reward: the default won does not count them as wins. If the env says when it "
                "is won, name it (TextEnvSpec.won), so partial credit is never taken for a win"
            )


def check_env_health(
    env_id: str,
    env_kwargs: Mapping[str, Any] | None = None,
    *,
    groups: int = 3,
    group_size: int = 4,
    max_steps: int = 20,
    history_length: int = DEFAULT_HISTORY_LENGTH,
    seed: int = 0,
    probes: Sequence[str] = PROBES,
) -> HealthReport:
    """Play ``groups`` task groups of ``group_size`` episodes of ``env_id`` and report on them.

    Even members follow the env's ``expert_action`` where it has one (or the wrapped third-party
    env's), odd members pick random admissible commands (``probes`` on free-form envs), so states
    recur under different histories. Every episode is replayed in a fresh env, with the group's
    envs still open in the process.
    """
    kwargs = {"history_length": history_length, "response_format": "plain", **(env_kwargs or {})}
    report = HealthReport(env_id)
    checker = _Checker(
        env_id, kwargs, group_size, max_steps, seed, history_length, random.Random(seed), report, probes
    )
    gym.make(env_id, **kwargs).close()  # bad arguments fail here, as the caller's error
    for group in range(groups):
        try:
            checker.play_group(group)
        except Exception as error:  # noqa: BLE001  (an env that raises breaks the contract: report it)
            report.problems.append(f"group {group}: the env raised {type(error).__name__}: {error}")
    report.levels = [_level_health(checker.steps, k) for k in range(history_length + 1)]
    warning = _counter_warning(checker.texts)
    if warning:
        report.warnings.append(warning)
    checker.conclude([len(texts) - 1 for texts in checker.texts])
    try:
        checker.probe_seeds()
    except Exception as error:  # noqa: BLE001  (as in the groups: a raising env is a finding)
        report.problems.append(f"seed probe: the env raised {type(error).__name__}: {error}")
    return report
