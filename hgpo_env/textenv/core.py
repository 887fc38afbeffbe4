"""The base of every plain text environment: commands in, the environment's own text out.

Subclasses describe a world (``_start_task``, ``_apply`` and a few properties); this class does
what all of them share: seeding and task selection, step counting and truncation, rejecting
inadmissible commands without touching the state, rewards, and the ``info`` contract of
:mod:`hgpo_env.contract.info`.
"""

from __future__ import annotations

import abc
import string
from typing import Any, ClassVar, NamedTuple

import gymnasium as gym
import numpy as np

from hgpo_env.contract.fingerprint import canonical_text, task_key
from hgpo_env.contract.milestones import Progress, progress_info
from hgpo_env.contract.protocol import check_protocol


class TextSpace(gym.spaces.Text):
    """Any Unicode string up to ``max_length`` characters.

    Observations and commands are natural language, so membership only checks type and length;
    samples are drawn from printable ASCII, which is all a random agent needs.
    """

    def __init__(self, max_length: int) -> None:
        super().__init__(max_length=max_length, min_length=0, charset=string.printable)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and len(x) <= self.max_length


class Transition(NamedTuple):
    """What an accepted command did, for worlds that decide more than the next observation.

    ``reward`` is the step's reward as given; ``accepted`` False marks a command the world itself
    refused (the step is then invalid); ``truncated`` ends the episode for a reason other than its
    outcome (the world's own step limit).
    """

    observation: str
    reward: float
    accepted: bool = True
    truncated: bool = False


