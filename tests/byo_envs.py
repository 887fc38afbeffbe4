"""Small third-party-style text envs for the adapter tests, registered by id (pool workers and
``python -m hgpo_env check byo_envs:ID`` import this module to register them)."""

from __future__ import annotations

import dataclasses
import random
import time

import gymnasium as gym
import numpy as np

import hgpo_env
from hgpo_env import TextEnvSpec


class Dial(gym.Env):
    """A dial to turn to a target; Gymnasium 5-tuple, its own step limit, info keys of its own."""

    def __init__(self, limit: int = 100, counter: bool = False) -> None:
        self.limit, self.counter = limit, counter

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.value, self.target, self.moves = 0, int(self.np_random.integers(2, 6)), 0
        return self._obs(), {"goal": f"turn the dial to {self.target}", "moves": ["up", "down"]}

    def step(self, action):
        self.moves += 1
        if action == "kick":
            return "Ouch.", -1.0, False, False, {"moves": ["up", "down"], "refused": True}
        self.value += 1 if action == "up" else -1
        won = self.value == self.target
        info = {"moves": ["up", "down"], "refused": False}
        return self._obs(), 5.0 if won else 0.5, won, self.moves >= self.limit, info

    def _obs(self) -> str:
        text = f"The dial shows {self.value}."
        return f"{text} Move {self.moves}." if self.counter else text


SPEC = TextEnvSpec(
    family="dial",
    intro="You turn a dial.",
    task="goal",
    admissible="moves",
    accepted=lambda raw: not raw.info["refused"],
)


class Lottery(gym.Env):
    """Draws from the process-global ``random`` and ``numpy.random``, as many text games do."""

    def reset(self, *, seed=None, options=None):
        random.seed(seed)
        return "Draw.", {}

    def step(self, action):
        return f"You drew {random.randint(0, 10**9)} and {np.random.randint(10**9)}.", 0.0, False, False, {}


class Nondeterministic(Dial):
    """Draws from OS entropy: no seed can make it replay."""

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        return f"{obs} Noise {random.SystemRandom().random():.6f}.", reward, terminated, truncated, info


class Lockbox(gym.Env):
    """Partially observable: the seed sets a combination (how many clicks open the box) that no
    first observation shows, so every task starts with the same text."""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.combination, self.turns = self._draw(), 0
        return "A lockbox. Turn a dial.", {}

    def _draw(self) -> int:
        return int(self.np_random.integers(1, 7))

    def step(self, action):
        if action == "open":  # a wrong try jams the box for good
            opened = self.turns == self.combination
            return ("The box opens." if opened else "Jammed."), float(opened), True, False, {}
        self.turns += 1
        return ("Click." if self.turns == self.combination else "Silence."), 0.0, False, False, {}


class ExpertLockbox(Lockbox):
    """A lockbox that knows its combination and says what to do next."""

    def expert_action(self) -> str:
        return "open" if self.turns == self.combination else "turn"


class StuckLockbox(Lockbox):
    """Ignores its seed: every task is the same box."""

    def _draw(self) -> int:
        return 3


class GlobalLockbox(Lockbox):
    """Draws its combination from the process-global stream, which nothing seeds."""

    def _draw(self) -> int:
        return random.randint(1, 999)


LOCKBOX = TextEnvSpec(
    family="lockbox",
    intro="You open a lockbox.",
    task=lambda raw: "Open the lockbox.",
    admissible=lambda raw: ["turn", "open"],
    task_key=lambda raw: raw.env.combination,
)


class Hourglass(gym.Env):
    """Runs out after a number of turns its seed sets, whatever the agent does: short tasks and
    long ones, for the share of a batch's steps each kind gets."""

    LENGTHS = (2, 8)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.length, self.turns = self.LENGTHS[int(self.np_random.integers(2))], 0
        return f"An hourglass of {self.length} turns.", {}

    def step(self, action):
        self.turns += 1
        done = self.turns == self.length
        return f"Turn {self.turns}.", float(done and action == "wait"), done, False, {}


HOURGLASS = TextEnvSpec(
    family="hourglass",
    intro="You watch an hourglass.",
    task=lambda raw: "Wait for the sand to run out.",
    admissible=lambda raw: ["wait", "flip"],
    task_key=lambda raw: raw.env.length,
)


def slow_dial(split: str = "train") -> Dial:
    """A dial that takes a while to build, as envs that load a catalog or a game set do."""
    time.sleep(1.0)
    return Dial()


hgpo_env.register_text_env("TestDial-v0", Dial, SPEC, limit=100)
hgpo_env.register_text_env(
    "TestSlowDial-v0", slow_dial, dataclasses.replace(SPEC, num_tasks=400, splits=("train", "eval"))
)
hgpo_env.register_text_env("TestLockbox-v0", ExpertLockbox, LOCKBOX)
hgpo_env.register_text_env("TestHourglass-v0", Hourglass, HOURGLASS)
hgpo_env.register_text_env("TestLockboxPlainKey-v0", Lockbox, dataclasses.replace(LOCKBOX, task_key=None))
hgpo_env.register_text_env("TestStuckLockbox-v0", StuckLockbox, LOCKBOX)
hgpo_env.register_text_env("TestGlobalLockbox-v0", GlobalLockbox, LOCKBOX, isolate_rng=False)
hgpo_env.register_text_env(
    "TestLockboxDefaultKey-v0", GlobalLockbox, dataclasses.replace(LOCKBOX, task_key=None), isolate_rng=False
)
hgpo_env.register_text_env("TestCounter-v0", Dial, SPEC, counter=True)
hgpo_env.register_text_env("TestNondeterministic-v0", Nondeterministic, SPEC)
hgpo_env.register_text_env(
    "TestLottery-v0", Lottery, TextEnvSpec(family="lottery", intro="Draw.", admissible=lambda raw: ["draw"])
)
