"""TRL integration against the real ``trl`` package (GRPOTrainer), on CPU with a tiny model built here.

Step level: HGPOTrainer runs optimizer steps on Rooms; the advantages that reach TRL's loss are
checked row by row against the estimator applied, in this test, to the steps the trainer played,
whose rewards and fingerprints are in turn checked by replaying the responses in a fresh env.
Environment level: GRPOTrainer with our environment_factory runs an optimizer step; every rollout's
env plays its row's task and its reward reaches TRL. Nothing is mocked.
"""

from __future__ import annotations

import importlib.resources
import json
import re
from collections import Counter, defaultdict
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from integration_setup import ENV_ID, ROOMS, import_error_without
from reference_credit import reference_advantages
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils import get_json_schema
from trl import GRPOConfig, GRPOTrainer

import hgpo_env  # noqa: F401  (registers the HGPO-* ids)
from hgpo_train.advantage import AdvantageConfig, ProgressColumns, mvpo_advantages
from integrations.trl import ADVANTAGE_STATE, HGPOTrainer, StepSample, environment_factory, task_dataset

ENV_KWARGS = {"history_length": 2, "response_format": "plain", "max_steps": 4, **ROOMS}


def grpo_config(tmp_path, **overrides) -> GRPOConfig:
    settings = {
        "output_dir": str(tmp_path),
        "per_device_train_batch_size": 2,
        "gradient_accumulation_steps": 3,  # steps_per_generation 3: three micro-batches per generation
        "num_generations": 2,
        "max_completion_length": 5,  # cuts some commands short: invalid steps make advantages differ
        "max_steps": 2,
        "learning_rate": 1e-2,
        "beta": 0.0,
        "use_cpu": True,
        "report_to": "none",
        "save_strategy": "no",
        "logging_steps": 1,
        "seed": 0,
    }
    return GRPOConfig(**{**settings, **overrides})


