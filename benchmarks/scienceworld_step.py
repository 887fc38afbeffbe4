"""Step latency of HGPO-ScienceWorld-v0 against ScienceWorld's own engine, same task and commands.

    python benchmarks/scienceworld_step.py [--task find-living-thing] [--variations 4]

Each variation's gold path is played by ScienceWorld's ``ScienceWorldEnv`` (its ``step`` lists the
valid actions every time, copying the list from Java one element per round trip), then by
HGPO-ScienceWorld-v0 (free-form by default: no list is shown, so none is computed) and by
HGPO-ScienceWorld-v0 with ``list_valid_actions=True`` (the list, as the engine gives it). The
scores are checked equal along the way. Latencies are medians in milliseconds; ratios are the
engine's over ours.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import gymnasium as gym
from command_line import options
from scienceworld import ScienceWorldEnv

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout
import hgpo_env  # noqa: F401  (registers the ids)


def engine_steps(task: str, variations: list[int]) -> tuple[list[float], list[list[int]], list[list[str]]]:
    """Per-step seconds of the bare engine, each variation's scores, and its gold commands."""
    engine = ScienceWorldEnv("", envStepLimit=1_000_000)
    seconds, scores, paths = [], [], []
    try:
        for variation in variations:
            engine.load(task, variation, "easy", generateGoldPath=True)
            engine.reset()
            path = engine.get_gold_action_sequence()
            paths.append(path)
            scores.append([])
            for command in path:
                start = time.perf_counter()
                _, _, _, info = engine.step(command)
                seconds.append(time.perf_counter() - start)
                scores[-1].append(info["score"])
    finally:
        engine.close()
    return seconds, scores, paths


def our_steps(task: str, paths: list[list[str]], **kwargs: object) -> tuple[list[float], list[list[int]]]:
    """Per-step seconds of HGPO-ScienceWorld-v0 (variation i is task id i) and its scores."""
    env = gym.make("HGPO-ScienceWorld-v0", task=task, response_format="plain", max_steps=1000, **kwargs)
    seconds, scores = [], []
    try:
        for task_id, path in enumerate(paths):
            env.reset(options={"task_id": task_id})
            scores.append([])
            for command in path:
                start = time.perf_counter()
                _, _, _, _, info = env.step(command)
                seconds.append(time.perf_counter() - start)
                scores[-1].append(round(info["score"]))
    finally:
        env.close()
    return seconds, scores


def main() -> None:
    args = options(__doc__, task="find-living-thing", variations=4)
    probe = gym.make("HGPO-ScienceWorld-v0", task=args.task)
    variations = probe.unwrapped.variations[: args.variations]
    probe.close()
    engine, engine_scores, paths = engine_steps(args.task, variations)
    print(f"{args.task}, train variations {variations}: {len(engine)} steps each way")
    print(f"{'env':<44}{'median ms':>10}{'ratio':>8}")
    baseline = statistics.median(engine) * 1000
    print(f"{'ScienceWorldEnv.step (lists valid actions)':<44}{baseline:>10.1f}{1.0:>8.2f}")
    for name, kwargs in [
        ("HGPO-ScienceWorld-v0", {}),
        ("  with list_valid_actions=True", {"list_valid_actions": True}),
    ]:
        seconds, scores = our_steps(args.task, paths, **kwargs)
        if scores != engine_scores:
            raise SystemExit(f"{name}: the scores differ from the engine's")
        ours = statistics.median(seconds) * 1000
        print(f"{name:<44}{ours:>10.1f}{baseline / ours:>8.2f}")


if __name__ == "__main__":
    main()
