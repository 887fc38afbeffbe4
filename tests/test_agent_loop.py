"""Per-episode agent loops (``generation.agent_loop: per_episode``, :mod:`hgpo_train.rollout.agent_loop`).

The generator here stands in for greedy decoding: its response is a function of the prompt
alone (a hash of it picks one of the commands it lists, or one no env admits), and each call sleeps,
as a model's forward pass takes time. That is the property the loop's guarantee rests on, and a
tiny model's batched greedy decoding would add float noise from batch padding on top of it.
"""

from __future__ import annotations

import re
import threading
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pytest
from test_train_e2e import ROOMS, _one_iteration_checks, _trainer

from hgpo_train.advantage import AdvantageConfig, step_credit
from hgpo_train.config import EnvConfig
from hgpo_train.rollout.agent_loop import MicroBatcher
from hgpo_train.rollout.collect import collect_rollouts, make_pool
from hgpo_train.rollout.generation import Generation

ROOMS_ENV = EnvConfig(
    name="rooms",
    max_steps=12,
    history_length=12,  # the whole episode in the prompt: the answer knows what it carries
    response_format="plain",
    num_groups=3,
    group_size=3,
    num_workers=2,
    kwargs={"min_rooms": 2, "max_rooms": 4, "lock_probability": 0.0, "max_task_items": 1},
)


@dataclass
class PromptFunction:
    """Answers each prompt with a function of that prompt alone; each call sleeps ``delay`` s and
    is logged (its batch size, start and end)."""

    delay: float = 0.02
    calls: list[tuple[int, float, float]] = field(default_factory=list)
    fail_on_call: int | None = None

    def generate(
        self,
        prompts: Sequence[str],
        admissible: Sequence[Sequence[str]] | None = None,
        temperature: float | None = None,
    ) -> list[Generation]:
        start = time.monotonic()
        if self.fail_on_call == len(self.calls):
            raise RuntimeError("the engine fell over")
        time.sleep(self.delay)
        self.calls.append((len(prompts), start, time.monotonic()))
        return [self.answer(p, a) for p, a in zip(prompts, admissible or [None] * len(prompts))]

    @staticmethod
    def answer(prompt: str, admissible: Sequence[str] | None) -> Generation:
        """Take the task's item, drop it in the task's room, else a move picked by the prompt's
        hash (or, unconstrained, a command no env admits)."""
        listed = re.findall(r"^- (.+)$", prompt.rsplit("Admissible actions:", 1)[-1], re.MULTILINE)
        commands = list(admissible) if admissible else listed
        item, room = re.search(r"Your task is to: put the (.+?) in the (.+?)\.", prompt).groups()
        here = re.findall(r"You are in the (.+?)\.", prompt)[-1]
        handled = [a for a in re.findall(r"Action: (.+)", prompt) if a in (f"take {item}", f"drop {item}")]
        carrying = handled[-1:] == [f"take {item}"]
        if not carrying and f"take {item}" in commands:
            text = f"take {item}"
        elif carrying and here == room and f"drop {item}" in commands:
            text = f"drop {item}"
        else:
            moves = [c for c in commands if c.startswith("go ")] + ([] if admissible else ["fly away"])
            text = moves[zlib.crc32(prompt.encode()) % len(moves)]
        return Generation([len(prompt)], [len(text)], text)


class Echo(PromptFunction):
    """Answers a prompt with itself, upper-cased."""

    @staticmethod
    def answer(prompt: str, admissible: Sequence[str] | None) -> Generation:
        return Generation([], [], prompt.upper())


@dataclass
class TimedPool:
    """A pool whose step calls are logged (start, end)."""

    pool: object
    steps: list[tuple[float, float]] = field(default_factory=list)

    def reset(self, **kwargs):
        return self.pool.reset(**kwargs)

    def step(self, actions):
        start = time.monotonic()
        results = self.pool.step(actions)
        self.steps.append((start, time.monotonic()))
        return results

    @property
    def num_envs(self) -> int:
        return self.pool.num_envs


@pytest.fixture(scope="module")
def pool():
    with make_pool(ROOMS_ENV, ROOMS_ENV.num_groups, ROOMS_ENV.group_size, seed=0) as made:
        yield made


def rollout(pool, generator, **options):
    return collect_rollouts(
        pool,
        generator,
        seeds=[3, 4, 5],
        task_ids=[0, 1, 2],
        response_format=ROOMS_ENV.response_format,
        **options,
    )


def assert_same_rollouts(a, b) -> None:
    for name in (
        "group_id",
        "traj_id",
        "step",
        "reward",
        "invalid",
        "fingerprints",
        "next_state",
        "action_key",
    ):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    assert [list(x) for x in a.response_ids] == [list(x) for x in b.response_ids]
    assert a.episodes.length.tolist() == b.episodes.length.tolist()
    assert a.episodes.won.tolist() == b.episodes.won.tolist()


