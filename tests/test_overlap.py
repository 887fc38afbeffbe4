"""Asynchronous training (``train.async_staleness``, :mod:`hgpo_train.rollout.overlap`): rollouts collected
while the trainer updates, whole groups, recorded policy versions and a bound on their staleness."""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable

import numpy as np
import pytest
import torch
from test_train_e2e import ROOMS, TINY
from test_train_loss import step_batch

from hgpo_train.config import load_config
from hgpo_train.local.train import Trainer
from hgpo_train.rollout.batch import StepBatch
from hgpo_train.rollout.overlap import EngineWeights, FairLock, RolloutsAhead
from hgpo_train.run.checkpoint import list_checkpoints
from hgpo_train.run.stopping import RolloutStopped, StopRequested, request_stop
from hgpo_train.run.tracking import read_metrics
from hgpo_train.update.policy import build_generator, load_run_policy

WAIT_S = 60.0
"""Bound on waits for another thread (a busy machine is slow, never this slow)."""


def test_a_weight_sync_waits_for_the_rollout_that_samples() -> None:
    weights = EngineWeights(3)
    sampling, release, synced = threading.Event(), threading.Event(), threading.Event()

    def rollout() -> None:
        with weights.sampling() as version:
            assert version == 3
            sampling.set()
            release.wait(WAIT_S)

    thread = threading.Thread(target=rollout)
    thread.start()
    sampling.wait(WAIT_S)
    sync = threading.Thread(target=lambda: weights.replace(synced.set, 4))
    sync.start()
    assert not synced.wait(0.3), "the weights changed under a sampling rollout"
    release.set()
    assert synced.wait(WAIT_S)
    thread.join(WAIT_S)
    sync.join(WAIT_S)
    with weights.sampling() as version:
        assert version == 4


def test_the_lock_is_granted_in_the_order_asked() -> None:
    lock, order = FairLock(), []
    lock.__enter__()
    threads = []
    for name in range(4):
        thread = threading.Thread(
            target=lambda name=name: (lock.__enter__(), order.append(name), lock.__exit__())
        )
        thread.start()
        threads.append(thread)
        deadline = time.monotonic() + WAIT_S
        while len(lock._waiting) < name + 1 and time.monotonic() < deadline:  # queued before the next asks
            time.sleep(0.001)
    lock.__exit__()
    for thread in threads:
        thread.join(WAIT_S)
    assert order == [0, 1, 2, 3]


