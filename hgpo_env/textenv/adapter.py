"""Any text environment on the ``info`` contract: state what differs, the adapter does the rest.

A :class:`TextEnvSpec` declares how a third-party env (Gymnasium or not) maps onto
:mod:`hgpo_env.contract.info`: where its task, admissible commands, win and score are, what the prompt
shows and what identifies a state, how a task id selects a task, its step signature and how a
command becomes its action. :class:`TextAdapter` applies a spec to an env object; from there the
env is an ordinary :class:`~hgpo_env.textenv.core.TextEnv`, so :func:`~hgpo_env.make_agent_env`, the
pool, the trainer and the integrations take it like the built-in envs.

A *source* names where a value is read: an ``info`` key (a str), a callable taking the
:class:`Raw` view of the env's last answer, or None for the default the field documents.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from hgpo_env.contract.milestones import Progress, check_names
from hgpo_env.textenv.core import TextEnv, Transition
from hgpo_env.textenv.rng import IsolatedRNG

UNBOUNDED_TASKS = 2**31
"""Task ids drawn when an env generates tasks without end (ids are then seeds)."""


def split_task_ids(split: str, held_out: int) -> range:
    """Task ids a split draws from when ids are seeds: ``"eval"`` below ``held_out``, ``"train"`` from it."""
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    return range(held_out) if split == "eval" else range(held_out, UNBOUNDED_TASKS)


class Raw(NamedTuple):
    """The third-party env's last answer, as the spec's callables see it."""

    env: Any
    """The wrapped env object."""
    observation: Any
    """Its observation as returned (a str, a dict, a list of messages...)."""
    info: dict[str, Any]
    """Its info dict (empty where it returns none)."""
    reward: float = 0.0
    """Its reward for the last step (0 after a reset)."""
    command: str | None = None
    """The command just sent (None after a reset)."""
    terminated: bool = False
    """The env ended the episode with this answer."""
    truncated: bool = False
    """The env cut the episode with this answer (its own step or turn limit)."""


Source = str | Callable[[Raw], Any] | None
StepResult = tuple[Any, float, bool, bool, dict[str, Any]]
StepAPI = Literal["gymnasium", "gym"] | Callable[[Any, Any], StepResult]


def _read(source: Source, raw: Raw) -> Any:
    if isinstance(source, str):
        if source not in raw.info:
            raise KeyError(f"the env's info has no {source!r} (keys: {sorted(raw.info)})")
        return raw.info[source]
    assert source is not None
    return source(raw)


def gymnasium_start(env: Any, task_id: int) -> tuple[Any, dict[str, Any]]:
    """Default task selection: the task id is the seed of a Gymnasium-style ``reset``."""
    answer = env.reset(seed=task_id)
    return answer if isinstance(answer, tuple) else (answer, {})


def _step_gymnasium(env: Any, action: Any) -> StepResult:
    return env.step(action)


def _step_gym(env: Any, action: Any) -> StepResult:
    """The old 4-tuple: a ``done`` that Gym's TimeLimit marked is a truncation."""
    observation, reward, done, info = env.step(action)
    truncated = bool(done and info.get("TimeLimit.truncated", False))
    return observation, reward, bool(done) and not truncated, truncated, info


STEP_APIS: dict[str, Callable[[Any, Any], StepResult]] = {"gymnasium": _step_gymnasium, "gym": _step_gym}


