"""Finding ALFWorld games on disk: splits, a stable game list, and loading errors that say what is wrong.

The official layout is ``<root>/json_2.1.1/<split>/<task folder>/<trial>/game.tw-pddl`` (the
``json_2.1.1`` level may be absent), with an optional ``traj_data.json`` beside each game. A
split's games are listed the way alfworld's ``AlfredTWEnv`` selects them (the six task types,
no ``movable``/``Sliced`` trials, no game marked unsolvable) and sorted by path, so index ``i``
names the same game on every machine. Scanning reads every game once; the result is kept per
process and in a small index file under :func:`hgpo_env.textenv.data.data_home`.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from hgpo_env.textenv.data import data_home

TASK_TYPES = (
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
)
SPLITS = ("train", "valid_seen", "valid_unseen")
GAME_FILE = "game.tw-pddl"
TRAJ_FILE = "traj_data.json"
_GAME_KEYS = ("pddl_domain", "grammar", "pddl_problem")
_INDEX_VERSION = 1


class GameDataError(ValueError):
    """ALFWorld data that cannot be used; the message names the file and the problem."""


@dataclass(frozen=True)
class GameRecord:
    """One playable game of a split."""

    path: Path
    task_type: str | None

    def read(self) -> dict:
        """The game file's JSON, checked for the keys the engine needs."""
        return read_game(self.path)


def read_game(path: Path) -> dict:
    """Parse a ``game.tw-pddl`` file; raises :class:`GameDataError` naming it when unusable."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except FileNotFoundError:
        raise GameDataError(f"{path}: game file not found") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise GameDataError(f"{path}: not valid JSON ({error})") from None
    if not isinstance(data, dict):
        raise GameDataError(f"{path}: expected a JSON object, got {type(data).__name__}")
    missing = [key for key in (*_GAME_KEYS, "solvable") if key not in data]
    if missing:
        raise GameDataError(f"{path}: missing key(s) {', '.join(missing)}")
    if not all(isinstance(data[key], str) for key in _GAME_KEYS):
        raise GameDataError(f"{path}: {', '.join(_GAME_KEYS)} must be strings")
    return data


def split_dir(root: Path, split: str) -> Path:
    """The folder of ``split`` under a data root (with or without the ``json_2.1.1`` level)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    root = Path(root).expanduser()
    candidates = (root / "json_2.1.1" / split, root / split)
    for candidate in candidates:
        if candidate.is_dir():
            return candidate
    hint = ""
    for archive in (root / f"{split}.tgz", root / f"{split}.tar.gz", root / f"{split}.zip"):
        if archive.is_file():
            hint = f"; found {archive}: unpack it there first"
    looked = " or ".join(str(c) for c in candidates)
    raise GameDataError(f"{root}: missing split '{split}' (looked for {looked}){hint}")


def _task_type(game_dir: Path) -> str | None:
    """The type from ``traj_data.json`` when present, else from the task folder's name."""
    traj = game_dir / TRAJ_FILE
    if traj.is_file():
        try:
            with open(traj, encoding="utf-8") as handle:
                task_type = json.load(handle).get("task_type")
        except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as error:
            raise GameDataError(f"{traj}: not a valid trajectory JSON object ({error})") from None
        if task_type is not None:
            return str(task_type)
    prefix = game_dir.parent.name.split("-", 1)[0]
    return prefix if prefix in TASK_TYPES else None


def _game_files(directory: Path) -> list[Path]:
    relative = sorted(path.relative_to(directory).as_posix() for path in directory.rglob(GAME_FILE))
    return [directory / r for r in relative if "movable" not in r and "Sliced" not in r]


def _signature(directory: Path, files: Sequence[Path]) -> str:
    """Changes when any game file is added, removed or rewritten."""
    digest = hashlib.sha256(f"{_INDEX_VERSION}|{directory.resolve()}".encode())
    for path in files:
        stat = path.stat()
        digest.update(
            f"{path.relative_to(directory).as_posix()}|{stat.st_size}|{stat.st_mtime_ns}\n".encode()
        )
    return digest.hexdigest()


def _scan(directory: Path, files: Sequence[Path]) -> list[tuple[str, str | None, bool]]:
    entries = []
    for path in files:
        solvable = read_game(path)["solvable"]
        entries.append((path.relative_to(directory).as_posix(), _task_type(path.parent), bool(solvable)))
    return entries


_SCANNED: dict[str, list[tuple[str, str | None, bool]]] = {}


def _entries(directory: Path) -> list[tuple[str, str | None, bool]]:
    """(relative path, task type, solvable) of every game under ``directory``, cached."""
    files = _game_files(directory)
    signature = _signature(directory, files)
    if signature in _SCANNED:
        return _SCANNED[signature]
    index = data_home() / "alfworld" / "index" / f"{signature}.json"
    try:
        entries = [tuple(entry) for entry in json.loads(index.read_text())]
    except (OSError, ValueError):
        entries = _scan(directory, files)
        try:
            index.parent.mkdir(parents=True, exist_ok=True)
            partial = index.with_name(f"{index.name}.{os.getpid()}.tmp")
            partial.write_text(json.dumps(entries))
            partial.replace(index)
        except OSError:  # a read-only data home only costs a rescan next time
            pass
    _SCANNED[signature] = entries
    return entries


def list_games(
    root: Path,
    split: str,
    task_types: Sequence[str] | None = None,
    *,
    skip_unsolvable: bool = True,
) -> list[GameRecord]:
    """The split's games in a stable order (sorted by path inside the split).

    ``task_types`` keeps only those types. Games marked unsolvable are left out, as alfworld
    does, unless ``skip_unsolvable=False``, where one raises :class:`GameDataError`.
    """
    wanted = TASK_TYPES if task_types is None else tuple(task_types)
    unknown = sorted(set(wanted) - set(TASK_TYPES))
    if unknown:
        raise ValueError(f"unknown task type(s) {unknown}; choose from {TASK_TYPES}")
    directory = split_dir(root, split)
    games = []
    for relative, task_type, solvable in _entries(directory):
        path = directory / relative
        if not solvable:
            if not skip_unsolvable:
                raise GameDataError(f'{path}: marked unsolvable ("solvable": false)')
            continue
        if task_type in wanted:
            games.append(GameRecord(path, task_type))
    if not games:
        raise GameDataError(f"{directory}: no playable {GAME_FILE} games of types {list(wanted)}")
    return games


def evaluation_task_ids(num_tasks: int, rank: int = 0, world_size: int = 1) -> Iterator[int]:
    """Task ids for worker ``rank`` of ``world_size``: together, every game exactly once.

    Evaluate with ``env.reset(options={"task_id": i})`` for each id instead of sampling games,
    so every run scores the same games and the number is not noisy.
    """
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
    return iter(range(rank, num_tasks, world_size))
