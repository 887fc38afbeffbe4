"""HGPO-ALFWorld-v0: ALFWorld's text games on the TextWorld/PDDL engine, with a fixed game list.

Observations, admissible commands and the win condition are those of alfworld's
``AlfredTWEnv`` on the same game (see :mod:`.engine`), except that ``help`` is not offered
(the paper's setup). Choices this env makes, and why:

* ``state_text`` at reset is the room description alone: the opening text also carries the
  welcome banner and the task line, which the prompt shows anyway and which would make every
  task's first state unique. After a step it is the engine's answer, unchanged.
* ``check_admissible=True`` (default): a command outside the admissible list is invalid, spends
  a step and changes nothing, as the contract asks; the prompt lists the admissible commands,
  so anything else is a policy error worth a signal. With ``False``, or under
  ``protocol="verl-agent"`` (the papers' rules, :mod:`hgpo_env.contract.protocol`), commands reach the
  engine as in plain ALFWorld, which answers "Nothing happens." to unknown ones.
* Task ids index the split's games sorted by path, so a task group shares a game by sharing a
  seed or a ``task_id``, and an evaluation can play every game once
  (:func:`~.games.evaluation_task_ids`).
* ``observation_mode="graphgpo"`` appends GraphGPO's household notes (location, held item, moved
  items: :mod:`.tracker`) to every observation and ``state_text``, as that recipe's ALFWorld does;
  its graph nodes also hash the sorted admissible commands (``fingerprint_state="text_and_actions"``
  of the memory wrapper). The default ``"text"`` is ALFWorld's own text.
"""

from __future__ import annotations

import os
from typing import Any

from hgpo_env.contract.milestones import Progress
from hgpo_env.envs.alfworld.compiled import CompileCache, GameSource
from hgpo_env.envs.alfworld.engine import Engine
from hgpo_env.envs.alfworld.games import SPLITS, GameDataError, GameRecord, list_games
from hgpo_env.envs.alfworld.locate import locate
from hgpo_env.envs.alfworld.progress import MILESTONES, progress, target_object
from hgpo_env.envs.alfworld.tracker import HouseholdNotes
from hgpo_env.textenv.core import TextEnv
from hgpo_env.textenv.data import data_home

TASK_PREFIX = "Your task is to:"
HIDDEN_COMMANDS = frozenset({"help"})
OBSERVATION_MODES = ("text", "graphgpo")

_CACHES: dict[str | None, CompileCache] = {}


def compile_cache(disk: bool = True) -> CompileCache:
    """The process-wide cache of compiled games (on disk under the data home when ``disk``)."""
    directory = data_home() / "alfworld" / "compiled" if disk else None
    key = None if directory is None else str(directory)
    if key not in _CACHES:
        _CACHES[key] = CompileCache(directory)
    return _CACHES[key]


def split_opening(opening: str) -> tuple[str, str]:
    """(task, room description) from a game's opening text (banner, room, task line)."""
    paragraphs = [p.strip() for p in opening.split("\n\n") if p.strip()]
    tasks = [p for p in paragraphs if p.startswith(TASK_PREFIX)]
    if not tasks:
        raise ValueError(f"no '{TASK_PREFIX}' line in the opening text {opening!r}")
    room = [p for p in paragraphs if not p.startswith(TASK_PREFIX) and not p.startswith("-=")]
    return tasks[-1][len(TASK_PREFIX) :].strip(), "\n\n".join(room)


