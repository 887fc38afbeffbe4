"""WebShop step latency: the plain env and the LLM-ready env (parser + K-step memory).

    python benchmarks/webshop_step.py [--episodes 300] [--history-length 2]

Episodes mix the oracle's commands with random admissible clicks and invalid commands (one step
in four each), so every page kind, searches and purchases are timed. Runs on WebShop's small
setting when its files are found (``../shared/data/webshop``, ``$WEBSHOP_DATA``, data home),
else on the generated catalog. Reports median and p95 per step, per command kind.
"""

from __future__ import annotations

import random
import time
import warnings
from collections import defaultdict

import gymnasium as gym
from command_line import options
from webshop_common import data_path, median_p95

import hgpo_env  # noqa: F401
from hgpo_env.envs.webshop.sources import GeneratedCatalogWarning


def run(env: gym.Env, episodes: int, wrap: bool) -> dict[str, list[float]]:
    rng = random.Random(0)
    plain = env.unwrapped
    times: dict[str, list[float]] = defaultdict(list)
    for episode in range(episodes):
        env.reset(seed=episode)
        done = False
        while not done:
            roll = rng.random()
            if roll < 0.25:
                command, kind = "click[nowhere]", "invalid"
            elif roll < 0.5 and plain.admissible_actions[0].startswith("click"):
                command = rng.choice(plain.admissible_actions)
                kind = "buy" if command == "click[buy now]" else "click"
            else:
                command = plain.expert_action()
                kind = (
                    "search"
                    if command.startswith("search")
                    else "buy"
                    if command == "click[buy now]"
                    else "click"
                )
            action = f"<think>plan</think><action>{command}</action>" if wrap else command
            start = time.perf_counter()
            _, _, terminated, truncated, _ = env.step(action)
            times[kind].append(time.perf_counter() - start)
            times["all"].append(times[kind][-1])
            done = terminated or truncated
    return times


def report(name: str, times: dict[str, list[float]]) -> None:
    for kind in ("all", "search", "click", "buy", "invalid"):
        if times.get(kind):
            median, p95 = median_p95(times[kind])
            print(
                f"{name:<22} {kind:<8} n={len(times[kind]):>6}  median {median * 1e6:8.1f} us  p95 {p95 * 1e6:8.1f} us"
            )


def main() -> None:
    args = options(__doc__, episodes=300, history_length=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GeneratedCatalogWarning)
        env = gym.make("HGPO-WebShop-v0", data_path=data_path(), history_length=args.history_length)
    print(f"catalog: {env.unwrapped.catalog.source} ({len(env.unwrapped.catalog)} products)")
    env.reset(seed=0)
    env.unwrapped.step("search[warm up]")  # first search and the tagger's import are not steps to time
    run(env, 5, wrap=True)
    report("plain env", run(env.unwrapped, args.episodes, wrap=False))
    report(f"made env (K={args.history_length})", run(env, args.episodes, wrap=True))


if __name__ == "__main__":
    main()
