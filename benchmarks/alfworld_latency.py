"""Reset and step latency of HGPO-ALFWorld-v0 against alfworld's own AlfredTWEnv, same games and commands.

    python benchmarks/alfworld_latency.py [--games 30] [--data ../shared/data/alfworld]

Each env plays the same valid_seen games (an even spread over the sorted split) and replays each
game's walkthrough. alfworld's env runs first, one env object for all games (its fast setting;
an object per game is slower and leaks). Ours is measured twice: "cold" is the first reset of a
game in a process with no compiled-game cache (the worst case, once per game and machine with
the disk cache, which starts empty in a temporary data home), "warm" replays the games again
(every later episode of a game: task groups, epochs, evaluation). Observations and admissible commands are checked equal along the way.
Latencies are medians and 95th percentiles in milliseconds; ratios are alfworld / ours.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

import gymnasium

import hgpo_env  # noqa: F401 (registers the ids)
from hgpo_env.envs.alfworld.reference import ReferenceEnv

DEFAULT_DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "alfworld"


def _timed(into: list[float], call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    start = time.perf_counter()
    result = call(*args, **kwargs)
    into.append(time.perf_counter() - start)
    return result


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _play_reference(games: list[Path]) -> tuple[list[float], list[float], dict[str, list]]:
    env = ReferenceEnv(games)
    resets: list[float] = []
    steps: list[float] = []
    trace: dict[str, list] = {}
    for _ in games:
        obs, admissible, game_file = _timed(resets, env.reset)
        record = [(obs, admissible)]
        for command in json.loads(Path(game_file).read_text())["walkthrough"]:
            obs, admissible, _ = _timed(steps, env.step, command)
            record.append((obs, admissible))
        trace[str(Path(game_file).resolve())] = record
    env.close()
    return resets, steps, trace


def _play_ours(
    env: gymnasium.Env, task_ids: list[int], trace: dict[str, list]
) -> tuple[list[float], list[float]]:
    plain = env.unwrapped
    resets: list[float] = []
    steps: list[float] = []
    for task_id in task_ids:
        _, info = _timed(resets, env.reset, options={"task_id": task_id})
        expected = trace[str(Path(info["game_file"]).resolve())]
        seen = [(plain.observation, info["admissible_actions"])]
        for command in plain.walkthrough:
            _, _, _, _, info = _timed(steps, env.step, command)
            seen.append((plain.observation, info["admissible_actions"]))
        hidden_help = [(obs, [c for c in admissible if c != "help"]) for obs, admissible in expected]
        if seen != hidden_help or not info["won"]:
            raise AssertionError(f"{info['game_file']}: differs from alfworld's env")
    return resets, steps


def _row(name: str, samples: list[float]) -> str:
    ms = np.asarray(samples) * 1000
    return f"{name:<22}{np.median(ms):>10.1f}{np.percentile(ms, 95):>10.1f}{len(ms):>8d}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--games", type=int, default=30, help="valid_seen games to play (140 = all)")
    parser.add_argument(
        "--data", type=Path, default=DEFAULT_DATA, help="ALFWorld data root holding valid_seen"
    )
    args = parser.parse_args(argv)

    os.environ["HGPO_DATA"] = tempfile.mkdtemp(prefix="alfworld-bench-")  # an empty compiled-game cache
    env = gymnasium.make("HGPO-ALFWorld-v0", split="valid_seen", data_path=args.data, response_format="plain")
    all_games = env.unwrapped.games
    picks = np.linspace(0, len(all_games) - 1, min(args.games, len(all_games))).round().astype(int).tolist()
    games = [all_games[i].path for i in picks]

    rss = _rss_mb()
    ref_resets, ref_steps, trace = _play_reference(games)
    ref_rss, rss = _rss_mb() - rss, _rss_mb()
    cold_resets, cold_steps = _play_ours(env, picks, trace)
    warm_resets, warm_steps = _play_ours(env, picks, trace)
    ours_rss = _rss_mb() - rss
    env.close()
    shutil.rmtree(os.environ["HGPO_DATA"], ignore_errors=True)

    print(f"{len(games)} valid_seen games, {len(ref_steps)} walkthrough steps per env; identical text: yes")
    print(f"{'':<22}{'median ms':>10}{'p95 ms':>10}{'n':>8}")
    for name, samples in [
        ("alfworld reset", ref_resets),
        ("ours reset (cold)", cold_resets),
        ("ours reset (warm)", warm_resets),
        ("alfworld step", ref_steps),
        ("ours step (cold)", cold_steps),
        ("ours step (warm)", warm_steps),
    ]:
        print(_row(name, samples))
    print("speed-up (alfworld / ours, medians):")
    for name, ref, ours in [
        ("reset, cold", ref_resets, cold_resets),
        ("reset, warm", ref_resets, warm_resets),
        ("step, cold", ref_steps, cold_steps),
        ("step, warm", ref_steps, warm_steps),
    ]:
        print(
            f"  {name:<12}{np.median(ref) / np.median(ours):>8.1f}x   (p95 {np.percentile(ref, 95) / np.percentile(ours, 95):.1f}x)"
        )
    print(f"peak RSS growth: alfworld {ref_rss:.0f} MB, ours {ours_rss:.0f} MB (cold + warm)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
