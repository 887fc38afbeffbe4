"""HGPO-ScienceWorld-v0: one ScienceWorld task, its variations of a split as task ids.

ScienceWorld's list of valid actions is not exhaustive (the gold path of ``find-living-thing``
opens "door to greenhouse", which the list lacks), so by default the env is free-form: every
command is sent and the game's own verdict ("No known action matches that input.") marks an
invalid step. ``list_valid_actions=True`` shows the list in the prompt but still sends commands
off it. The prompt shows the game's answer; ``state_text`` is the room and the inventory (no move
counter). The game's step limit is lifted so ``max_steps`` truncates; a score of 100 wins, a
negative score is a failure that ends the episode.

ScienceWorld lists the objects of a room in an order that changes between loads of the same
variation (the world is the same), which would split equal states; the preset sorts each such
list (:func:`sorted_listings`) in what the prompt shows and in ``state_text``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from scienceworld import ScienceWorldEnv

from hgpo_env.textenv.adapter import Raw, StepResult, TextAdapter, TextEnvSpec

_NO_LIMIT = 1_000_000
_UNKNOWN = ("No known action matches that input.", "Unknown action")


class _Engine(ScienceWorldEnv):
    """ScienceWorld's engine. It lists the valid actions at every step and reset, and copies the
    list from Java one element per round trip (hundreds of them): an env that shows no list
    (``list_valid_actions=False``) skips that, and its raw ``info["valid"]`` is empty."""

    list_valid = True

    def get_valid_action_object_combinations(self) -> list[str]:
        return super().get_valid_action_object_combinations() if self.list_valid else []


def sorted_listings(text: str) -> str:
    """``text`` with each run of lines at the same tab indent sorted (ScienceWorld's object lists)."""
    lines: list[str] = []
    run: list[str] = []
    indent = 0
    for line in text.strip().split("\n"):
        depth = len(line) - len(line.lstrip("\t"))
        if depth and depth == indent:
            run.append(line)
            continue
        lines += sorted(run)
        run, indent = ([line], depth) if depth else ([], 0)
        if not depth:
            lines.append(line)
    return "\n".join(lines + sorted(run))


def _step(env: Any, action: str) -> StepResult:
    observation, reward, done, info = env.step(action)
    ended = bool(info["score"] >= 100 or info["score"] < 0)
    return observation, float(reward), ended, bool(done) and not ended, info


def _state(raw: Raw) -> str:
    return f"{sorted_listings(raw.info['look'])}\n{sorted_listings(raw.info['inv'])}"


SPEC = TextEnvSpec(
    family="scienceworld",
    intro=(
        "You are an agent in a simulated world of rooms, objects, living things and substances. "
        "You act by typing commands (look around, open door to kitchen, go to kitchen, pick up "
        "thermometer, focus on ..., wait, ...); the game describes what happens."
    ),
    task=lambda raw: raw.info["taskDesc"].removeprefix("Task Description:").strip(),
    observation=lambda raw: sorted_listings(raw.observation),
    state_text=_state,
    accepted=lambda raw: not raw.observation.strip().startswith(_UNKNOWN),
    won=lambda raw: raw.info["score"] >= 100,
    score=lambda raw: float(raw.info["score"]),
    task_type=lambda raw: raw.info["taskName"],
    step=_step,
    close=lambda env: env.close(),
)


class ScienceWorldEnv(TextAdapter):
    """``task``: a ScienceWorld task name (``find-living-thing``, ``boil``, ...); ``split``: whose
    variations the task ids index; ``simplification``: the engine's simplification string
    (default ``"easy"``)."""

    def __init__(
        self,
        task: str = "find-living-thing",
        *,
        split: Literal["train", "dev", "test"] = "train",
        simplification: str = "easy",
        list_valid_actions: bool = False,
        max_steps: int = 50,
        **options: Any,
    ) -> None:
        if split not in ("train", "dev", "test"):
            raise ValueError(f"split must be 'train', 'dev' or 'test', got {split!r}")
        engine = _Engine("", envStepLimit=_NO_LIMIT)
        engine.list_valid = list_valid_actions
        if task not in engine.get_task_names():
            engine.close()
            raise ValueError(f"task must be a ScienceWorld task name, got {task!r}")
        engine.load(task, 0, simplification)
        variations = {
            "train": engine.get_variations_train,
            "dev": engine.get_variations_dev,
            "test": engine.get_variations_test,
        }
        self.task_name = task
        self.simplification = simplification
        self.variations: list[int] = list(variations[split]())
        spec = dataclasses.replace(
            SPEC,
            start=self._start,
            num_tasks=len(self.variations),
            admissible=(lambda raw: sorted(raw.info["valid"])) if list_valid_actions else None,
            check_admissible=False,
        )
        super().__init__(engine, spec, max_steps=max_steps, **options)

    def _start(self, engine: Any, task_id: int) -> tuple[Any, dict[str, Any]]:
        engine.load(self.task_name, self.variations[task_id], self.simplification, generateGoldPath=True)
        return engine.reset()

    def task_identity(self) -> str:
        """The task, its variation (ScienceWorld's task instance) and the simplifications."""
        return f"{self.task_name} variation {self.variations[self.task_id]} [{self.simplification}]"

    def expert_action(self) -> str:
        """The next command of the task's gold path, for an episode that has followed it so far."""
        return self.env.get_gold_action_sequence()[self.elapsed_steps]