@dataclass(frozen=True)
class TextEnvSpec:
    """How one kind of text env meets the ``info`` contract; only ``family`` and ``intro`` are required."""

    family: str
    """Names the env family; salts the fingerprints, so two families never share a key."""
    intro: str
    """First paragraph of every prompt: who the agent is and what the world is like."""
    task: Source = None
    """The task in words. None: the first observation (as the prompt shows it) is the task."""
    observation: Callable[[Raw], str] | None = None
    """What the prompt shows of an observation. None: the observation itself, which must be a str."""
    state_text: Callable[[Raw], str] | None = None
    """Text that identifies the state, for fingerprints: no counters, clocks or banners, or level 0
    never repeats. None: the shown observation."""
    admissible: Source = None
    """Commands the env accepts now (a list of str). None: a free-form env; prompts list none."""
    check_admissible: bool = True
    """With ``admissible``: refuse commands off the list without sending them. False sends every
    command (for lists that are not exhaustive) and leaves the verdict to ``accepted``."""
    accepted: Source = None
    """The env's own verdict on the command just sent (bool). None: every sent command counts."""
    won: Source = None
    """Whether the task is solved (bool). None: a step that terminates with a positive reward and
    that the env does not also mark truncated (running out of turns is no win, whatever it pays);
    name the env's own verdict where it has one."""
    score: Source = None
    """Env-native score (float). None: 1.0 when won, else 0.0."""
    task_type: Source = None
    """Family of the task (str). None: the env has none."""
    task_key: Source = None
    """What identifies the task and its hidden initial configuration, read after the start (a str,
    bytes, or any value with a stable ``repr``), hashed into ``info["task_key"]``. None: the task
    id, the task text and the first state text, which cannot see hidden state the seed sets: name
    it here (``lambda raw: raw.env.combination``) so a group whose members got different hidden
    states is refused."""
    start: Callable[[Any, int], tuple[Any, dict[str, Any]]] = gymnasium_start
    """``start(env, task_id) -> (observation, info)``: begin task ``task_id``."""
    num_tasks: int | Callable[[Any], int | None] | None = None
    """How many task ids there are; None: unbounded (ids are seeds, drawn below 2**31)."""
    splits: tuple[str, ...] = ()
    """The ``split`` values the env's ``make_env`` takes, which a server's Task API offers (it
    refuses others without building an env); none declared: the Task API serves no split."""
    step: StepAPI = "gymnasium"
    """The step signature: ``"gymnasium"`` (5-tuple), ``"gym"`` (old 4-tuple), or a callable
    ``(env, action) -> (obs, reward, terminated, truncated, info)`` for anything else."""
    to_env_action: Callable[[str], Any] | None = None
    """Command -> the env's action (e.g. an int); may raise ValueError for a command it lacks.
    None: the command itself."""
    close: Callable[[Any], None] | None = None
    """How to release the env. None: its ``close()`` if it has one."""
    progress: Callable[[Raw], tuple[str, Sequence[bool]]] | None = None
    """The env's milestones (:mod:`hgpo_env.contract.milestones`), read from each answer: ``(place, flags)``,
    the kind of place the answer shows (no counters: equal places must compare equal) and four
    flags, three kinds of progress then success, named by ``milestones``; the adapter adds the
    fifth, an invalid step. None: the env reports no milestones."""
    milestones: tuple[str, ...] = ()
    """The names of ``progress``'s four flags."""


