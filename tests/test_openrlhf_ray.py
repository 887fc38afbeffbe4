"""The OpenRLHF backend's rollout on a real Ray cluster (2 CPUs), with a fake generation engine.

Env workers are Ray actors (the pool's Ray backend, as the backend runs them); the engines are
Ray actors with the method OpenRLHF's ``RolloutRayActor.generate`` has, answering with
vLLM-shaped outputs. The controller's loop (``HGPOTrainer.fit``) runs with OpenRLHF's GPU steps
(experience making, DeepSpeed update, weight broadcast) replaced by a recorder. ``vllm`` and
``flash_attn`` are stubbed in ``sys.modules``, as OpenRLHF's own CPU tests do. The same loop on
the real stack (vLLM's CPU build, DeepSpeed, the weight sync) runs in ``tests/openrlhf_cpu``.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
import zlib
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

ray = pytest.importorskip("ray")
pytest.importorskip(
    "openrlhf", reason="the openrlhf backend is not installed (pip install --no-deps openrlhf==0.11.2)"
)

from test_train_e2e import assert_estimator_matters

from hgpo_train.config import OpenRLHFConfig, load_config
from hgpo_train.openrlhf.stubs import stubbed_gpu_packages
from hgpo_train.rollout.collect import collect_rollouts, count_tasks, make_pool

with stubbed_gpu_packages():
    from test_openrlhf import assert_experience_advantages, make_maker

    from hgpo_train.openrlhf.engines import EngineGenerator
    from hgpo_train.openrlhf.samples import step_experiences
    from hgpo_train.openrlhf.trainer import EngineLock, HGPOTrainer, trainer_actor
    from hgpo_train.rollout.generation import PromptTooLongError
    from hgpo_train.rollout.overlap import EngineWeights

IM_END, EOS = 256, 257
RESPONSES = [
    "<think>hm</think><action>look</action>",
    "<think>hm</think><action>inventory</action>",
    "no action",
]


class ByteTokenizer:
    """A chat tokenizer without files: one id per byte, ChatML template, <|im_end|> = 256."""

    chat_template = "chatml"
    eos_token_id, unk_token_id, pad_token_id = EOS, None, 0

    def apply_chat_template(
        self, messages: list[dict[str, str]], add_generation_prompt: bool, tokenize: bool
    ) -> str:
        return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages) + (
            "<|im_start|>assistant\n" if add_generation_prompt else ""
        )

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
        return {"input_ids": list(text.encode())}

    def convert_tokens_to_ids(self, token: str) -> int | None:
        return IM_END if token == "<|im_end|>" else None

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return bytes(i for i in ids if i < 256).decode(errors="replace")


def vllm_output(token_ids: list[int], sampling_params: dict[str, Any]) -> Any:
    """A ``RequestOutput`` as vLLM's: one completion that stopped, the stop token left out, with
    each token's log-prob (-0.1, -0.2, ...) when they were asked for."""
    logprobs = None
    if sampling_params.get("logprobs") is not None:
        logprobs = [{t: SimpleNamespace(logprob=-0.1 * (i + 1))} for i, t in enumerate(token_ids)]
    completion = SimpleNamespace(token_ids=token_ids, finish_reason="stop", logprobs=logprobs)
    return SimpleNamespace(outputs=[completion])


@ray.remote(num_cpus=0)
class FakeEngine:
    """``RolloutRayActor.generate``'s signature; answers like vLLM, the stop token dropped."""

    def __init__(self, index: int) -> None:
        self.index, self.prompts = index, []

    def generate(self, prompt_token_ids: list[int], sampling_params: dict[str, Any]) -> Any:
        self.prompts.append(bytes(prompt_token_ids).decode())
        text = RESPONSES[(len(self.prompts) + self.index) % len(RESPONSES)]
        return vllm_output(list(text.encode())[: sampling_params["max_tokens"]], sampling_params)

    def seen(self) -> list[str]:
        return self.prompts