class Recorder:
    """A collect function that records when each rollout starts, after the trainer took how many."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.taken, self.started, self.fail_at = 0, [], fail_at

    def __call__(self, iteration: int, abandon: Callable[[], bool]) -> StepBatch:
        self.started.append((iteration, self.taken))
        if iteration == self.fail_at:
            raise RuntimeError(f"rollout {iteration} failed")
        return one_row_batch()


def one_row_batch() -> StepBatch:
    return step_batch([np.array([1])], [np.array([2])], [None])


@pytest.mark.parametrize("staleness", [1, 2])
def test_rollouts_run_at_most_the_bound_ahead_and_errors_reach_their_iteration(staleness: int) -> None:
    recorder = Recorder(fail_at=4)
    ahead = RolloutsAhead(recorder, EngineWeights(0), start=0, stop=6, staleness=staleness)
    try:
        for iteration in range(4):
            time.sleep(0.05)  # the trainer is slower than the rollouts: they run ahead up to the bound
            recorder.taken = iteration + 1  # while iteration trains, rollouts up to iteration + S may run
            assert ahead.take(iteration).policy_version.tolist() == [0]
        with pytest.raises(RuntimeError, match="rollout 4 failed"):
            ahead.take(4)
    finally:
        ahead.close()
    assert [i for i, _ in recorder.started] == [0, 1, 2, 3, 4]
    assert max(iteration - taken for iteration, taken in recorder.started) == staleness - 1


def test_closing_abandons_the_rollout_in_progress() -> None:
    seen = threading.Event()

    def collect(iteration: int, abandon: Callable[[], bool]) -> StepBatch:
        if iteration == 0:
            return one_row_batch()
        seen.set()
        deadline = time.monotonic() + WAIT_S
        while not abandon() and time.monotonic() < deadline:
            time.sleep(0.01)
        raise RolloutStopped

    ahead = RolloutsAhead(collect, EngineWeights(0), start=0, stop=3, staleness=1)
    ahead.take(0)
    assert seen.wait(WAIT_S)
    start = time.monotonic()
    ahead.close()
    assert time.monotonic() - start < WAIT_S / 2 and not ahead._thread.is_alive()


def test_a_staleness_bound_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        RolloutsAhead(Recorder(), EngineWeights(0), start=0, stop=1, staleness=0)


def async_trainer(run_dir, overrides: list[str], env: str = "rooms") -> Trainer:
    return Trainer(
        load_config(env=env, overrides=[*overrides, "train.async_staleness=1", f"train.output_dir={run_dir}"])
    )


def test_a_local_asynchronous_run_samples_the_next_rollout_during_the_update(tmp_path) -> None:
    """Iteration i+1's rollout starts before update i ends (the update waits for it to, so the test
    does not depend on timing) and samples with a copy of the policy one update behind: its steps
    are one version stale; the generator's copy gets every update, after the rollout it serves."""
    trainer = async_trainer(tmp_path, [*ROOMS, "train.iterations=3"])
    started = {i: threading.Event() for i in range(4)}
    collect, update, overlapped = trainer._collect, trainer.updater.update, []

    def recorded_collect(iteration: int, abandon: Callable[[], bool]) -> StepBatch:
        started[iteration].set()
        return collect(iteration, abandon)

    def waiting_update(batch: StepBatch, advantages: np.ndarray, rng: np.random.Generator) -> dict:
        following = len(overlapped) + 1  # the iteration whose rollout should be running
        overlapped.append(following == 3 or started[following].wait(WAIT_S))
        return update(batch, advantages, rng)

    trainer._collect, trainer.updater.update = recorded_collect, waiting_update
    try:
        assert trainer.generator.model is not trainer.model
        trainer.fit()
        generating = trainer.generator.model.state_dict()
        assert all(
            np.array_equal(v.numpy(), generating[k].numpy()) for k, v in trainer.model.state_dict().items()
        )
    finally:
        trainer.close()
    assert overlapped == [True, True, True]
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["rollout/staleness_max"] for r in records] == [0, 1, 1]
    assert [r["rollout/staleness_mean"] for r in records] == [0, 1, 1]
    assert all(r["time/rollout_s"] > 0 and r["time/rollout_wait_s"] >= 0 for r in records)


def test_the_correction_reads_the_log_probs_of_the_weights_that_sampled(tmp_path) -> None:
    """``update.off_policy_correction=tis`` in an asynchronous run: every row's behaviour log-probs
    are its tokens' under the policy version that sampled them (the weights before that update,
    kept here), so they equal the trained policy's on the fresh first rollout and differ from them
    on the stale ones, where the correction then has work to do."""
    trainer = async_trainer(tmp_path, [*ROOMS, "train.iterations=3", "update.off_policy_correction=tis"])
    update, versions, batches = trainer.updater.update, {}, []

    def recording_update(batch: StepBatch, advantages: np.ndarray, rng: np.random.Generator) -> dict:
        versions[len(versions)] = copy.deepcopy(trainer.model)  # version i: the weights update i starts from
        batches.append(batch)
        return update(batch, advantages, rng)

    trainer.updater.update = recording_update
    try:
        trainer.fit()
        for batch in batches:
            [version] = set(batch.policy_version.tolist())
            sampler = trainer.updater.response_logprobs(versions[version], batch)
            for recorded, expected in zip(batch.behaviour_logprobs, sampler):
                np.testing.assert_allclose(recorded, expected.numpy(), rtol=0, atol=1e-6)
    finally:
        trainer.close()
    olds = [trainer.updater.response_logprobs(versions[i], batch) for i, batch in enumerate(batches)]
    gaps = [
        max(np.abs(b - o.numpy()).max() for b, o in zip(batch.behaviour_logprobs, old))
        for batch, old in zip(batches, olds)
    ]
    assert gaps[0] < 1e-5 and min(gaps[1:]) > 1e-3, gaps
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert abs(records[0]["update/behaviour_kl"]) < 1e-6 and records[0]["update/off_policy_filtered"] == 0
    assert all(abs(r["update/behaviour_kl"]) > 1e-5 for r in records[1:]), records


