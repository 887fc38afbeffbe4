"""Per-step cost of the K-step memory wrapper and fingerprints, beside the bare env step.

    python benchmarks/memory_overhead.py [--steps 20000] [--obs-bytes 1024]

An env with ~1 KB observations (distinct per step, as real pages are) is stepped bare and
wrapped with KStepMemory at K = 0, 2, 4, in the same run; the overhead is the difference.
Target: under 20 microseconds per step at K = 4.
"""

from __future__ import annotations

import random
import statistics
import time

from command_line import options

from hgpo_env.prompting.memory import KStepMemory
from hgpo_env.textenv.core import TextEnv

WORDS = (
    "the",
    "a",
    "kitchen",
    "drawer",
    "apple",
    "shelf",
    "you",
    "see",
    "open",
    "closed",
    "on",
    "in",
    "countertop",
    "mug",
    "red",
)


class PagesEnv(TextEnv):
    """Cycles through pre-built pages of about ``obs_bytes`` characters; never ends."""

    env_family = "bench"
    prompt_intro = "Benchmark environment."

    def __init__(self, obs_bytes: int, num_pages: int = 64) -> None:
        super().__init__(max_steps=10**9)
        rng = random.Random(0)
        self.pages = []
        for _ in range(num_pages):
            words: list[str] = []
            while sum(map(len, words)) + len(words) < obs_bytes:
                words.append(rng.choice(WORDS))
            self.pages.append(" ".join(words)[:obs_bytes])
        self._i = 0

    num_tasks = 1
    task = "benchmark"
    won = False
    admissible_actions = ("look", "wait")

    def _start_task(self, task_id: int) -> str:
        self._i = 0
        return self.pages[0]

    def _apply(self, command: str) -> str:
        self._i = (self._i + 1) % len(self.pages)
        return self.pages[self._i]


def time_per_step(env, steps: int, repeats: int = 5) -> float:
    """Median over repeats of the mean seconds per step."""
    samples = []
    for _ in range(repeats):
        env.reset(seed=0)
        start = time.perf_counter()
        for _ in range(steps):
            env.step("look")
        samples.append((time.perf_counter() - start) / steps)
    return statistics.median(samples)


def main() -> None:
    args = options(__doc__, steps=20000, obs_bytes=1024)

    bare = time_per_step(PagesEnv(args.obs_bytes), args.steps)
    print(f"observation size: {args.obs_bytes} characters, {args.steps} steps x 5 repeats (median)")
    print(f"{'setup':<28}{'us/step':>10}{'overhead us':>14}{'x bare':>10}")
    print(f"{'bare env':<28}{bare * 1e6:>10.2f}{'':>14}{1.0:>10.2f}")
    for k in (0, 2, 4):
        wrapped = time_per_step(KStepMemory(PagesEnv(args.obs_bytes), history_length=k), args.steps)
        overhead = (wrapped - bare) * 1e6
        print(f"{f'KStepMemory K={k}':<28}{wrapped * 1e6:>10.2f}{overhead:>14.2f}{wrapped / bare:>10.2f}")


if __name__ == "__main__":
    main()
