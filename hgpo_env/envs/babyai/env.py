"""HGPO-BabyAI-v0: a BabyAI level (minigrid) with a text view and text commands.

The task is the level's mission; the observation and ``state_text`` are the egocentric view in
words (:mod:`hgpo_env.envs.babyai.text`); the seven minigrid actions are commands. A task id is
the level's seed; ``split="eval"`` draws ids below :data:`HELD_OUT_TASKS`, ``"train"`` above.
"""

from __future__ import annotations

from typing import Any, Literal

import gymnasium as gym
import minigrid  # noqa: F401  (registers the BabyAI-* ids)

from hgpo_env.envs.babyai.text import describe_view
from hgpo_env.textenv.adapter import Raw, TextAdapter, TextEnvSpec, split_task_ids

COMMANDS = ("turn left", "turn right", "go forward", "pick up", "drop", "toggle", "done")
"""Commands in minigrid's action order (``Actions.left`` = 0 ... ``Actions.done`` = 6)."""
HELD_OUT_TASKS = 10_000


def _view(raw: Raw) -> str:
    return describe_view(raw.observation["image"], raw.env.unwrapped.carrying)


def _layout(raw: Raw) -> bytes:
    """The whole grid (every object, colour and door state), the agent's pose and the mission."""
    world = raw.env.unwrapped
    pose = f"{tuple(int(x) for x in world.agent_pos)} {int(world.agent_dir)} {world.mission}"
    return world.grid.encode().tobytes() + pose.encode()


SPEC = TextEnvSpec(
    family="babyai",
    intro=(
        "You are an agent in a grid world of rooms. You see a few cells ahead and to your sides, "
        "and can turn, go forward, pick up or drop the object in front of you, and toggle (open or "
        "close) the door in front of you."
    ),
    task=lambda raw: raw.observation["mission"],
    observation=_view,
    admissible=lambda raw: list(COMMANDS),
    to_env_action=COMMANDS.index,
    task_key=_layout,
)


class BabyAIEnv(TextAdapter):
    """``level``: any registered ``BabyAI-*`` id (default ``BabyAI-GoToLocal-v0``)."""

    def __init__(
        self,
        level: str = "BabyAI-GoToLocal-v0",
        *,
        split: Literal["train", "eval"] = "train",
        max_steps: int = 64,
        **options: Any,
    ) -> None:
        if not level.startswith("BabyAI-"):
            raise ValueError(f"level must be a BabyAI-* id, got {level!r}")
        super().__init__(
            gym.make(level),
            SPEC,
            max_steps=max_steps,
            task_ids=split_task_ids(split, HELD_OUT_TASKS),
            **options,
        )