class ALFWorldEnv(TextEnv):
    """ALFWorld's household text games (``split`` of the data found by :func:`~.locate.locate`).

    ``info`` adds ``data_source`` (``"official"`` or ``"generated"``), ``game_file`` and
    ``game_id`` (the game file relative to the data root, the same on every machine: served envs
    send it instead of the path) to the contract's keys, and the milestones
    (:mod:`.progress`, read from the engine's own text).
    """

    milestones = MILESTONES

    env_family = "alfworld"
    prompt_intro = (
        "You are an agent in a simulated household (ALFWorld). You move between furniture and "
        "appliances, open and close them, take and put down objects, and heat, cool, clean or use "
        "them to finish a household task."
    )

    def __init__(
        self,
        *,
        split: str = "train",
        data_path: str | os.PathLike[str] | None = None,
        max_steps: int = 50,
        success_reward: float = 10.0,
        task_types: list[str] | tuple[str, ...] | None = None,
        check_admissible: bool = True,
        skip_unsolvable: bool = True,
        disk_cache: bool = True,
        render_mode: str | None = None,
        protocol: str = "strict",
        observation_mode: str = "text",
    ) -> None:
        if observation_mode not in OBSERVATION_MODES:
            raise ValueError(f"observation_mode must be one of {OBSERVATION_MODES}, got {observation_mode!r}")
        super().__init__(
            max_steps=max_steps, success_reward=success_reward, render_mode=render_mode, protocol=protocol
        )
        self.split = split
        self.splits = SPLITS  # what a server's Task API offers
        self.check_admissible = check_admissible and protocol == "strict"
        self._cache = compile_cache(disk_cache)
        self.data = locate(split, data_path, self._cache)
        self.games: tuple[GameRecord, ...] = tuple(
            list_games(self.data.path, split, task_types, skip_unsolvable=skip_unsolvable)
        )
        self._engine: Engine | None = None
        self._task = ""
        self._task_type: str | None = None
        self._state_text = ""
        self._problem = ""
        self._target = ""
        self._answer = ""
        """The engine's last text (the room description at the start), without GraphGPO's notes."""
        self.walkthrough: list[str] = []
        """The current game's recorded winning commands (empty when the file has none)."""
        self._plan_step: int | None = 0
        self.observation_mode = observation_mode
        self._notes = HouseholdNotes() if observation_mode == "graphgpo" else None

    # ----------------------------------------------------------------- TextEnv
    @property
    def num_tasks(self) -> int:
        return len(self.games)

    def _start_task(self, task_id: int) -> str:
        record = self.games[task_id]
        data = record.read()
        if not data["solvable"]:
            raise GameDataError(f'{record.path}: marked unsolvable ("solvable": false)')
        if self._engine is None:
            self._engine = Engine(self._cache)
        try:
            opening = self._engine.start(
                GameSource(data["pddl_domain"], data["grammar"], data["pddl_problem"])
            )
            self._task, self._state_text = split_opening(opening)
            self._answer = self._state_text
        except Exception as error:  # a broken grammar or PDDL problem: say which file
            raise GameDataError(
                f"{record.path}: cannot load the game ({type(error).__name__}: {error})"
            ) from error
        self._task_type = record.task_type
        self._target = target_object(record.path, self._task)
        self._problem = data["pddl_problem"]
        self.walkthrough = list(data.get("walkthrough") or [])
        self._plan_step = 0
        if self._notes is None:
            return opening
        self._notes = HouseholdNotes()
        self._state_text = self._annotate(self._state_text)
        return self._annotate(opening)

    def _apply(self, command: str) -> str:
        assert self._engine is not None
        if self._plan_step is not None:
            on_plan = self._plan_step < len(self.walkthrough) and command == self.walkthrough[self._plan_step]
            self._plan_step = self._plan_step + 1 if on_plan else None
        answer = self._answer = self._engine.step(command)
        if self._notes is not None:
            self._notes.update(command, answer)
            answer = self._annotate(answer)
        self._state_text = answer
        return answer

    def progress(self, reward: float, action_valid: bool) -> Progress:
        return progress(self._answer, self._target, reward, action_valid, start=self.elapsed_steps == 0)

    def task_identity(self) -> str:
        """The game's PDDL problem (its objects, their places and the goal) and the task text."""
        return f"{self._problem}\n{self._task}"

    def _annotate(self, text: str) -> str:
        assert self._notes is not None
        return f"{text} {self._notes.describe()}"

    def expert_action(self) -> str:
        """The next walkthrough command, while every accepted command so far followed it."""
        if self._plan_step is None or self._plan_step >= len(self.walkthrough):
            raise RuntimeError("no expert command: the episode left the game's walkthrough, or it has none")
        return self.walkthrough[self._plan_step]

    @property
    def admissible_actions(self) -> list[str]:
        if self._engine is None:
            return []
        return [command for command in self._engine.commands if command not in HIDDEN_COMMANDS]

    @property
    def task(self) -> str:
        return self._task

    @property
    def task_type(self) -> str | None:
        return self._task_type

    @property
    def won(self) -> bool:
        return self._engine is not None and self._engine.won

    @property
    def state_text(self) -> str:
        return self._state_text

    def _info(self, action_valid: bool) -> dict[str, Any]:
        info = super()._info(action_valid)
        path = self.games[self.task_id].path
        info.update(
            data_source=self.data.source,
            game_file=str(path),
            game_id=path.relative_to(self.data.path).as_posix(),
        )
        return info

    def close(self) -> None:
        if self._engine is not None:
            self._engine.close()
            self._engine = None
        super().close()
