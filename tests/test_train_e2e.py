"""End to end on the CPU with a tiny model: rollout -> StepBatch -> advantages -> loss -> optimizer
step -> checkpoint -> a resumed run that continues exactly like an uninterrupted one.

Rooms always; ALFWorld on the shared games and WebShop on the shared catalog through the
``shared_data`` fixture (and only once their envs are registered).
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch
from reference_credit import batch_reference_advantages

import hgpo_env
from hgpo_env.tools.panel import build_panel
from hgpo_train.advantage import ESTIMATORS, AdvantageConfig, MVPOState
from hgpo_train.config import ENV_IDS, EnvConfig, LoggingConfig, load_config
from hgpo_train.evaluation.evaluate import main as eval_main
from hgpo_train.local.train import IterationResult, Trainer
from hgpo_train.rollout.batch import StepBatch
from hgpo_train.rollout.collect import make_pool
from hgpo_train.run.checkpoint import latest_checkpoint, list_checkpoints
from hgpo_train.run.tracking import MetricsLogger, read_metrics
from hgpo_train.update.modeling import ModelLoadError

TINY = [
    "model.name_or_path=tiny",
    "model.dtype=float32",
    "tiny.hidden_size=32",
    "tiny.intermediate_size=64",
    "tiny.num_layers=1",
    "tiny.num_heads=2",
    "tiny.vocab_size=400",
    "tiny.corpus_episodes=4",
    "env.num_groups=2",
    "env.group_size=2",
    "env.num_workers=1",
    "env.response_format=plain",
    "generation.constrained=true",
    "generation.max_new_tokens=24",
    "update.lr=1e-3",
    "update.mini_batch_size=8",
    "update.micro_batch_size=4",
    "update.kl_coef=0.01",
    "train.save_every=1",
    "logging.progress_bar=false",
]
ROOMS = TINY + [
    "env.max_steps=4",
    "env.kwargs={min_rooms: 2, max_rooms: 3, lock_probability: 0.0}",
    "generation.max_new_tokens=5",  # cuts some commands short: invalid steps make the advantages differ
]


def assert_estimator_matters(advantages: np.ndarray, batch: StepBatch, config: AdvantageConfig) -> None:
    """Every other estimator gives other advantages on this batch, so the comparison can fail.

    Without a reward, graph returns are the same for every step (all at distance 1) and G2PO's
    state values are all 0, so GraphGPO and G2PO equal GiGPO there (each credits only the invalid
    penalty within the state), as they should; and CRBC, whose step credit needs a success, is
    GRPO exactly. Those are then not compared.
    """
    rollouts = batch.group_id * (int(batch.traj_id.max(initial=0)) + 1) + batch.traj_id
    others = set(ESTIMATORS) - {config.estimator}
    if not (np.bincount(rollouts, weights=batch.reward) > 0).any():
        for alike in ({"gigpo", "graphgpo", "g2po"}, {"grpo", "crbc"}):
            if config.estimator in alike:
                others -= alike
    for other in others:
        gap = np.abs(advantages - batch_reference_advantages(batch, replace(config, estimator=other))).max()
        assert gap > 1e-3, f"{config.estimator} and {other} agree on this batch: it cannot tell them apart"


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _trainer(env: str, run_dir, overrides: list[str]) -> Trainer:
    return Trainer(load_config(env=env, overrides=overrides + [f"train.output_dir={run_dir}"]))


def _one_iteration_checks(trainer: Trainer) -> IterationResult:
    """A StepBatch, the configured advantages, a finite loss, and an optimizer step that changes
    the weights."""
    before = _weights(trainer.model)
    result = trainer.run_iteration(0)
    batch, metrics = result.batch, result.metrics
    assert len(batch) > 0 and len(batch.episodes) == 4
    assert batch.fingerprints.shape[1] == trainer.config.env.history_length + 1
    expected = batch_reference_advantages(batch, trainer.config.advantage)
    np.testing.assert_allclose(result.advantages, expected, rtol=0, atol=1e-9)
    assert np.isfinite(metrics["update/loss"]) and metrics["update/optimizer_steps"] >= 1
    after = _weights(trainer.model)
    assert any(not torch.equal(before[k], after[k]) for k in before)
    path = trainer.save(1)
    assert {p.name for p in path.iterdir()} >= {
        "model",
        "optimizer.pt",
        "rng.pt",
        "config.yaml",
        "state.json",
    }
    return result


def test_rooms_iteration_checkpoint_exact_resume_and_eval(tmp_path, capsys):
    straight = _trainer("rooms", tmp_path / "straight", ROOMS + ["train.iterations=2"])
    try:
        straight.fit()
        final = _weights(straight.model)
    finally:
        straight.close()
    tiny = ["model.name_or_path=" + str(tmp_path / "straight" / "tiny_model")]  # built once, reused

    first = _trainer("rooms", tmp_path / "resumed", ROOMS + tiny + ["train.iterations=1"])
    try:
        result = _one_iteration_checks(first)  # then fit() resumes from the checkpoint it saved
        assert first.config.advantage.estimator == "hgpo"
        assert_estimator_matters(result.advantages, result.batch, first.config.advantage)
    finally:
        first.close()
    resumed = _trainer("rooms", tmp_path / "resumed", ROOMS + tiny + ["train.iterations=2"])
    try:
        assert resumed.start_iteration == 1
        resumed.fit()
        for key, value in _weights(resumed.model).items():
            torch.testing.assert_close(value, final[key], rtol=0, atol=0, msg=key)
    finally:
        resumed.close()

    def comparable(path, iteration):
        return [
            {k: v for k, v in r.items() if not k.startswith(("time/", "throughput/"))}
            for r in read_metrics(path)
            if r["iteration"] == iteration
        ]

    assert comparable(tmp_path / "resumed" / "metrics.jsonl", 2) == comparable(
        tmp_path / "straight" / "metrics.jsonl", 2
    )
    assert [p.name for p in list_checkpoints(tmp_path / "resumed")] == ["iter_000001", "iter_000002"]
    assert (tmp_path / "straight" / "config.yaml").is_file()
    assert any((tmp_path / "straight" / "tensorboard").iterdir())

    with pytest.raises(ValueError, match="already has checkpoints"):
        _trainer("rooms", tmp_path / "straight", ROOMS + ["train.iterations=3", "train.resume=false"])

    out = tmp_path / "results.json"
    argv = [
        "--run",
        str(tmp_path / "straight"),
        "--output",
        str(out),
        "eval.tasks=[0, 1, 2]",
        "--eval.seeds",  # as OpenRLHF users type keys: the same override
        "[0, 1]",
    ]
    assert eval_main(argv) == 0
    results = json.loads(out.read_text())
    assert len(results["episodes"]) == 6 and {e["task_id"] for e in results["episodes"]} == {0, 1, 2}
    assert 0.0 <= results["metrics"]["success_rate"] <= 1.0
    assert any(k.startswith("success_rate/") for k in results["metrics"])
    assert '"success_rate"' in capsys.readouterr().out
    # the tasks played are a panel: the same hash as the panel built apart from the run
    rooms = {"min_rooms": 2, "max_rooms": 3, "lock_probability": 0.0}
    panel = build_panel("HGPO-Rooms-v0", "eval", [0, 1, 2], rooms)
    assert results["panel"]["sha256"] == panel.hash and results["panel"]["size"] == 3
    assert results["settings"] == {"seeds": [0, 1], "temperature": 1.0, "passes": 1, "constrained": True}
    assert results["provenance"]["config_sha256"] and "torch" in results["provenance"]["packages"]
    assert (results["run"]["method"], results["run"]["train_seed"]) == ("hgpo", 0)  # what compare groups by
    assert results["metrics"]["pass@2"] >= results["metrics"]["success_rate"]
    # a panel of other tasks under the same ids (another data version) is refused in one line
    manifest = tmp_path / "panel.json"
    other_data = {**rooms, "min_rooms": 4, "max_rooms": 5}
    manifest.write_text(json.dumps(build_panel("HGPO-Rooms-v0", "eval", [0, 1, 2], other_data).to_json()))
    assert eval_main([*argv, f"eval.panel={manifest}"]) == 2
    assert "panel error: task 0 is another task here than in eval.panel" in capsys.readouterr().err
    # a shipped panel by name: its tasks are played (not eval.tasks'), and Rooms' shipped one is of
    # the default houses, not these small ones: refused at its first task
    assert eval_main([*argv, "eval.panel=HGPO-Rooms-v0.eval"]) == 2
    assert "panel error: task 0 is another task here than in eval.panel" in capsys.readouterr().err
    assert eval_main([*argv, "eval.panel=HGPO-WebShop-v0.test"]) == 2  # another env
    assert "eval.panel HGPO-WebShop-v0.test is HGPO-WebShop-v0 test" in capsys.readouterr().err


def test_chat_prompts_and_tool_calls_train_on_the_sampled_tokens(tmp_path):
    """``prompt_format: chat``, ``response_format: tool_call``: each prompt is rendered once by
    the policy's template (tools, past calls, tool messages) and trained as sampled; what is
    trained is the reply (one admissible call, constrained) and its end-of-turn token."""
    chat = ["env.prompt_format=chat", "env.response_format=tool_call", "generation.max_new_tokens=48"]
    trainer = _trainer("rooms", tmp_path, ROOMS + chat + ["train.iterations=1"])
    try:
        result = _one_iteration_checks(trainer)
        batch, tokenizer = result.batch, trainer.tokenizer
        assert result.metrics["rollout/invalid_rate"] == 0.0
        calls = 0
        for prompt_ids, response_ids, step in zip(batch.prompt_ids, batch.response_ids, batch.step):
            prompt = tokenizer.decode(prompt_ids)
            assert prompt.startswith('<|im_start|>tools\n{"type": "function", "function": {"name": "act"')
            assert prompt.endswith("<|im_end|>\n<|im_start|>assistant\n") and "Admissible actions:" in prompt
            calls += prompt.count("</tool_call>")
            assert ("<|im_start|>tool\n" in prompt) == (step > 0)  # an observation answers each past call
            reply = tokenizer.decode(response_ids)
            assert reply.startswith('<tool_call>\n{"name": "act", "arguments": {"command": "')
            assert reply.endswith("}}\n</tool_call><|im_end|>") and reply.count("<|im_end|>") == 1
        assert calls > 0
    finally:
        trainer.close()


def test_g2po_trains_an_iteration(tmp_path):
    trainer = _trainer("rooms", tmp_path, ROOMS + ["advantage.estimator=g2po", "train.iterations=1"])
    try:
        result = _one_iteration_checks(trainer)
        assert_estimator_matters(result.advantages, result.batch, trainer.config.advantage)
    finally:
        trainer.close()


def test_crbc_trains_an_iteration_and_logs_what_its_closure_saw(tmp_path):
    # whole, valid commands sampled hot over a longer horizon: some rollouts win (3 of 4 with
    # these seeds), so there is step credit to compare
    overrides = [
        "advantage.estimator=crbc",
        "generation.constrained=true",
        "generation.max_new_tokens=32",
        "generation.temperature=3.0",
        "env.max_steps=30",
        "env.kwargs={min_rooms: 2, max_rooms: 2, lock_probability: 0.0, min_distractors: 0, max_distractors: 0, max_task_items: 1}",
        "env.num_groups=1",
        "env.group_size=4",
    ]
    trainer = _trainer("rooms", tmp_path, ROOMS + overrides + ["train.iterations=1"])
    try:
        result = _one_iteration_checks(trainer)
        assert_estimator_matters(result.advantages, result.batch, trainer.config.advantage)
        metrics = result.metrics
        evidence = [
            "keys/merging/eligible_share",
            "keys/merging/all_rollouts_share/k0",
            "keys/merging/all_rollouts_share/closure",
            "crbc/nonzero_step_credit_share",
        ]
        assert all(0.0 <= metrics[name] <= 1.0 for name in evidence)
        if result.batch.episodes.won.any():  # 3 of 4 rollouts here; random play wins most of the time
            assert metrics["crbc/nonzero_step_credit_share"] > 0
        else:  # no success anywhere: no step credit, CRBC is GRPO exactly (the spec's property)
            grpo = batch_reference_advantages(
                result.batch, replace(trainer.config.advantage, estimator="grpo")
            )
            assert metrics["crbc/nonzero_step_credit_share"] == 0 and (result.advantages == grpo).all()
        assert (
            metrics["keys/merging/all_rollouts_share/closure"]
            >= metrics["keys/merging/all_rollouts_share/k0"]
        )
    finally:
        trainer.close()


def test_mvpo_trains_on_the_env_milestones_and_resumes_its_state(tmp_path):
    # locked houses: the key milestones can fire; 4 steps with a tiny model win nothing, so every
    # group failed alike, the case MVPO is for
    overrides = ["advantage.estimator=mvpo", "env.kwargs={min_rooms: 2, max_rooms: 3, lock_probability: 1.0}"]
    first = _trainer("rooms", tmp_path, ROOMS + overrides + ["train.iterations=1"])
    try:
        result = _one_iteration_checks(first)  # the reference: the first iteration, from w_0
        assert_estimator_matters(result.advantages, result.batch, first.config.advantage)
        progress = result.batch.progress
        assert progress is not None and progress.milestones.shape == (len(result.batch), 5)
        assert (
            progress.signatures[1:][result.batch.step[1:] > 0]
            == progress.next_signatures[:-1][result.batch.step[1:] > 0]
        ).all()
        metrics = result.metrics
        shares = [metrics[f"mvpo/{name}_share"] for name in ("singleton", "anchor", "potential")]
        assert sum(shares) == pytest.approx(1.0) and 0.05 <= metrics["mvpo/kappa"] <= 1.0
        carried = first.advantage_state
        assert carried is not None and carried["weights"] != [0.2, 0.3, 0.5, 10.0, 0.0]  # updated (E11)
        saved = json.loads((latest_checkpoint(tmp_path) / "state.json").read_text())
        assert saved["advantage_state"] == carried
    finally:
        first.close()
    resumed = _trainer("rooms", tmp_path, ROOMS + overrides + ["train.iterations=2"])
    try:
        assert resumed.advantage_state == carried
        second = resumed.run_iteration(1)
        expected = batch_reference_advantages(
            second.batch, resumed.config.advantage, MVPOState.from_dict(carried)
        )
        np.testing.assert_allclose(second.advantages, expected, rtol=0, atol=1e-9)
        fresh = batch_reference_advantages(second.batch, resumed.config.advantage)
        assert np.abs(second.advantages - fresh).max() > 0 or not second.metrics["mvpo/potential_share"]
    finally:
        resumed.close()


def test_rooms_lora_reference_and_resume(tmp_path):
    lora = ROOMS + [
        "model.lora_rank=4",
        "model.lora_target_modules=[q_proj, v_proj]",
        "model.gradient_checkpointing=true",
        "advantage.estimator=gigpo",
    ]
    trainer = _trainer("rooms", tmp_path, lora + ["train.iterations=1"])
    try:
        frozen = {k: v for k, v in _weights(trainer.model).items() if "lora_" not in k}
        result = _one_iteration_checks(trainer)
        assert_estimator_matters(result.advantages, result.batch, trainer.config.advantage)
        for key, value in _weights(trainer.model).items():
            if "lora_" not in key:
                assert torch.equal(value, frozen[key]), f"base weight {key} changed under LoRA"
        assert trainer.reference.model is trainer.model  # adapters disabled, no second copy
        adapters = {k: v for k, v in _weights(trainer.model).items() if "lora_" in k}
    finally:
        trainer.close()
    resumed = _trainer("rooms", tmp_path, lora + ["train.iterations=2"])
    try:
        assert resumed.start_iteration == 1
        for key, value in adapters.items():
            assert torch.equal(_weights(resumed.model)[key], value)
    finally:
        resumed.close()


def test_unreachable_model_fails_clearly(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(
        ModelLoadError,
        match="'no-such-org/no-such-model' is not in the local cache and HF_HUB_OFFLINE.*tiny-model",
    ):
        _trainer("rooms", tmp_path, ROOMS + ["model.name_or_path=no-such-org/no-such-model"])


@pytest.mark.parametrize(
    "env, kwargs",
    [
        ("alfworld", ["env.max_steps=3", "env.kwargs.split=valid_seen", "advantage.estimator=grpo"]),
        ("webshop", ["env.max_steps=3", "generation.constrained=true"]),  # search slots included
    ],
)
def test_real_benchmark_one_iteration(env, kwargs, shared_data, tmp_path):
    if ENV_IDS[env] not in hgpo_env.ENV_CLASSES:
        pytest.skip(f"{ENV_IDS[env]} is not registered yet")
    data = {"alfworld": shared_data / "alfworld", "webshop": shared_data / "webshop"}[env]
    trainer = _trainer(
        env,
        tmp_path,
        TINY + kwargs + [f"env.kwargs.data_path={data}", "train.iterations=1", "eval.tasks=null"],
    )
    try:
        _one_iteration_checks(trainer)
        assert len(trainer.evaluator.task_ids()) == {"alfworld": 140, "webshop": 500}[env]  # the whole split
    finally:
        trainer.close()


def test_make_pool_sends_pool_options_to_the_pool_and_env_kwargs_to_the_envs():
    env = EnvConfig(name="rooms", max_steps=5, num_workers=1, kwargs={"min_rooms": 2, "max_rooms": 3})
    with make_pool(
        env, 1, 2, seed=0, env_kwargs={"max_steps": 1}, pool_options={"step_timeout": 7.5}
    ) as pool:
        assert (pool.backend, pool.step_timeout) == ("process", 7.5)
        pool.reset(seeds=[0])
        results = pool.step({0: "look", 1: "look"})
        assert all(r.truncated for r in results)  # the env kwarg overrode env.max_steps in every env
    with pytest.raises(ValueError, match=r"unknown pool options \['step_timout'\]"):
        make_pool(env, 1, 2, seed=0, pool_options={"step_timout": 7.5})
    with pytest.raises(TypeError, match="step_timeout"):  # a pool option is never taken from the env kwargs
        make_pool(env, 1, 2, seed=0, env_kwargs={"step_timeout": 7.5})


def test_a_kill_leaves_only_complete_checkpoints_and_trimmed_metrics(tmp_path):
    (tmp_path / "checkpoints" / "iter_000002").mkdir(parents=True)
    (tmp_path / "checkpoints" / "iter_000002" / "state.json").write_text('{"iteration": 2}')
    (tmp_path / "checkpoints" / ".tmp-abc").mkdir()  # a save cut short by the kill
    assert latest_checkpoint(tmp_path).name == "iter_000002"
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(
        "".join(json.dumps({"iteration": i, "x": i}) + "\n" for i in range(4)) + '{"iteration": 4, "x"'
    )
    MetricsLogger(tmp_path, LoggingConfig(tensorboard=False), start_iteration=2).close()
    assert [r["iteration"] for r in read_metrics(metrics)] == [0, 1, 2]


def test_a_third_party_preset_trains_by_id(tmp_path):
    """HGPO-TextWorldExpress-v0 (Java engine) from its config: one checked iteration, then the
    command line for two iterations with evaluation."""
    from hgpo_train.cli import main

    config = "configs/textworld_express_coin_demo.yaml"
    small = TINY + ["env.max_steps=6", "eval.tasks=[0,1]", "train.eval_every=2"]
    trainer = Trainer(load_config(config, small + [f"train.output_dir={tmp_path / 'api'}"]))
    try:
        assert trainer.config.env.env_id == "HGPO-TextWorldExpress-v0"
        result = _one_iteration_checks(trainer)
        assert all(
            task.startswith("Your task is to search the environment") for task in result.batch.episodes.task
        )
    finally:
        trainer.close()
    assert (
        main(["--config", config, *small, "train.iterations=2", f"train.output_dir={tmp_path / 'cli'}"]) == 0
    )
    metrics = read_metrics(tmp_path / "cli" / "metrics.jsonl")
    assert [r["iteration"] for r in metrics if "rollout/success_rate" in r] == [1, 2]
    assert any("eval/success_rate" in r for r in metrics)


def test_training_with_the_env_workers_behind_an_env_server(tmp_path):
    """Two iterations with the envs served over OpenEnv give the metrics of the same run in process."""
    from serve_helpers import running_server

    small = ROOMS + ["train.iterations=2", "eval.tasks=[0,1]", "train.eval_every=2", "env.num_workers=2"]
    local = _trainer("rooms", tmp_path / "local", small)
    try:
        local.fit()
    finally:
        local.close()
    served = ["response_format=plain", "max_steps=4", "min_rooms=2", "max_rooms=3", "lock_probability=0.0"]
    with running_server("HGPO-Rooms-v0", *served) as (url, _):  # the operator's arguments: the trainer's
        remote = _trainer(
            "rooms", tmp_path / "remote", [*small, "env.backend=openenv", f"env.servers=[{url}]"]
        )
        try:
            assert remote.pool.backend == "openenv"
            remote.fit()
        finally:
            remote.close()
    runs = [read_metrics(tmp_path / name / "metrics.jsonl") for name in ("local", "remote")]
    keys = sorted(
        {k for r in runs[0] for k in r if k.startswith(("rollout/", "eval/success_rate")) and "time" not in k}
    )
    assert {"rollout/success_rate", "rollout/invalid_rate", "rollout/episode_length"} <= set(keys)
    assert [[r.get(k) for k in keys] for r in runs[0]] == [[r.get(k) for k in keys] for r in runs[1]]
    # each evaluation's results file: the logged numbers, and one panel in and out of process
    recorded = [
        json.loads((tmp_path / name / "evals" / "iter_000002.json").read_text())
        for name in ("local", "remote")
    ]
    assert recorded[0]["metrics"]["success_rate"] == runs[0][-1]["eval/success_rate"]
    assert recorded[0]["panel"]["sha256"] == recorded[1]["panel"]["sha256"]
    assert recorded[0]["run"]["method"] == "hgpo" and recorded[0]["provenance"]["checkpoint"] == "iteration 2"


def test_an_iteration_shows_its_progress(tmp_path, capsys):
    """Long iterations say what they are doing: rollout turns, then the update, on the progress bar."""
    overrides = [*ROOMS, "logging.progress_bar=true", "train.iterations=1", f"train.output_dir={tmp_path}"]
    trainer = Trainer(load_config(None, overrides, env="rooms"))
    statuses: list[str] = []
    try:
        trainer.status = statuses.append
        trainer.run_iteration(0)
        trainer.fit()
    finally:
        trainer.close()
    assert statuses[0].startswith("rollout turn 1: ") and "episodes running" in statuses[0]
    assert statuses[-1].startswith("update on ") and len(statuses) >= 3
    assert "rollout turn 1: " in capsys.readouterr().err  # fit() shows them on its bar


def test_the_driver_makes_one_env_per_set_of_arguments(tmp_path, monkeypatch):
    """Counting the tasks checks the arguments; the pools' workers make their own envs, so neither
    the training pool nor the evaluation's later pools make another here (ALFWorld and WebShop
    envs take seconds to make)."""
    from hgpo_train.rollout import collect as rollout

    made = []
    real = rollout._make_env
    monkeypatch.setattr(
        rollout, "_make_env", lambda env, kwargs: made.append(kwargs.get("split")) or real(env, kwargs)
    )
    trainer = _trainer(
        "rooms", tmp_path, ROOMS + ["train.iterations=1", "eval.tasks=[0, 1, 2]", "eval.seeds=[0]"]
    )
    try:
        assert made == [None]  # the training split: count_tasks, not the pool again
        trainer.evaluator.run()
        trainer.evaluator.run()
        assert made == [None, "eval"]  # the held-out split's first pool checks its arguments, once
    finally:
        trainer.close()
