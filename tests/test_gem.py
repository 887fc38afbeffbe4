"""GEM (gem-llm from PyPI) through the adapter, as users bring it: the health check flags its traps
(a turn counter in the text, a positive reward for running out of turns, probes that end every
game at once) on the bare adapter, and stays quiet on the documented spec."""

from __future__ import annotations

import re

import gymnasium as gym
import pytest

import hgpo_env
from hgpo_env.tools.check import check_env_health

gem = pytest.importorskip("gem")

GAME = "game:GuessTheNumber-v0-hard"  # 1..50 in 7 turns: random guesses mostly run out
GUESSES = [f"\\boxed{{{n}}}" for n in range(1, 51)]
TURN = re.compile(r"^At turn \d+, ")
BARE = hgpo_env.TextEnvSpec(family="gem-bare", intro="Guess the number.")
FULL = hgpo_env.TextEnvSpec(
    family="gem-full",
    intro="Guess the number; write each guess as \\boxed{N}.",
    state_text=lambda raw: TURN.sub("", raw.observation),
    won=lambda raw: raw.observation.startswith("Congratulations"),
    task_key=lambda raw: raw.env.game_number,
)
hgpo_env.register_text_env("TestGEMBare-v0", lambda: gem.make(GAME), BARE)
hgpo_env.register_text_env("TestGEMFull-v0", lambda: gem.make(GAME), FULL)


def test_running_out_of_turns_is_no_win_under_the_default():
    env = gym.make("TestGEMBare-v0", response_format="plain", max_steps=20)
    env.reset(seed=0)
    target = env.unwrapped.env.game_number
    wrong = [g for g in GUESSES if g != f"\\boxed{{{target}}}"][:7]
    for guess in wrong:
        _, reward, terminated, _, info = env.step(guess)
    answer = env.unwrapped.last_answer
    assert terminated and answer.truncated and answer.reward > 0  # GEM's closeness score
    assert not info["won"] and reward == 0.0


def test_the_check_refuses_probes_that_end_every_game_at_once():
    report = check_env_health("TestGEMBare-v0", {"max_steps": 10}, groups=2, group_size=2)
    assert not report.ok and "ended at its first step" in report.problems[-1], report.format()


def test_the_check_flags_the_counter_and_the_paid_endings_of_the_bare_adapter():
    report = check_env_health("TestGEMBare-v0", {"max_steps": 10}, groups=3, group_size=2, probes=GUESSES)
    assert report.ok, report.format()
    text = "\n".join(report.warnings)
    assert "counter or clock" in text and "ran out of turns" in text, report.format()


def test_the_documented_spec_passes_quietly():
    report = check_env_health("TestGEMFull-v0", {"max_steps": 10}, groups=3, group_size=2, probes=GUESSES)
    assert report.ok and not report.warnings, report.format()
    assert report.levels[0].repeated > 0  # without the counter, states recur