@ray.remote(num_cpus=0)
class PromptEngine:
    """Answers with a function of the prompt alone (as greedy decoding), after a wait that also
    depends on it, so concurrent requests finish out of order (as an engine's batch does)."""

    def __init__(self) -> None:
        self.prompts: list[str] = []

    async def generate(self, prompt_token_ids: list[int], sampling_params: dict[str, Any]) -> Any:
        prompt = bytes(prompt_token_ids).decode()
        self.prompts.append(prompt)
        digest = zlib.crc32(prompt.encode())
        await asyncio.sleep(digest % 20 / 1000)
        text = RESPONSES[digest % len(RESPONSES)]
        return vllm_output(list(text.encode()), sampling_params)

    def seen(self) -> list[str]:
        return self.prompts


@pytest.fixture(scope="module")
def cluster() -> Any:
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # actors defined here travel by value
    ray.init(num_cpus=2, include_dashboard=False)
    yield
    ray.shutdown()


@pytest.fixture
def config(tmp_path: Path) -> Any:
    return load_config(
        None,
        [
            "env.name=rooms",
            "env.max_steps=3",
            "env.num_groups=2",
            "env.group_size=3",
            "env.num_workers=2",
            "env.kwargs={min_rooms: 2, max_rooms: 3, lock_probability: 0.0}",
            "generation.max_new_tokens=64",
            "advantage.mode=mean_norm",
            f"train.output_dir={tmp_path}",
            "train.iterations=2",
            "train.save_every=1",
            "update.mini_batch_size=8",
            "update.micro_batch_size=2",
            "logging.tensorboard=false",
            "logging.progress_bar=false",
        ],
    )


def ray_pool(config: Any) -> Any:
    return make_pool(
        config.env,
        config.env.num_groups,
        config.env.group_size,
        seed=0,
        pool_options={"backend": "ray", "ray_actor_options": {"num_cpus": 1}},
    )


def engine_generator(
    config: Any, engines: list[Any], max_len: int = 4096, record_logprobs: bool = False
) -> EngineGenerator:
    return EngineGenerator(
        engines,
        ByteTokenizer(),
        config.generation,
        max_len,
        make_params=dict,
        record_logprobs=record_logprobs,
    )


def test_env_actors_engines_steps_and_groups_end_to_end(cluster: None, config: Any) -> None:
    engines = [FakeEngine.remote(i) for i in range(2)]
    pool = ray_pool(config)
    try:
        assert pool.backend == "ray"  # the pool option reached the pool
        batch = collect_rollouts(pool, engine_generator(config, engines), seeds=[11, 12])
    finally:
        pool.close()
    episodes = batch.episodes
    assert len(batch) == episodes.length.sum() == 2 * 3 * 3  # no Rooms task is solved by looking around
    assert batch.invalid.sum() > 0 and (~batch.invalid).sum() > 0  # "no action" is an invalid response
    for row in range(len(batch)):  # each step is its own prompt/response sample, the stop token restored
        assert batch.response_ids[row][-1] == IM_END
        assert bytes(batch.prompt_ids[row].tolist()).decode().startswith("<|im_start|>user\n")
    for group in (0, 1):  # members of a group start in the same state and share level 0 at step 0
        first = batch.fingerprints[(batch.group_id == group) & (batch.step == 0)]
        assert len(first) == 3 and (first[:, 0] == first[0, 0]).all() and (first[:, 1:] == 0).all()
    seen = ray.get([engine.seen.remote() for engine in engines])
    assert all(seen) and sum(map(len, seen)) == len(batch)
    assert all(
        len({p.split("Your task is to:")[1].split("\n")[0] for p in prompts}) == 1 for prompts in seen
    ), "each engine should serve one task group (shared prefixes)"

    advantages = batch.credit(config.advantage).advantages
    samples, _ = step_experiences(batch, advantages, multiple=4, end_ids=[IM_END, EOS])
    maker = make_maker()
    expected = assert_experience_advantages(
        maker.compute_advantages_and_returns(maker.split_rollout_samples(samples)), batch, config.advantage
    )
    assert_estimator_matters(expected, batch, config.advantage)