def test_an_evaluation_alone_samples_with_the_model_itself(tmp_path) -> None:
    """An async run's hf generator samples with a copy of the policy (the update changes it
    meanwhile); ``python -m hgpo_train eval`` of the same config changes nothing, so copies nothing."""
    config = load_config(
        env="rooms", overrides=[*ROOMS, "train.async_staleness=1", f"train.output_dir={tmp_path}"]
    )
    loaded = load_run_policy(config, tmp_path, torch.device("cpu"), None)
    assert build_generator(config, loaded).model is not loaded.model
    assert build_generator(config, loaded, training=False).model is loaded.model


def test_a_stop_during_an_asynchronous_update_checkpoints_it_and_a_rerun_resumes(tmp_path) -> None:
    """SIGTERM's stop request during update 2: that update finishes and is checkpointed, the
    rollout collected ahead (iteration 3's groups, in flight) is dropped, and re-running resumes
    at iteration 3 with its rollout sampled again."""
    trainer = async_trainer(tmp_path, [*ROOMS, "train.iterations=4", "train.save_every=10"])
    update = trainer.updater.update
    calls = []

    def stop_in_second(batch: StepBatch, advantages: np.ndarray, rng: np.random.Generator) -> dict:
        calls.append(1)
        if len(calls) == 2:
            request_stop(trainer.run_dir, "SIGTERM", say=lambda line: None)
        return update(batch, advantages, rng)

    trainer.updater.update = stop_in_second
    try:
        with pytest.raises(StopRequested) as stopped:
            trainer.fit()
    finally:
        trainer.close()
    assert stopped.value.iteration == 2 and [p.name for p in list_checkpoints(tmp_path)] == ["iter_000002"]
    resumed = async_trainer(tmp_path, [*ROOMS, "train.iterations=4", "train.save_every=10"])
    try:
        assert resumed.start_iteration == 2
        resumed.fit()
    finally:
        resumed.close()
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["iteration"] for r in records] == [1, 2, 3, 4]
    assert [r["rollout/staleness_max"] for r in records] == [0, 1, 0, 1]  # the resumed first rollout is fresh


HOURGLASS = [
    *TINY,
    "env.name=byo_envs:TestHourglass-v0",
    "env.num_groups=4",
    "env.max_steps=8",
    "generation.max_new_tokens=3",
    "train.iterations=2",
]


def long_step_shares(run_dir, staleness: int) -> list[float]:
    """Per iteration, the share of the trained steps that belong to 8-turn tasks."""
    trainer = Trainer(
        load_config(
            overrides=[*HOURGLASS, f"train.async_staleness={staleness}", f"train.output_dir={run_dir}"]
        )
    )
    shares, update = [], trainer.updater.update

    def recording(batch: StepBatch, advantages: np.ndarray, rng: np.random.Generator) -> dict:
        episodes = batch.episodes
        length = dict(zip(zip(episodes.group_id, episodes.traj_id), episodes.length))
        long = [length[group, rollout] == 8 for group, rollout in zip(batch.group_id, batch.traj_id)]
        shares.append(float(np.mean(long)))
        return update(batch, advantages, rng)

    trainer.updater.update = recording
    try:
        trainer.fit()
    finally:
        trainer.close()
    return shares


def test_long_tasks_keep_their_share_of_the_trained_steps(tmp_path) -> None:
    """Tasks of 2 and 8 turns (``TestHourglass-v0``): the asynchronous run trains on exactly the
    share of long-task steps the synchronous one does, iteration by iteration (tolerance 0),
    because an iteration's groups enter its batch together, once all their episodes have ended,
    and no finished group is dropped for a faster one."""
    import byo_envs  # noqa: F401  (registers the env)

    synchronous = long_step_shares(tmp_path / "sync", 0)
    assert len(synchronous) == 2 and 0 < min(synchronous) and max(synchronous) < 1
    assert long_step_shares(tmp_path / "async", 1) == synchronous
