"""HGPO-TextWorld-v0: TextWorld games (``.z8`` / ``.ulx`` files made by ``tw-make`` or GameMaker).

Task id ``i`` is the ``i``-th game file (sorted by path). TextWorld's feedback ends with a status
bar (``-= Kitchen =-0/3``: room, score, moves) and opens with an ASCII-art banner; neither reaches
the prompt or ``state_text``, which is the room description and the inventory (the moves count
would make every state unique). The prompt shows the game's answer to the last command; on reset,
the room. Commands off the admissible list are refused without reaching the game.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import textworld
import xxhash

from hgpo_env.textenv.adapter import Raw, StepResult, TextAdapter, TextEnvSpec

GAME_SUFFIXES = (".z8", ".ulx")
_STATUS_BAR = re.compile(r"\s*>?\s*-=[^\n]*=-\s*\d+/\d+\s*$")
_INFOS = textworld.EnvInfos(
    admissible_commands=True,
    description=True,
    inventory=True,
    objective=True,
    policy_commands=True,
    score=True,
    max_score=True,
    won=True,
    lost=True,
)


def find_games(games: str | Path | Sequence[str | Path]) -> list[Path]:
    """The game files of a folder (recursively), or the given files, sorted; an error when none."""
    if isinstance(games, (str, Path)) and Path(games).is_dir():
        found = sorted(path for path in Path(games).rglob("*") if path.suffix in GAME_SUFFIXES)
    else:
        found = sorted(Path(path) for path in ([games] if isinstance(games, (str, Path)) else games))
    missing = [str(path) for path in found if not path.is_file()]
    if missing:
        raise FileNotFoundError(f"TextWorld game files not found: {missing[:3]}")
    if not found:
        raise ValueError(f"no TextWorld game ({'/'.join(GAME_SUFFIXES)}) in {games}")
    return found


class _Games:
    """The TextWorld env of the current game; switching games starts the new file."""

    def __init__(self, paths: list[Path]) -> None:
        self.paths = paths
        self.game: Any = None
        self.path: Path | None = None
        self.digest = ""
        """Digest of the current game file: the game, its world and its quest."""
        self.points = 0

    def start(self, task_id: int) -> tuple[str, dict[str, Any]]:
        if self.paths[task_id] != self.path:
            self.close()
            self.path = self.paths[task_id]
            self.digest = xxhash.xxh3_128_hexdigest(self.path.read_bytes())
            self.game = textworld.start(str(self.path), request_infos=_INFOS)
        state = self.game.reset()
        self.points = state.score
        return state.feedback, self._info(state)

    def step(self, command: str) -> StepResult:
        state, points, done = self.game.step(command)
        reward, self.points = points - self.points, points
        return state.feedback, float(reward), bool(done), False, self._info(state)

    def close(self) -> None:
        if self.game is not None:
            self.game.close()
            self.game = None

    @staticmethod
    def _info(state: Any) -> dict[str, Any]:
        return {key: state[key] for key in _INFOS.basics}


def _shown(raw: Raw) -> str:
    if raw.command is None:
        return raw.info["description"].strip()
    return _STATUS_BAR.sub("", raw.observation).strip()


SPEC = TextEnvSpec(
    family="textworld",
    intro=(
        "You are an agent in a text adventure. You act by typing commands; the game describes "
        "what happens and where you are."
    ),
    task="objective",
    observation=_shown,
    state_text=lambda raw: f"{raw.info['description'].strip()}\n{raw.info['inventory'].strip()}",
    admissible="admissible_commands",
    won="won",
    score="score",
    start=lambda games, task_id: games.start(task_id),
    num_tasks=lambda games: len(games.paths),
    step=lambda games, command: games.step(command),
    task_key=lambda raw: raw.env.digest,
)


class TextWorldEnv(TextAdapter):
    """``games``: a folder of game files (searched recursively) or a list of files."""

    def __init__(
        self, games: str | Path | list[str] | list[Path] = (), *, max_steps: int = 50, **options: Any
    ):
        if not games:
            raise ValueError("HGPO-TextWorld-v0 needs games=: a folder of .z8/.ulx files or a list of them")
        super().__init__(_Games(find_games(games)), SPEC, max_steps=max_steps, **options)

    def expert_action(self) -> str:
        """The first command of TextWorld's walkthrough from the current state."""
        return self._raw.info["policy_commands"][0]