def test_per_episode_loops_on_the_engines_play_the_lockstep_episodes(cluster: None, config: Any) -> None:
    """Each episode's request goes to its group's engine as soon as its env step returns
    (``EngineGenerator.submit``); with responses that depend on the prompt alone, the rollout is
    the lockstep one, the engines' sampling log-probs included."""
    pool = ray_pool(config)
    try:
        batches = []
        for agent_loop in ("lockstep", "per_episode"):
            engines = [PromptEngine.remote() for _ in range(2)]
            generator = engine_generator(config, engines, record_logprobs=True)
            batch = collect_rollouts(pool, generator, seeds=[11, 12], agent_loop=agent_loop)
            batches.append(batch)
        seen = ray.get([engine.seen.remote() for engine in engines])
    finally:
        pool.close()
    lockstep, per_episode = batches
    for name in ("group_id", "traj_id", "step", "reward", "invalid", "fingerprints", "action_key"):
        np.testing.assert_array_equal(getattr(lockstep, name), getattr(per_episode, name), err_msg=name)
    assert [r.tolist() for r in lockstep.response_ids] == [r.tolist() for r in per_episode.response_ids]
    for ours, theirs in zip(lockstep.behaviour_logprobs, per_episode.behaviour_logprobs):
        np.testing.assert_array_equal(ours, theirs)  # NaN where NaN
    assert lockstep.invalid.any() and not lockstep.invalid.all()
    assert all(
        len({p.split("Your task is to:")[1].split("\n")[0] for p in prompts}) == 1 for prompts in seen
    ), "each engine should serve one task group (shared prefixes)"


def test_the_engines_log_probs_ride_with_each_sample_and_the_policy_fills_a_missing_one(
    cluster: None, config: Any
) -> None:
    """Asked for them (``update.off_policy_correction``), the engines' log-probs of the sampled
    tokens reach ``rollout_log_probs`` on the response's columns; the stop token vLLM left out, and
    the trainer restored, has none (NaN) until the experience maker gives it the policy's own."""
    pool = ray_pool(config)
    try:
        batch = collect_rollouts(
            pool, engine_generator(config, [PromptEngine.remote()], record_logprobs=True), seeds=[11, 12]
        )
    finally:
        pool.close()
    for response, logprobs in zip(batch.response_ids, batch.behaviour_logprobs):
        n = len(response) - 1  # the engine's tokens, then the restored stop token
        np.testing.assert_allclose(logprobs[:n], -0.1 * np.arange(1, n + 1), rtol=1e-6)
        assert response[-1] == IM_END and np.isnan(logprobs[-1])
    advantages = batch.credit(config.advantage).advantages
    samples, layout = step_experiences(batch, advantages, multiple=4, end_ids=[IM_END, EOS])
    for sample, row, padding in zip(samples, layout.source, layout.padding):
        sample.action_log_probs = torch.full(sample.action_mask.shape, -7.0)  # the policy's, as made
        expected = np.zeros(sample.action_mask.shape[1], dtype=np.float32)
        if not padding:
            expected[len(batch.prompt_ids[row]) - 1 :] = np.nan_to_num(
                batch.behaviour_logprobs[row], nan=-7.0
            )
        filled = make_maker().compute_advantages_and_returns([sample])[0].rollout_log_probs
        np.testing.assert_allclose(filled[0].numpy(), expected, rtol=1e-6)