class RecordingTrainer(HGPOTrainer):
    """Keeps the episodes of every generation and the inputs of every loss call."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.generations: list[list] = []
        self.group_tasks: list[list[int]] = []
        self.loss_inputs: list[list[dict]] = []
        self.states_used: list[dict | None] = []

    def _generate_and_score_completions(self, inputs):
        self.states_used.append(self.advantage_state)
        batch = super()._generate_and_score_completions(inputs)
        self.generations.append(self.last_episodes)
        self.group_tasks.append([row["task_id"] for row in inputs[:: self.num_generations]])
        self.loss_inputs.append([])
        return batch

    def _compute_loss(self, model, inputs):
        self.loss_inputs[-1].append({k: v.detach().clone() for k, v in inputs.items() if torch.is_tensor(v)})
        return super()._compute_loss(model, inputs)


def replay(episode, task_id: int) -> list[tuple[float, bool, tuple[int, ...]]]:
    """(reward, invalid, fingerprints of the prompt) of each step, from a fresh env fed the same responses."""
    env = gym.make(ENV_ID, **ENV_KWARGS)
    _, info = env.reset(options={"task_id": task_id})
    out = []
    for step in episode.steps:
        fingerprints = tuple(info["fingerprints"])
        _, reward, _, _, info = env.step(step.response.text)
        out.append((float(reward), not info["action_valid"], fingerprints))
    return out


def episode_advantages(episodes, config: AdvantageConfig) -> np.ndarray:
    rows = [(e, s) for e in episodes for s in e.steps]
    return reference_advantages(
        [s.reward for _, s in rows],
        [f"{e.group}/{e.member}" for e, _ in rows],
        [e.group for e, _ in rows],
        [s.invalid for _, s in rows],
        np.array([s.fingerprints for _, s in rows], dtype=np.uint64),
        config,
        action_keys=[s.action_key for _, s in rows],
        won=[e.won for e, _ in rows],
    )


def unpadded(ids: torch.Tensor, mask: torch.Tensor) -> tuple[int, ...]:
    return tuple(ids[mask.bool()].tolist())


def look_bias(tokenizer) -> dict:
    """Generation biases that make the random model answer "look" (always admissible) about half the
    time, so batches mix valid and invalid steps and the advantages are not all zero."""
    look = tuple(tokenizer.encode("look", add_special_tokens=False))
    return {"sequence_bias": {look[:1]: 4.0, look + (tokenizer.eos_token_id,): 12.0}}


@pytest.mark.parametrize("estimator", ["hgpo", "gigpo", "grpo", "crbc"])
def test_step_level_advantages_reach_the_loss(tiny_model, tmp_path, estimator):
    tasks = [3, 8, 21, 40, 57, 60]
    advantage = AdvantageConfig(estimator=estimator, mode="mean_norm")
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    before = [p.detach().clone() for p in model.parameters()]
    trainer = RecordingTrainer(
        model=model,
        args=grpo_config(tmp_path, generation_kwargs=look_bias(tokenizer)),
        processing_class=tokenizer,
        train_dataset=task_dataset(tasks),
        env_id=ENV_ID,
        env_kwargs=ENV_KWARGS,
        advantage=advantage,
        pool_options={"num_workers": 1},
    )
    trainer.train()

    assert trainer.state.global_step == 2
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert len(trainer.generations) == 2
    nonzero = 0
    for episodes, group_tasks, micro_batches in zip(
        trainer.generations, trainer.group_tasks, trainer.loss_inputs
    ):
        assert len(episodes) == 6 and len(micro_batches) == 3
        assert [e.group for e in episodes] == [0, 0, 1, 1, 2, 2]
        # the steps are the env's: replaying each episode's responses on its group's task gives the
        # same rewards, invalid flags and fingerprints
        for e in episodes:
            assert replay(e, group_tasks[e.group]) == [(s.reward, s.invalid, s.fingerprints) for s in e.steps]

        expected = episode_advantages(episodes, advantage)
        nonzero += int(np.abs(expected).max() > 1e-6)
        want: dict[tuple, list[float]] = defaultdict(list)
        for s, a in zip([s for e in episodes for s in e.steps], expected):
            want[(tuple(s.response.prompt_ids), tuple(s.response.completion_ids))].append(round(float(a), 5))
        got: dict[tuple, list[float]] = defaultdict(list)
        for inputs in micro_batches:
            loss_mask = inputs["completion_mask"] * inputs.get(
                "tool_mask", torch.ones_like(inputs["completion_mask"])
            )
            for row in range(len(inputs["advantages"])):
                if not loss_mask[row].any():
                    assert inputs["advantages"][row] == 0  # a padding copy: no tokens in the loss
                    continue
                key = (
                    unpadded(inputs["prompt_ids"][row], inputs["prompt_mask"][row]),
                    unpadded(inputs["completion_ids"][row], inputs["completion_mask"][row]),
                )
                got[key].append(round(float(inputs["advantages"][row]), 5))
        assert {k: Counter(v) for k, v in got.items()} == {k: Counter(v) for k, v in want.items()}
    assert nonzero, "every batch had all-zero advantages: the comparison could not fail"


def test_step_level_chat_prompts_and_tool_calls(tiny_model, tmp_path):
    """With prompt_format="chat" every step's prompt is the env's messages rendered once by the
    policy's template with the env's tools; the env pins that template in its keys' salt, and
    the env's replies to the decoded completions are the steps recorded."""
    chat = {**ENV_KWARGS, "prompt_format": "chat", "response_format": "tool_call"}
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    trainer = RecordingTrainer(
        model=AutoModelForCausalLM.from_pretrained(tiny_model),
        args=grpo_config(tmp_path, max_steps=1, max_completion_length=24),
        processing_class=tokenizer,
        train_dataset=task_dataset([3, 8, 21]),
        env_id=ENV_ID,
        env_kwargs=chat,
        pool_options={"num_workers": 1},
    )
    trainer.train()
    assert trainer.env_kwargs["chat_template"] == tokenizer.chat_template
    assert trainer.env_kwargs["reasoning_open"] is False  # the tiny template opens no <think>
    env = gym.make(ENV_ID, **trainer.env_kwargs)
    (episodes,) = trainer.generations
    for e in episodes:
        _, info = env.reset(options={"task_id": trainer.group_tasks[0][e.group]})
        for step in e.steps:
            messages = [dict(m) for m in step.prompt.messages]
            assert messages[0]["role"] == "system" and step.prompt.tools == tuple(info["tools"])
            rendered = tokenizer.apply_chat_template(
                messages, tools=info["tools"], add_generation_prompt=True, tokenize=False
            )
            assert step.response.prompt_ids == tokenizer(rendered, add_special_tokens=False)["input_ids"]
            assert step.fingerprints == tuple(info["fingerprints"])
            _, reward, _, _, info = env.step(step.response.text)
            assert (float(reward), not info["action_valid"]) == (step.reward, step.invalid)
    logged = trainer._logs["prompt"][-1]
    assert isinstance(logged, list) and logged[0]["role"] == "system"