class TextAdapter(TextEnv):
    """A third-party text env as a :class:`~hgpo_env.textenv.core.TextEnv`, as ``spec`` declares.

    Beyond the contract, ``info["env_info"]`` holds the env's own info from the answer to this
    call (empty when the command never reached the env).
    ``reward="success"`` gives ``success_reward`` on the winning step (the papers' rewards);
    ``"native"`` passes the env's rewards through. The env's own truncation stays apart from
    termination. ``isolate_rng`` gives the env private ``random`` / ``numpy.random`` streams,
    seeded by the task id on every reset (:mod:`hgpo_env.textenv.rng`), so envs sharing a process do not
    disturb each other and a group's members play one game.

    Args:
        env: the env object, already built.
        spec: how it meets the contract.
        max_steps: episode step limit (truncation).
        success_reward: the winning step's reward with ``reward="success"``.
        reward: ``"success"`` or ``"native"``.
        isolate_rng: run the env on private random streams.
        task_ids: the ids ``reset`` draws from when given none (a split); default all.
        protocol: response rules (:mod:`hgpo_env.contract.protocol`).
    """

    def __init__(
        self,
        env: Any,
        spec: TextEnvSpec,
        *,
        max_steps: int = 50,
        success_reward: float = 10.0,
        reward: Literal["success", "native"] = "success",
        isolate_rng: bool = True,
        task_ids: range | None = None,
        protocol: str = "strict",
        render_mode: str | None = None,
        max_text_length: int = 65536,
    ) -> None:
        if not isinstance(spec, TextEnvSpec):
            raise TypeError(f"spec must be a TextEnvSpec, got {type(spec).__name__}")
        if reward not in ("success", "native"):
            raise ValueError(f"reward must be 'success' or 'native', got {reward!r}")
        if not callable(spec.step) and spec.step not in STEP_APIS:
            raise ValueError(f"spec.step must be one of {tuple(STEP_APIS)} or a callable, got {spec.step!r}")
        self.env_family = spec.family
        self.prompt_intro = spec.intro
        self.free_form = spec.admissible is None
        if spec.progress is not None:
            self.milestones = check_names((*spec.milestones, "invalid"))
        self.check_admissible = spec.check_admissible and not self.free_form
        super().__init__(
            max_steps=max_steps,
            success_reward=success_reward,
            render_mode=render_mode,
            max_text_length=max_text_length,
            protocol=protocol,
        )
        self.env = env
        self.text_spec = spec
        self.splits = spec.splits
        self.reward_mode = reward
        self._step_env = spec.step if callable(spec.step) else STEP_APIS[spec.step]
        self._rng = IsolatedRNG() if isolate_rng else None
        self.task_ids = task_ids
        self._raw = Raw(env, "", {})
        self._unreported: dict[str, Any] = {}
        self._task = ""
        self._state_text = ""
        self._admissible: list[str] = []
        self._won = False
        self._terminated = False

    # ----------------------------------------------------------------- TextEnv hooks
    @property
    def num_tasks(self) -> int | None:
        count = self.text_spec.num_tasks
        return count(self.env) if callable(count) else count

    def _sample_task_id(self) -> int:
        ids = self.task_ids if self.task_ids is not None else range(self.num_tasks or UNBOUNDED_TASKS)
        return ids[int(self.np_random.integers(len(ids)))]

    def _start_task(self, task_id: int) -> str:
        if self._rng is not None:
            self._rng.seed(task_id)
        observation, info = self._call(self.text_spec.start, self.env, task_id)
        self._won = self._terminated = False
        shown = self._absorb(Raw(self.env, observation, dict(info or {})), accepted=True)
        self._task = shown if self.text_spec.task is None else str(_read(self.text_spec.task, self._raw))
        return shown

    def _apply(self, command: str) -> Transition:
        try:
            action = (
                command if self.text_spec.to_env_action is None else self.text_spec.to_env_action(command)
            )
        except ValueError:
            return Transition(self.observation, 0.0, accepted=False)
        observation, reward, terminated, truncated, info = self._call(self._step_env, self.env, action)
        raw = Raw(
            self.env, observation, dict(info or {}), float(reward), command, bool(terminated), bool(truncated)
        )
        accepted = True if self.text_spec.accepted is None else bool(_read(self.text_spec.accepted, raw))
        was_won = self._won
        self._terminated = raw.terminated
        if self.text_spec.won is None:
            self._won = self._won or (raw.terminated and not raw.truncated and raw.reward > 0)
        shown = self._absorb(raw, accepted)
        if self.reward_mode == "native":
            reward = raw.reward
        else:
            reward = self.success_reward if self._won and not was_won else 0.0
        return Transition(shown, reward, accepted, bool(truncated))

    @property
    def last_answer(self) -> Raw:
        """The env's last answer, as the spec's callables saw it."""
        return self._raw

    @property
    def admissible_actions(self) -> list[str]:
        return self._admissible

    @property
    def task(self) -> str:
        return self._task

    @property
    def task_type(self) -> str | None:
        return None if self.text_spec.task_type is None else _read(self.text_spec.task_type, self._raw)

    def progress(self, reward: float, action_valid: bool) -> Progress | None:
        if self.text_spec.progress is None:
            return None
        place, flags = self.text_spec.progress(self._raw)
        if len(flags) != len(self.milestones) - 1:
            raise ValueError(
                f"{self.env_family}: TextEnvSpec.progress must return {len(self.milestones) - 1} flags "
                f"({self.milestones[:-1]}), got {len(flags)}"
            )
        return Progress(str(place), (*map(bool, flags), not action_valid))

    def task_identity(self) -> str | bytes:
        if self.text_spec.task_key is None:
            return super().task_identity()
        identity = _read(self.text_spec.task_key, self._raw)
        return identity if isinstance(identity, (str, bytes)) else repr(identity)

    @property
    def won(self) -> bool:
        return self._won

    @property
    def score(self) -> float:
        if self.text_spec.score is None:
            return 1.0 if self._won else 0.0
        return float(_read(self.text_spec.score, self._raw))

    @property
    def done(self) -> bool:
        return self._terminated or self._won

    @property
    def state_text(self) -> str:
        return self._state_text

    def _info(self, action_valid: bool) -> dict[str, Any]:
        info = super()._info(action_valid)
        info["env_info"], self._unreported = self._unreported, {}
        return info

    def close(self) -> None:
        if self.text_spec.close is not None:
            self.text_spec.close(self.env)
        elif callable(getattr(self.env, "close", None)):
            self.env.close()
        super().close()

    # ----------------------------------------------------------------- helpers
    def _call(self, function: Callable[..., Any], *args: Any) -> Any:
        if self._rng is None:
            return function(*args)
        return self._rng.call(function, *args)

    def _absorb(self, raw: Raw, accepted: bool) -> str:
        """Take in the env's answer; return what the prompt shows. A refused command leaves the
        state text as it was (the contract: an invalid step changes nothing)."""
        self._raw = raw
        self._unreported = raw.info
        spec = self.text_spec
        if spec.observation is not None:
            shown = spec.observation(raw)
        elif isinstance(raw.observation, str):
            shown = raw.observation
        else:
            raise TypeError(
                f"{type(self.env).__name__} returned a {type(raw.observation).__name__} observation: "
                "give the TextEnvSpec an observation= callable that turns it into text"
            )
        if accepted or raw.command is None:
            self._state_text = shown if spec.state_text is None else spec.state_text(raw)
        if spec.won is not None:
            self._won = self._won or bool(_read(spec.won, raw))
        if spec.admissible is not None:
            self._admissible = [str(command) for command in _read(spec.admissible, raw)]
        return shown


def adapt(make_env: Callable[..., Any], spec: TextEnvSpec, **kwargs: Any) -> TextAdapter:
    """Build an env with ``make_env`` and adapt it: the adapter's own options in ``kwargs`` go to
    :class:`TextAdapter`, the rest to ``make_env``."""
    options = {key: kwargs.pop(key) for key in list(kwargs) if key in _ADAPTER_OPTIONS}
    return TextAdapter(make_env(**kwargs), spec, **options)


_ADAPTER_OPTIONS = frozenset(inspect.signature(TextAdapter.__init__).parameters) - {"self", "env", "spec"}