def test_a_request_the_rollout_abandoned_is_dropped_when_its_engine_answers(
    cluster: None, config: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A stopped rollout cancels its pending requests; the engine still answers them, later, and
    their callbacks leave them be (a callback that raises is logged by concurrent.futures)."""
    generator = engine_generator(config, [PromptEngine.remote()])
    with caplog.at_level(logging.ERROR, logger="concurrent.futures"):
        pending = [generator.submit(f"prompt {i}", None, None, group=0) for i in range(8)]
        cancelled = [future.cancel() for future in pending]
        answered = generator.submit("the next rollout's prompt", None, None, group=0).result(timeout=60)
        time.sleep(0.5)  # the cancelled requests' answers came first (one engine, in order)
    assert all(cancelled) and all(future.cancelled() for future in pending)
    assert answered.text in RESPONSES
    assert not caplog.records, caplog.text


def test_prompt_longer_than_max_len_is_a_clear_error(cluster: None, config: Any) -> None:
    generator = engine_generator(config, [FakeEngine.remote(0)], max_len=10)
    with pytest.raises(PromptTooLongError, match="env.max_prompt_tokens"):
        generator.generate(["a long prompt than ten tokens"])


class RecordingGroup:
    """The policy's actor group as OpenRLHF's ``broadcast_to_vllm`` calls it, recording the call."""

    def __init__(self, calls: list[tuple[Any, ...]]) -> None:
        self.calls = calls

    def async_run_method(self, method_name: str, **kwargs: Any) -> list[Any]:
        self.calls.append(("broadcast",) if method_name == "broadcast_to_vllm" else (method_name,))
        return []


class RecordingTrainer(HGPOTrainer):
    """HGPOTrainer with OpenRLHF's GPU steps replaced by recorders (no DeepSpeed, no vLLM).

    ``train_step`` waits up to ``overlap_wait`` s for the next iteration's rollout to start (an
    asynchronous run's rollout runs during the update) and then, as OpenRLHF's does, syncs."""

    overlap_wait = 0.0

    def collect(self, iteration: int, abandon: Any) -> Any:
        self.calls.append(("collect", iteration))
        self.started[iteration].set()
        return super().collect(iteration, abandon)

    def train_step(self, rollout_samples: list[Any], global_step: int) -> tuple[dict[str, Any], int]:
        experiences = self.experience_maker.compute_advantages_and_returns(
            self.experience_maker.split_rollout_samples(rollout_samples)
        )
        # what the PPO update would get: the advantages of this iteration's batch
        assert_experience_advantages(experiences, self.trained, self.config.advantage)
        self.calls.append(("train_step", global_step, len(rollout_samples), len(experiences)))
        if global_step + 1 < self.config.train.iterations:
            self.started[global_step + 1].wait(self.overlap_wait)
        self.broadcast_to_vllm()
        return {"policy_loss": 0.25, "timing/ppo_train": 0.1, "rollout/reward_mean": 9.0}, global_step + 1

    def make_samples(self, batch: Any, advantages: Any) -> Any:
        self.trained = batch
        return super().make_samples(batch, advantages)

    def start_save(self, iteration: int) -> None:
        self.calls.append(("save", iteration))

    def init_checkpoint_states(self) -> dict[str, Any]:
        return {"global_step": self.resume_from}


def recording_trainer(config: Any, resume_from: int) -> RecordingTrainer:
    trainer = object.__new__(RecordingTrainer)
    trainer.config, trainer.cluster = config, OpenRLHFConfig()
    trainer.args = SimpleNamespace(vllm=SimpleNamespace(enable_sleep=False))
    trainer.run_dir, trainer.multiple, trainer.calls, trainer.resume_from = (
        Path(config.train.output_dir),
        8,
        [],
        resume_from,
    )
    trainer.actor_model_group = RecordingGroup(trainer.calls)
    trainer.vllm_engines = []
    trainer.weights = EngineWeights(0, EngineLock() if config.train.async_staleness else None)
    trainer.started = defaultdict(threading.Event)
    trainer.generator = engine_generator(config, [FakeEngine.remote(0)])
    trainer.pool = ray_pool(config)
    trainer.num_tasks = count_tasks(config.env)
    trainer.evaluator = SimpleNamespace(close=lambda: None)
    trainer.experience_maker = make_maker(micro=2)
    trainer.measure_gap = False  # the fake engine cannot score prompts; tests/openrlhf_cpu measures it
    trainer.constraints = None
    trainer.saving = []  # no checkpoint in flight: save() only records
    return trainer


def test_controller_loop_logs_saves_and_resumes(cluster: None, config: Any) -> None:
    from hgpo_train.run.tracking import read_metrics

    trainer = recording_trainer(config, resume_from=0)
    trainer.fit()
    steps = [c for c in trainer.calls if c[0] == "train_step"]
    assert [c[1] for c in steps] == [0, 1] and all(c[2] % 8 == 0 and c[3] == c[2] // 2 for c in steps)
    assert ("save", 1) in trainer.calls and ("save", 2) in trainer.calls
    assert [c[0] for c in trainer.calls if c[0] != "save"] == ["collect", "train_step", "broadcast"] * 2
    records = read_metrics(trainer.run_dir / "metrics.jsonl")
    assert [r["iteration"] for r in records] == [1, 2]
    assert records[0]["update/loss"] == 0.25 and records[0]["rollout/step_samples"] == 18
    assert "rollout/reward_mean" not in records[0] and records[0]["rollout/padding_samples"] == 6
    assert all(r["rollout/staleness_max"] == 0 for r in records)  # synchronous: sampled by the trained policy

    resumed = recording_trainer(config.model_copy(), resume_from=1)
    resumed.fit()
    assert resumed.calls[0] == ("broadcast",)  # the engines get the checkpoint's weights first
    assert [c[1] for c in resumed.calls if c[0] == "train_step"] == [1]
    assert [r["iteration"] for r in read_metrics(resumed.run_dir / "metrics.jsonl")] == [1, 2]
    assert read_metrics(resumed.run_dir / "metrics.jsonl")[-1]["rollout/staleness_max"] == 0


def test_an_asynchronous_controller_samples_the_next_rollout_during_the_update(
    cluster: None, config: Any
) -> None:
    """``train.async_staleness: 1``: iteration i+1's rollout starts while update i runs, under the
    engines' weights of version i (the sync waits for it on OpenRLHF's VLLMLock), so its steps are
    exactly one version stale; the first rollout is fresh. Same tasks, whole groups."""
    from hgpo_train.run.tracking import read_metrics

    train = config.train.model_copy(update={"async_staleness": 1, "iterations": 3})
    config = config.model_copy(update={"train": train})
    trainer = recording_trainer(config, resume_from=0)
    trainer.overlap_wait = 60.0
    trainer.fit()
    calls = trainer.calls
    syncs = [k for k, call in enumerate(calls) if call == ("broadcast",)]
    assert all(calls.index(("collect", i + 1)) < syncs[i] for i in range(2))  # the rollout ahead began first
    records = read_metrics(trainer.run_dir / "metrics.jsonl")
    assert [r["rollout/staleness_max"] for r in records] == [0, 1, 1]
    assert [r["rollout/staleness_mean"] for r in records] == [0, 1, 1]
    assert all(r["rollout/step_samples"] == 18 for r in records)  # every group whole, every step in


def test_trainer_actor_is_bound_to_the_run_and_pinned_to_this_node(cluster: None, config: Any) -> None:
    cluster_settings = OpenRLHFConfig()
    bound = trainer_actor(config, cluster_settings)
    assert bound.actor_class.__ray_actor_class__ is HGPOTrainer
    assert bound.config is config and bound.cluster is cluster_settings
    options = bound.actor_class._default_options
    assert options["scheduling_strategy"].node_id == ray.get_runtime_context().get_node_id()


def test_engine_gap_above_the_threshold_warns(capsys: pytest.CaptureFixture[str]) -> None:
    import numpy as np

    from hgpo_train.openrlhf.gap import gap_metrics

    trainer = object.__new__(HGPOTrainer)
    trainer.cluster = OpenRLHFConfig(engine_gap_warning=0.05)
    policy = {3: np.array([-1.0, -2.0])}
    synced = trainer.gap_warning(gap_metrics([{3: np.array([-1.0, -2.01])}], policy))
    assert synced["engine_gap/mean"] == pytest.approx(0.005) and capsys.readouterr().err == ""
    stale = trainer.gap_warning(
        gap_metrics([{3: np.array([-1.0, -2.0])}, {3: np.array([-1.3, -2.1])}], policy)
    )
    assert stale["engine_gap/mean_engine1"] == pytest.approx(0.2) and stale["engine_gap/mean_engine0"] == 0
    warning = capsys.readouterr().err
    assert "engine-policy gap 0.2000" in warning and "openrlhf.engine_gap_warning=0.05" in warning
