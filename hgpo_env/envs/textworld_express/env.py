"""HGPO-TextWorldExpress-v0: a TextWorld-Express game (cookingworld, twc, coin, mapreader, ...).

The game runs in TextWorld-Express's Java engine. Task id ``i`` is the ``i``-th seed of the
split's fold (``train``, ``dev``, ``test``; the engine lists them). The prompt shows the game's
answer to the last command and the room; ``state_text`` is the room and the inventory, which
identify the state (the answer text would split states by how they were reached). The game's own
step limit is lifted so the adapter's ``max_steps`` decides truncation; a game that ends in
failure (``taskfailure``) terminates without a win.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from textworld_express import TextWorldExpressEnv as _Engine

from hgpo_env.textenv.adapter import Raw, StepResult, TextAdapter, TextEnvSpec

GAMES = ("cookingworld", "twc", "coin", "mapreader", "arithmetic", "sorting", "simonsays", "peckingorder")
_NO_LIMIT = 1_000_000


def _step(env: Any, action: str) -> StepResult:
    observation, reward, done, info = env.step(action)
    ended = bool(info["tasksuccess"] or info["taskfailure"])
    return observation, reward, ended, bool(done) and not ended, info


def _shown(raw: Raw) -> str:
    if raw.command is None or raw.command == "look around":
        return raw.info["look"].strip()
    return f"{raw.observation.strip()}\n{raw.info['look'].strip()}"


SPEC = TextEnvSpec(
    family="textworld-express",
    intro=(
        "You are an agent in a text game. You act by typing commands; the game describes what "
        "happens and where you are."
    ),
    task="taskDescription",
    observation=_shown,
    state_text=lambda raw: f"{raw.info['look'].strip()}\n{raw.info['inventory'].strip()}",
    admissible=lambda raw: sorted(raw.info["validActions"]),
    accepted=lambda raw: not raw.observation.startswith("Unknown action"),
    won="tasksuccess",
    score="score",
    step=_step,
    close=lambda env: env.close(),
)


class TextWorldExpressEnv(TextAdapter):
    """``game``: one of :data:`GAMES`; ``game_params``: the engine's parameter string (e.g.
    ``"numLocations=3,includeDoors=0"``; empty for the game's defaults); ``split``: the seed fold."""

    def __init__(
        self,
        game: str = "coin",
        *,
        game_params: str = "",
        split: Literal["train", "dev", "test"] = "train",
        max_steps: int = 50,
        **options: Any,
    ) -> None:
        if game not in GAMES:
            raise ValueError(f"game must be one of {GAMES}, got {game!r}")
        if split not in ("train", "dev", "test"):
            raise ValueError(f"split must be 'train', 'dev' or 'test', got {split!r}")
        engine = _Engine(envStepLimit=_NO_LIMIT)
        engine.load(gameName=game, gameParams=game_params)
        seeds = {
            "train": engine.getValidSeedsTrain,
            "dev": engine.getValidSeedsDev,
            "test": engine.getValidSeedsTest,
        }
        self.split = split
        self.game, self.game_params = game, game_params
        self.seeds: list[int] = list(seeds[split]())
        spec = dataclasses.replace(SPEC, start=self._start, num_tasks=len(self.seeds))
        super().__init__(engine, spec, max_steps=max_steps, **options)

    def _start(self, engine: Any, task_id: int) -> tuple[Any, dict[str, Any]]:
        return engine.reset(seed=self.seeds[task_id], gameFold=self.split, generateGoldPath=True)

    def task_identity(self) -> str:
        """The game, its parameters, fold and seed: all the engine generates a task from."""
        return f"{self.game} [{self.game_params}] {self.split} seed {self.seeds[self.task_id]}"

    def expert_action(self) -> str:
        """The next command of the engine's gold path, for an episode that has followed it so far
        (demos, tests, the health check)."""
        return self.env.getGoldActionSequence()[self.elapsed_steps]