def test_mvpo_carries_its_state_from_batch_to_batch_and_through_a_checkpoint(tiny_model, tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)

    def trainer(max_steps: int) -> RecordingTrainer:
        return RecordingTrainer(
            model=AutoModelForCausalLM.from_pretrained(tiny_model),
            args=grpo_config(
                tmp_path,
                generation_kwargs=look_bias(tokenizer),
                save_strategy="steps",
                save_steps=1,
                max_steps=max_steps,
            ),
            processing_class=tokenizer,
            train_dataset=task_dataset([3, 8, 21, 40, 57, 60]),
            env_id=ENV_ID,
            env_kwargs=ENV_KWARGS,
            advantage=AdvantageConfig(estimator="mvpo"),
            pool_options={"num_workers": 1},
        )

    first = trainer(1)
    first.train()
    rows = [(e, s) for e in first.generations[0] for s in e.steps]
    progress = ProgressColumns.from_steps([s.progress for _, s in rows])
    assert progress is not None  # Rooms reports its milestones, and they reach the estimator
    expected = mvpo_advantages(
        [s.reward for _, s in rows], [f"{e.group}/{e.member}" for e, _ in rows], [e.group for e, _ in rows],
        np.array([s.fingerprints for _, s in rows], dtype=np.uint64), [e.won for e, _ in rows],
        progress.signatures, progress.next_signatures, progress.milestones, progress.next_milestones,
        [s.invalid for _, s in rows],
    ).state.to_dict()  # fmt: skip
    saved = json.loads((tmp_path / "checkpoint-1" / ADVANTAGE_STATE).read_text())
    assert first.states_used == [None] and first.advantage_state == saved == expected
    resumed = trainer(2)
    resumed.train(resume_from_checkpoint=True)
    assert resumed.states_used == [saved] and resumed.advantage_state != saved


def test_step_batch_pads_to_whole_micro_batches_without_losing_a_step(tiny_model, tmp_path):
    trainer = HGPOTrainer(
        model=tiny_model,
        # beta > 0 and two iterations per generation: the batch also needs reference and old log-probs
        args=grpo_config(tmp_path, beta=0.04, num_iterations=2),
        processing_class=AutoTokenizer.from_pretrained(tiny_model),
        train_dataset=task_dataset([1, 2]),
        env_id=ENV_ID,
        env_kwargs=ENV_KWARGS,
    )
    samples = [StepSample(f"s{i}", [5, 6, 7][: 1 + i % 3], [8, 9][: 1 + i % 2], None) for i in range(7)]
    advantages = np.arange(1.0, 8.0)
    batch = trainer._step_batch(samples, advantages, "train")
    assert batch["prompt_ids"].shape[0] == 9  # 7 steps and 2 copies: 3 micro-batches of 3
    assert batch["tool_mask"][:7].all() and not batch["tool_mask"][7:].any()
    assert batch["advantages"].tolist() == [1, 2, 3, 4, 5, 6, 7, 0, 0]
    assert batch["num_items_in_batch"] == sum(len(s.completion_ids) for s in samples)
    assert batch["prompt_ids"][2].tolist() == [5, 6, 7] and batch["prompt_mask"][0].tolist() == [0, 0, 1]
    # at the start the reference is the policy: both log-probs are the policy's
    assert batch["old_per_token_logps"].shape == batch["completion_ids"].shape
    torch.testing.assert_close(batch["ref_per_token_logps"], batch["old_per_token_logps"])
    eval_batch = trainer._step_batch(samples, advantages, "eval")  # evaluation is not split: no copies
    assert eval_batch["prompt_ids"].shape[0] == 7 and "tool_mask" not in eval_batch