@pytest.mark.parametrize("constrained", [False, True])
def test_per_episode_loops_play_exactly_the_lockstep_episodes(pool, constrained):
    lockstep = rollout(pool, PromptFunction(), constrained=constrained)
    # two prompts per generate call: 9 episodes are spread over several calls in flight
    per_episode = rollout(
        pool, PromptFunction(), constrained=constrained, agent_loop="per_episode", max_batch=2
    )
    assert_same_rollouts(lockstep, per_episode)
    assert len(set(lockstep.episodes.length.tolist())) > 1  # episodes end at different steps
    assert lockstep.invalid.any() != constrained and not lockstep.invalid.all()
    config = AdvantageConfig(estimator="hgpo")
    credit = [
        step_credit(b.reward, b.traj_id, b.group_id, b.fingerprints, b.invalid, config=config)
        for b in (lockstep, per_episode)
    ]
    np.testing.assert_array_equal(credit[0].advantages, credit[1].advantages)
    assert np.abs(credit[0].advantages).max() > 0


def test_env_steps_run_while_other_episodes_are_generated(pool):
    generator, timed = PromptFunction(delay=0.05), TimedPool(pool)
    batch = collect_rollouts(
        timed, generator, seeds=[3, 4, 5], task_ids=[0, 1, 2], agent_loop="per_episode", max_batch=3
    )
    assert max(size for size, _, _ in generator.calls) <= 3
    overlapping = [
        (step, call)
        for step in timed.steps
        for call in generator.calls
        if step[0] < call[2] and call[1] < step[1]
    ]
    assert overlapping, "no env step ran during a generation"
    assert len(timed.steps) > batch.episodes.length.max()  # more step calls than lockstep's turns
    timing = batch.extras["timing"]
    assert timing["env_s"] > 0 and timing["generate_s"] > 0


def test_lockstep_turns_never_overlap_generation(pool):
    generator, timed = PromptFunction(delay=0.02), TimedPool(pool)
    batch = collect_rollouts(timed, generator, seeds=[3, 4, 5], task_ids=[0, 1, 2])
    assert len(timed.steps) == batch.episodes.length.max() == len(generator.calls)
    assert not [s for s in timed.steps for c in generator.calls if s[0] < c[2] and c[1] < s[1]]


def test_a_failing_generation_ends_the_rollout_and_stops_the_batcher(pool):
    threads = threading.active_count()
    with pytest.raises(RuntimeError, match="the engine fell over"):
        rollout(pool, PromptFunction(fail_on_call=3), agent_loop="per_episode", max_batch=2)
    deadline = time.monotonic() + 10
    while threading.active_count() > threads and time.monotonic() < deadline:
        time.sleep(0.01)
    assert threading.active_count() == threads, [t.name for t in threading.enumerate()]
    lockstep = rollout(pool, PromptFunction())  # the pool plays the next rollout as usual
    assert len(lockstep.episodes) == pool.num_envs


def test_an_unknown_agent_loop_is_one_line(pool):
    with pytest.raises(
        ValueError, match=r"agent_loop must be one of \('lockstep', 'per_episode'\), got 'async'"
    ):
        rollout(pool, PromptFunction(), agent_loop="async")


class GatedEcho(Echo):
    """An :class:`Echo` whose first call waits for :attr:`release` (and says it started)."""

    def __init__(self) -> None:
        super().__init__(delay=0.0)
        self.started, self.release = threading.Event(), threading.Event()

    def generate(self, prompts, admissible=None, temperature=None):
        if not self.calls:
            self.started.set()
            assert self.release.wait(timeout=60)
        return super().generate(prompts, admissible, temperature)


def test_the_micro_batcher_batches_what_is_waiting_and_keeps_temperatures_apart():
    generator = GatedEcho()
    with MicroBatcher(generator, max_batch=4) as batcher:
        first = batcher.submit("a", None, 1.0)
        assert generator.started.wait(timeout=60)  # the rest wait for the next calls
        rest = [batcher.submit(p, None, t) for p, t in zip("bcdefgh", [1.0, 0.5, 1.0, 1.0, 1.0, 1.0, 0.5])]
        generator.release.set()
        texts = [f.result(timeout=60).text for f in [first, *rest]]
    assert texts == list("ABCDEFGH")
    # a alone; then the oldest waiting (b) and three more at its temperature; c and h (0.5); g
    assert [size for size, _, _ in generator.calls] == [1, 4, 2, 1]


def test_closing_the_micro_batcher_cancels_what_waits_and_finishes_what_runs():
    generator = GatedEcho()
    batcher = MicroBatcher(generator, max_batch=1)
    running = batcher.submit("a", None, 1.0)
    assert generator.started.wait(timeout=60)
    waiting = batcher.submit("b", None, 1.0)
    closing = threading.Thread(target=batcher.close)
    closing.start()
    deadline = time.monotonic() + 60
    while not waiting.cancelled():  # close cancels the queue at once, then waits for the call
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert closing.is_alive() and not running.done()
    generator.release.set()
    closing.join(timeout=60)
    assert running.result().text == "A" and not closing.is_alive()
    with pytest.raises(RuntimeError, match="closed"):
        batcher.submit("c", None, 1.0)
    with pytest.raises(ValueError, match="max_batch must be at least 1"):
        MicroBatcher(generator, max_batch=0)


def test_the_trainer_trains_an_iteration_with_per_episode_loops(tmp_path):
    overrides = ["generation.agent_loop=per_episode", "generation.batch_size=2", "train.iterations=1"]
    trainer = _trainer("rooms", tmp_path, ROOMS + overrides)
    try:
        result = _one_iteration_checks(trainer)
        groups = result.batch.episodes.group_id
        assert sorted(np.bincount(groups).tolist()) == [2, 2]  # every group whole
    finally:
        trainer.close()