class TextEnv(gym.Env[str, str], abc.ABC):
    """A text game with admissible commands, a task and a success condition.

    ``reset(seed=..., options={"task_id": i})`` starts task ``i``; without a ``task_id`` the task
    is drawn from ``np_random``, so the same seed gives the same task (seed ``s`` is not task
    ``s``). ``info["task_id"]`` names the task played, so it can be replayed. ``step(command)`` spends a
    step whatever the command; one that is empty, or not admissible where
    :attr:`check_admissible` is set, leaves the state and observation unchanged and reports
    ``action_valid=False``. ``protocol`` names the response rules (:mod:`hgpo_env.contract.protocol`)
    that :class:`~hgpo_env.prompting.actions.ParseResponse` applies on top.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi", "human"], "render_fps": 4}

    env_family: ClassVar[str]
    """Short name of the environment family; salts the fingerprints."""
    prompt_intro: ClassVar[str]
    """First paragraph of the LLM prompt: who the agent is and what the world is like."""
    check_admissible: ClassVar[bool] = True
    """Whether commands outside ``admissible_actions`` are rejected before reaching the world."""
    free_form: ClassVar[bool] = False
    """True for worlds without a list of admissible commands: prompts then ask for any command."""
    milestones: ClassVar[tuple[str, ...]] = ()
    """Names of the five milestone flags :meth:`progress` reports (:mod:`hgpo_env.contract.milestones`);
    empty for an env without milestones."""

    def __init__(
        self,
        *,
        max_steps: int,
        success_reward: float = 10.0,
        render_mode: str | None = None,
        max_text_length: int = 65536,
        protocol: str = "strict",
    ) -> None:
        check_protocol(protocol, self.env_family)
        if max_steps < 1:
            raise ValueError(f"max_steps must be at least 1, got {max_steps}")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(
                f"render_mode must be one of {self.metadata['render_modes']}, got {render_mode!r}"
            )
        self.protocol = protocol
        self.max_steps = max_steps
        self.success_reward = float(success_reward)
        self.render_mode = render_mode
        self.observation_space = TextSpace(max_text_length)
        self.action_space = TextSpace(max_text_length)
        self.observation = ""
        self.elapsed_steps = 0
        self._episode_over = True
        self._started = False
        self._keyed_actions: list[str] | None = None
        """The admissible list :attr:`_admissible_by_key` was made from."""
        self._admissible_by_key: dict[str, str] = {}
        self._task_key = 0

    # ----------------------------------------------------------------- for subclasses
    @property
    @abc.abstractmethod
    def num_tasks(self) -> int | None:
        """How many tasks ``task_id`` can select, or None when tasks are generated without end."""

    @abc.abstractmethod
    def _start_task(self, task_id: int) -> str:
        """Set up task ``task_id`` and return the first observation."""

    @abc.abstractmethod
    def _apply(self, command: str) -> str | Transition:
        """Execute an accepted command; return the next observation (the reward is then
        ``success_reward`` on the winning step), or a :class:`Transition` that says more."""

    @property
    @abc.abstractmethod
    def admissible_actions(self) -> list[str]:
        """Commands the world accepts now, in a stable order."""

    @property
    @abc.abstractmethod
    def task(self) -> str:
        """The current task in words."""

    @property
    @abc.abstractmethod
    def won(self) -> bool:
        """Whether the current task is solved."""

    @property
    def task_type(self) -> str | None:
        return None

    @property
    def score(self) -> float:
        """Env-native score; by default 1.0 when won."""
        return 1.0 if self.won else 0.0

    @property
    def done(self) -> bool:
        """Whether the episode has ended inside the world (by default: when won)."""
        return self.won

    @property
    def state_text(self) -> str:
        """Text that identifies the state for grouping; by default the observation."""
        return self.observation

    def progress(self, reward: float, action_valid: bool) -> Progress | None:
        """The current observation's place and milestone flags (:mod:`hgpo_env.contract.milestones`), given
        the reward and validity of the step that produced it; None where the env has none."""
        return None

    def task_identity(self) -> str | bytes:
        """What identifies the task just started, hidden configuration included; hashed into
        ``info["task_key"]``. By default the task id, the task text and the first ``state_text``:
        it tells apart members that started different task ids (a dropped seed), but not an env
        whose hidden state the seed did not set. Override where the env knows its hidden state."""
        return f"task id {self.task_id}\n{self.task}\n{self.state_text}"

    def _sample_task_id(self) -> int:
        """Task drawn when ``reset`` names none; override to keep held-out tasks out."""
        if self.num_tasks is None:
            raise NotImplementedError("an env with unbounded tasks must override _sample_task_id")
        return int(self.np_random.integers(self.num_tasks))

    # ----------------------------------------------------------------- gymnasium API
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        task_id = (options or {}).get("task_id")
        if task_id is None:
            task_id = self._sample_task_id()
        elif isinstance(task_id, bool) or not isinstance(task_id, (int, np.integer)) or task_id < 0:
            raise ValueError(f"options['task_id'] must be a non-negative int, got {task_id!r}")
        elif self.num_tasks is not None and task_id >= self.num_tasks:
            raise ValueError(f"task_id {task_id} out of range: this env has {self.num_tasks} tasks")
        self.task_id = int(task_id)
        self.elapsed_steps = 0
        self.observation = self._start_task(self.task_id)
        self._task_key = task_key(self.env_family, self.task_identity())
        self._started = True
        self._episode_over = False
        return self.observation, self._reported(0.0, action_valid=True)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if not self._started:
            raise RuntimeError("call reset() before step()")
        if self._episode_over:
            raise RuntimeError("the episode is over (terminated or truncated): call reset()")
        if not isinstance(action, str):
            raise TypeError(f"a command is a str, got {type(action).__name__}")
        self.elapsed_steps += 1
        command = self._accept(action)
        if command is None:
            outcome = Transition(self.observation, 0.0, accepted=False)
        else:
            was_won = self.won
            outcome = self._apply(command)
            if isinstance(outcome, str):
                outcome = Transition(outcome, self.success_reward if self.won and not was_won else 0.0)
        self.observation = outcome.observation
        terminated = self.done
        truncated = not terminated and (outcome.truncated or self.elapsed_steps >= self.max_steps)
        self._episode_over = terminated or truncated
        info = self._reported(outcome.reward, outcome.accepted)
        return self.observation, outcome.reward, terminated, truncated, info

    def render(self) -> str | None:
        text = f"Task: {self.task}\n{self.observation}" if self._started else ""
        if self.render_mode == "human":
            print(text)
            return None
        return text

    # ----------------------------------------------------------------- helpers
    def _accept(self, action: str) -> str | None:
        """The command to execute, or None when the step is invalid."""
        command = canonical_text(action)
        if not command:
            return None
        if not self.check_admissible:
            return command
        admissible = self.admissible_actions
        if admissible != self._keyed_actions:  # made again only when the list changes
            self._keyed_actions = list(admissible)
            self._admissible_by_key = {canonical_text(a).casefold(): a for a in admissible}
        return self._admissible_by_key.get(command.casefold())

    def _reported(self, reward: float, action_valid: bool) -> dict[str, Any]:
        """The step's (or reset's) ``info``: :meth:`_info`, and the milestones where the env has them."""
        info = self._info(action_valid)
        progress = self.progress(reward, action_valid)
        if progress is not None:
            info.update(progress_info(progress, self.elapsed_steps))
        return info

    def _info(self, action_valid: bool) -> dict[str, Any]:
        """The :class:`~hgpo_env.contract.info.EnvInfo` keys, and ``task_id``."""
        return {
            "admissible_actions": list(self.admissible_actions),
            "won": self.won,
            "score": float(self.score),
            "task": self.task,
            "task_type": self.task_type,
            "action_valid": action_valid,
            "state_text": self.state_text,
            "task_key": self._task_key,
            "task_id": self.task_id,
        }