def test_step_level_rejects_rows_without_a_task(tiny_model, tmp_path):
    from datasets import Dataset

    trainer = HGPOTrainer(
        model=tiny_model,
        args=grpo_config(tmp_path, max_steps=1),
        processing_class=AutoTokenizer.from_pretrained(tiny_model),
        train_dataset=Dataset.from_dict({"prompt": [[{"role": "user", "content": ""}]] * 4}),
        env_id=ENV_ID,
        env_kwargs=ENV_KWARGS,
        pool_options={"num_workers": 1},
    )
    with pytest.raises(ValueError, match="'task_id' or 'seed'"):
        trainer.train()


def test_bad_arguments_fail_before_the_model_loads(tmp_path):
    args = grpo_config(tmp_path)
    with pytest.raises(TypeError):
        HGPOTrainer(model="no/such-model", args=args, env_id=ENV_ID, env_kwargs={"colour": 1})
    with pytest.raises(ValueError, match="reward_funcs belongs to plain GRPOTrainer"):
        HGPOTrainer(model="no/such-model", args=args, env_id=ENV_ID, reward_funcs=[len])
    with pytest.raises(ValueError, match="response_format must be one of"):
        HGPOTrainer(
            model="no/such-model",
            args=args,
            env_id=ENV_ID,
            env_kwargs={"prompt_format": "chat", "response_format": "json"},
        )
    with pytest.raises(ValueError, match="TRL's environment level .* plays text prompts"):
        environment_factory(ENV_ID, prompt_format="chat")


# ------------------------------------------------------------------------- environment level


def test_tool_environment_plays_the_rows_task_and_scores_it():
    make = environment_factory(ENV_ID, max_steps=30, **ROOMS)
    a, b = make(), make()
    assert a.reset(prompt=[], task_id=5) == b.reset(prompt=[], task_id=5)
    schema = get_json_schema(a.act)["function"]  # how TRL describes the tool to the model
    assert schema["name"] == "act" and schema["parameters"]["required"] == ["command"]
    a.act("fly away")  # not admissible: an invalid step
    text = ""
    while not text.endswith("The episode is over."):
        text = a.act(a.session.env.unwrapped.expert_action())
    assert a.act("look") == "The episode is over."
    assert a.get_reward() == pytest.approx(10.0 - 0.1)
    with pytest.raises(ValueError, match="'task_id' or 'seed'"):
        b.reset(prompt=[])


def test_first_observation_is_set_apart_from_the_rows_prompt():
    """TRL appends reset()'s text to the prompt's last message as it is."""
    env = environment_factory(ENV_ID, max_steps=30, **ROOMS)()
    plain = env.reset(prompt=[], task_id=5)
    assert not plain.startswith("\n")
    assert env.reset(prompt=[{"role": "user", "content": "Solve it."}], task_id=5) == "\n\n" + plain
    assert env.reset(prompt=[{"role": "user", "content": "Solve it.\n"}], task_id=5) == plain
    assert env.reset(prompt="Solve it.", task_id=5) == "\n\n" + plain


def train_one_step_on_tasks(tiny_model, tmp_path, factory, tasks=(2, 9)) -> GRPOTrainer:
    """GRPOTrainer with ``factory`` for one optimizer step; checks every rollout played its row's
    task (both completions of the prompt the same) and that its reward reached TRL's logs."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    # a chat template with tool calling, as TRL ships it for Qwen2.5 (the tiny template has none)
    tokenizer.chat_template = (
        importlib.resources.files("trl") / "chat_templates" / "qwen2_5.jinja"
    ).read_text()
    trainer = GRPOTrainer(
        model=tiny_model,
        args=grpo_config(tmp_path, max_steps=1, max_completion_length=8, gradient_accumulation_steps=1),
        processing_class=tokenizer,
        train_dataset=task_dataset(list(tasks), "Solve the task with the act tool."),
        environment_factory=factory,
    )
    trainer.train()
    assert trainer.state.global_step == 1
    fresh = gym.make(ENV_ID, history_length=0, response_format="plain", max_steps=4, **ROOMS)
    task_texts = {fresh.reset(options={"task_id": t})[1]["task"] for t in tasks}
    played = [env.session.info["task"] for env in trainer.environments]
    assert len(played) == 2 and set(played) <= task_texts
    assert played[0] == played[1]  # one group: both completions of the prompt play its task
    logged = trainer._logs["rewards"]["HGPOToolEnvironment"]
    assert list(logged)[-2:] == [env.get_reward() for env in trainer.environments]
    return trainer


def test_environment_factory_in_grpo_trainer(tiny_model, tmp_path):
    train_one_step_on_tasks(tiny_model, tmp_path, environment_factory(ENV_ID, max_steps=4, **ROOMS))


def test_environment_factory_over_an_openenv_server(tiny_model, tmp_path):
    """TRL's OpenEnv pattern: the environment class holds an OpenEnv client of a served env."""
    from serve_helpers import running_server

    served = [
        "history_length=0",
        "response_format=plain",
        "max_steps=4",
        *(f"{k}={v}" for k, v in ROOMS.items()),
    ]
    with running_server(ENV_ID, *served) as (url, _):  # the operator's arguments: the factory's
        factory = environment_factory(ENV_ID, servers=[url], max_steps=4, **ROOMS)
        trainer = train_one_step_on_tasks(tiny_model, tmp_path, factory)
        assert all(env.session.env.server == url for env in trainer.environments)


