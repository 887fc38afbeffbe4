"""Per-step cost of the bring-your-own-env stack over the bare third-party step.

    python benchmarks/adapter_overhead.py [--steps 20000] [--obs-bytes 1024]

A plain Gymnasium text env (not a TextEnv: ~1 KB observations, distinct per step, an admissible
list in its info) is stepped bare, then as ``gymnasium.make`` would serve it after
``register_text_env``: TextAdapter + ParseResponse + KStepMemory with fingerprints, at K = 4,
with and without the private random streams. Where TextArena is installed, its Tower of Hanoi
is measured the same way (bare TextArena calls vs HGPO-TextArena-v0's stack). All in one run;
the overhead is the difference. Target: at most 20 microseconds per step at K = 4.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

import gymnasium as gym
from command_line import options

from hgpo_env import TextAdapter, TextEnvSpec, make_agent_env

WORDS = ("the", "a", "kitchen", "drawer", "apple", "shelf", "you", "see", "open", "closed", "mug", "red")


class Pages(gym.Env):
    """A third-party-style env: cycles through pre-built pages; never ends."""

    def __init__(self, obs_bytes: int, num_pages: int = 64) -> None:
        rng = random.Random(0)
        self.pages = [
            " ".join(rng.choice(WORDS) for _ in range(obs_bytes // 5))[:obs_bytes] for _ in range(num_pages)
        ]
        self.i = 0

    def reset(self, *, seed=None, options=None):
        self.i = 0
        return self.pages[0], {"goal": "read", "commands": ["look", "wait"]}

    def step(self, action):
        self.i = (self.i + 1) % len(self.pages)
        return self.pages[self.i], 0.0, False, False, {"goal": "read", "commands": ["look", "wait"]}


SPEC = TextEnvSpec(family="pages", intro="Read.", task="goal", admissible="commands")


def per_step(step: Callable[[], object], reset: Callable[[], object], steps: int, repeats: int = 7) -> float:
    """Fastest of ``repeats`` runs, in mean seconds per step (the least disturbed by other load)."""
    samples = []
    for _ in range(repeats):
        reset()
        start = time.perf_counter()
        for _ in range(steps):
            step()
        samples.append((time.perf_counter() - start) / steps)
    return min(samples)


def wrapped(inner: object, spec: TextEnvSpec, **options: object) -> gym.Env:
    return make_agent_env(
        lambda **kw: TextAdapter(inner, spec, max_steps=10**9, **kw),
        history_length=4,
        response_format="plain",
        **options,
    )


def row(name: str, seconds: float, bare: float) -> None:
    print(f"{name:<44}{seconds * 1e6:>10.2f}{(seconds - bare) * 1e6:>14.2f}{seconds / bare:>9.2f}")


def main() -> None:
    args = options(__doc__, steps=20000, obs_bytes=1024)
    print(f"{args.steps} steps, fastest of 7 runs, observations of {args.obs_bytes} characters")
    print(f"{'setup':<44}{'us/step':>10}{'overhead us':>14}{'x bare':>9}")

    env = Pages(args.obs_bytes)
    bare = per_step(lambda: env.step("look"), env.reset, args.steps)
    row("bare Gymnasium text env", bare, bare)
    for isolate in (False, True):
        agent = wrapped(Pages(args.obs_bytes), SPEC, isolate_rng=isolate)
        seconds = per_step(
            lambda agent=agent: agent.step("look"), lambda agent=agent: agent.reset(seed=0), args.steps
        )
        row(f"adapter+parser+memory K=4, isolate_rng={isolate}", seconds, bare)

    try:
        import textarena
    except ImportError:
        print("(TextArena not installed: pip install -e '.[textarena]' to measure it too)")
        return
    from hgpo_env.envs.textarena.env import SPEC as ARENA

    def endless_hanoi() -> object:
        game = textarena.make("TowerOfHanoi-v0-raw")
        game.max_turns = 10**9  # moves back and forth, never solved, never out of turns
        return game

    moves = ["[A B]", "[B A]"]
    hanoi, bare_turn = endless_hanoi(), iter(range(10**9))

    def arena_step() -> None:
        hanoi.step(action=moves[next(bare_turn) % 2])
        hanoi.get_observation()

    steps = args.steps // 4
    bare = per_step(arena_step, lambda: hanoi.reset(num_players=1, seed=0), steps)
    row("bare TextArena Tower of Hanoi", bare, bare)
    agent, turn = wrapped(endless_hanoi(), ARENA), iter(range(10**9))
    seconds = per_step(lambda: agent.step(moves[next(turn) % 2]), lambda: agent.reset(seed=0), steps)
    row("HGPO-TextArena-v0 stack K=4", seconds, bare)


if __name__ == "__main__":
    main()