def test_missing_trl_names_the_extra(monkeypatch):
    message = import_error_without(monkeypatch, "integrations.trl", "trl")
    assert "pip install -e '.[trl]'" in message and "\n" not in message


# ------------------------------------------------------------------------- the docs' examples
DOCS_PAGE = Path(__file__).resolve().parents[2] / "docs" / "integrations" / "trl.md"
TINY_RUN = 'max_steps=1, use_cpu=True, report_to="none", save_strategy="no", per_device_train_batch_size=2'
DOCS_SUBSTITUTIONS = {
    1: [  # step level
        ('model="Qwen/Qwen2.5-1.5B-Instruct"', "model=TINY_MODEL"),
        (
            'output_dir="runs/trl-hgpo-alfworld"',
            "output_dir=OUTPUT_DIR, max_steps=1, use_cpu=True, report_to='none'",
        ),
        ("num_generations=8", "num_generations=2"),
        ("per_device_train_batch_size=8", "per_device_train_batch_size=2"),
        ("gradient_accumulation_steps=16", "gradient_accumulation_steps=1"),
        ("max_completion_length=512", "max_completion_length=8"),
        ("range(3553)", "range(2)"),
        ('"HGPO-ALFWorld-v0"', '"HGPO-Rooms-v0"'),
        ('"max_steps": 50', '"max_steps": 4'),
    ],
    2: [  # environment level
        ('model="Qwen/Qwen3-1.7B"', "model=TINY_MODEL, processing_class=TOOL_TOKENIZER"),
        (
            'output_dir="runs/trl-env-alfworld"',
            f"output_dir=OUTPUT_DIR, {TINY_RUN}, gradient_accumulation_steps=1",
        ),
        ("num_generations=8", "num_generations=2"),
        ("max_completion_length=4096", "max_completion_length=8"),
        ("range(3553)", "range(2)"),
        ('"HGPO-ALFWorld-v0"', '"HGPO-Rooms-v0"'),
        ("max_steps=50", "max_steps=4"),
    ],
}
"""What the docs' examples name that this machine cannot run (a hub model, ALFWorld's data, a
GPU's batch sizes), replaced by a tiny local model, Rooms and a single optimizer step."""


@pytest.mark.parametrize("number", sorted(DOCS_SUBSTITUTIONS))
def test_the_docs_examples_train(number, tiny_model, tmp_path):
    code = re.findall(r"^```python\n(.*?)^```", DOCS_PAGE.read_text(), re.DOTALL | re.MULTILINE)[number - 1]
    for old, new in DOCS_SUBSTITUTIONS[number]:
        assert old in code, f"the docs' example {number} no longer says {old!r}"
        code = code.replace(old, new)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    tokenizer.chat_template = (
        importlib.resources.files("trl") / "chat_templates" / "qwen2_5.jinja"
    ).read_text()
    scope = {
        "__name__": "__main__",
        "TINY_MODEL": tiny_model,
        "TOOL_TOKENIZER": tokenizer,
        "OUTPUT_DIR": str(tmp_path),
    }
    exec(code, scope)  # noqa: S102  -- the documentation's own example
    assert scope["trainer"].state.global_step == 1
