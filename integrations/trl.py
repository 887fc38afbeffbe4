"""HGPO-* environments and step-level HGPO in TRL's ``GRPOTrainer`` (TRL 1.16).

Two levels (see docs/integrations/index.md):

- **Environment level**: :func:`environment_factory` makes an env usable as ``GRPOTrainer``'s
  ``environment_factory``. The model plays a whole episode inside one completion by calling the
  env's ``act`` tool; the episode's env reward is the completion's reward, and TRL's own GRPO
  normalises it over the ``num_generations`` completions of a prompt. Each dataset row names a
  task (:func:`task_dataset`), so the completions of one prompt play the same task.
- **Step level**: :class:`HGPOTrainer` is a ``GRPOTrainer`` whose samples are the steps of
  episodes: every step is its own (K-step prompt, response) sample and the fingerprints decide
  the groups (GRPO, GiGPO, HGPO or any other of :mod:`hgpo_train.advantage`). TRL computes advantages as one
  group per prompt inside ``_generate_and_score_completions`` and has no estimator registry, so
  the subclass replaces that method; generation, the loss, the optimizer, logging and
  checkpoints stay TRL's.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from hgpo_env.vector import GroupedEnvPool
from hgpo_train.advantage import AdvantageConfig, ProgressColumns, step_credit
from hgpo_train.rollout.collect import play_episodes, step_columns, template_settings
from hgpo_train.rollout.episodes import Episode, Prompt
from hgpo_train.rollout.generation import PromptEncoder
from hgpo_train.run import durable
from integrations._framework import missing_framework, text_prompts_only
from integrations.session import EnvSession

try:
    import datasets
    import torch
    from accelerate.utils import gather_object
    from transformers.trainer_utils import get_last_checkpoint
    from trl import GRPOConfig, GRPOTrainer
    from trl.trainer.utils import pad, use_adapter
except ImportError as error:
    raise missing_framework("trl", error) from error

ADVANTAGE_STATE = "hgpo_advantage_state.json"
"""The file in each checkpoint that holds what the estimator carries across batches (MVPO's)."""
TASK_COLUMNS = ("task_id", "seed")
"""Dataset columns that pick a row's task: ``task_id`` selects it, ``seed`` seeds the reset."""


def task_dataset(
    task_ids: Sequence[int], instruction: str = "", *, seeds: Sequence[int] | None = None
) -> Any:
    """A ``datasets.Dataset`` with one row per task: ``task_id`` (and ``seed``), plus a
    conversational ``prompt`` holding ``instruction`` (at environment level TRL appends the
    env's first observation to it; the step-level trainer ignores it)."""
    if seeds is not None and len(seeds) != len(task_ids):
        raise ValueError(f"got {len(seeds)} seeds for {len(task_ids)} task ids")
    rows: dict[str, list[Any]] = {
        "prompt": [[{"role": "user", "content": instruction}] for _ in task_ids],
        "task_id": [int(t) for t in task_ids],
    }
    if seeds is not None:
        rows["seed"] = [int(s) for s in seeds]
    return datasets.Dataset.from_dict(rows)


def _task_of(row: dict[str, Any]) -> tuple[int | None, int | None]:
    task_id, seed = (row.get(column) for column in TASK_COLUMNS)
    if task_id is None and seed is None:
        raise ValueError(
            f"a dataset row needs a 'task_id' or 'seed' column (got {sorted(row)}), so that the "
            "num_generations copies of a row play the same task; see task_dataset()"
        )
    return (None if task_id is None else int(task_id), None if seed is None else int(seed))


# ------------------------------------------------------------------------- environment level


class HGPOToolEnvironment:
    """An HGPO-* env as a TRL environment: ``reset`` starts the row's task, ``act`` is the one tool.

    TRL exposes every public method but ``reset`` and ``get_reward`` as a tool, so this class
    has exactly those three.
    """

    def __init__(self, env_id: str, *, invalid_penalty: float = 0.1, **env_kwargs: Any) -> None:
        text_prompts_only(env_kwargs, "TRL's environment level (its own loop calls the env's act tool)")
        env_kwargs.setdefault("response_format", "plain")  # the tool argument is the command
        self.session = EnvSession(env_id, invalid_penalty=invalid_penalty, **env_kwargs)

    def reset(self, **row: Any) -> str:
        task_id, seed = _task_of(row)
        return _separator(row.get("prompt")) + self.session.reset(task_id=task_id, seed=seed)

    def act(self, command: str) -> str:
        """Take one action in the environment.

        Args:
            command: One of the admissible actions listed in the last observation.

        Returns:
            The new observation with the actions admissible now, or a notice that the episode is over.
        """
        if self.session.done:
            return "The episode is over."
        text, _, done = self.session.step(command)
        return f"{text}\nThe episode is over." if done else text

    def get_reward(self) -> float:
        """The episode's env reward minus the invalid-step penalty."""
        return self.session.episode_return


def _separator(prompt: Any) -> str:
    """A blank line when the row's prompt ends in text: TRL appends the env's first observation
    to the prompt's last message as it is."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[-1], dict):
        prompt = prompt[-1].get("content")
    return "\n\n" if isinstance(prompt, str) and prompt and not prompt[-1].isspace() else ""


def environment_factory(env_id: str, **env_kwargs: Any) -> Callable[[], HGPOToolEnvironment]:
    """``GRPOTrainer(environment_factory=...)`` for an HGPO-* env; ``env_kwargs`` go to
    :class:`HGPOToolEnvironment` (``invalid_penalty``, and ``servers=[url, ...]`` to play on env
    servers through OpenEnv's client, TRL's native path) and ``gymnasium.make``."""
    probe = HGPOToolEnvironment(env_id, **env_kwargs).session  # bad arguments fail here, once
    if env_kwargs.get("servers"):
        probe.reset(seed=0)  # a served env is made at its first reset
    probe.close()
    return functools.partial(HGPOToolEnvironment, env_id, **env_kwargs)


# -------------------------------------------------------------------------------- step level


@dataclass
class StepSample:
    """One generated step: the tokens the loss sees and the text the env gets."""

    text: str
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float] | None


def environment_reward(prompts: Any, completions: Any, **kwargs: Any) -> list[float]:
    """The reward source :class:`HGPOTrainer` declares to ``GRPOTrainer``: the env's step rewards.

    The step-level trainer takes rewards from the episodes it plays and never calls reward
    functions; this one exists because ``GRPOTrainer`` requires a reward source, and it names
    the reward column in TRL's completion logs.
    """
    raise RuntimeError("HGPOTrainer takes rewards from its environments; reward functions are not called")


class HGPOTrainer(GRPOTrainer):
    """``GRPOTrainer`` on the steps of HGPO-* episodes, with step advantages of any estimator here.

    Each generation batch's rows (``num_generations`` copies of a task row, see
    :func:`task_dataset`) become one task group of envs in a :class:`GroupedEnvPool`; the model
    plays every env to the end, one batched generation per turn, and each step is a sample whose
    prompt is the env's K-step prompt (chat-templated; a chat env's messages are rendered with its
    tools, and the envs pin the policy's template in their keys). Advantages come from
    :func:`hgpo_train.advantage.compute_advantages` over all processes' steps.

    Batch shape: a generation batch yields a variable number of step samples, which TRL splits
    into ``steps_per_generation`` micro-batches; the samples are padded to a multiple of it with
    copies whose loss mask is zero, so no step is dropped. Size ``steps_per_generation`` for
    memory, and prefer a token-normalised ``loss_type`` ("dapo", TRL's default, or "bnpo"),
    which the padding copies do not dilute.

    ``model``, ``args``, ``train_dataset``, ``processing_class`` and the other ``GRPOTrainer``
    arguments keep their meaning.

    Args:
        env_id: a registered HGPO-* id.
        env_kwargs: passed to ``gymnasium.make`` in every env (``history_length``,
            ``response_format``, ``max_steps``, env options).
        advantage: the estimator and its settings (default: HGPO, the paper's ALFWorld settings).
        pool_options: :class:`GroupedEnvPool` options (``num_workers``, ``backend``, timeouts).
    """

    def __init__(
        self,
        model: Any,
        args: GRPOConfig | None = None,
        *,
        env_id: str,
        env_kwargs: dict[str, Any] | None = None,
        advantage: AdvantageConfig | None = None,
        pool_options: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self.env_id = env_id
        self.env_kwargs = dict(env_kwargs or {})
        self.advantage = advantage or AdvantageConfig()
        self.pool_options = dict(pool_options or {})
        gym.make(env_id, **self.env_kwargs).close()  # bad env arguments fail before the model loads
        for name in ("reward_funcs", "tools", "environment_factory", "rollout_func"):
            if kwargs.get(name):
                raise ValueError(
                    f"HGPOTrainer plays the environment itself and takes its rewards from it: {name} "
                    "belongs to plain GRPOTrainer (environment level, see environment_factory)"
                )
        super().__init__(model, reward_funcs=environment_reward, args=args, **kwargs)
        if self.use_vllm and self.vllm_importance_sampling_correction:
            raise ValueError(
                "HGPOTrainer does not implement vLLM importance-sampling correction yet: "
                "set GRPOConfig(vllm_importance_sampling_correction=False)"
            )
        self._encoder = PromptEncoder(self.processing_class)
        if self.env_kwargs.get("prompt_format") == "chat":  # the policy's template, unless pinned
            template_kwargs = self.env_kwargs.get("chat_template_kwargs", {})
            for name, value in template_settings(self._tokenizer, template_kwargs).items():
                self.env_kwargs.setdefault(name, value)
        self._pools: dict[tuple[int, int], GroupedEnvPool] = {}
        self._idle_prompt: list[int] = []
        self.last_episodes: list[Episode[StepSample]] = []
        """This process's episodes of the latest generation batch, for inspection."""
        self.advantage_state: dict[str, Any] | None = None
        """What the estimator carries to the next training batch (MVPO's), the same on every
        process; saved in each checkpoint (:data:`ADVANTAGE_STATE`) and restored on resume."""

    # ------------------------------------------------------------------ rollout
    def _pool(self, num_groups: int, group_size: int) -> GroupedEnvPool:
        """One pool per batch shape (training and evaluation may differ), made once."""
        key = (num_groups, group_size)
        if key not in self._pools:
            seed = self.args.seed + 1000 * self.accelerator.process_index
            self._pools[key] = GroupedEnvPool(
                self.env_id, num_groups, group_size, seed=seed, **self.pool_options, **self.env_kwargs
            )
        return self._pools[key]

    def _any_process_playing(self, playing: bool) -> bool:
        return bool(
            self.accelerator.gather(torch.tensor([int(playing)], device=self.accelerator.device)).sum()
        )

    def _respond(self, prompts: list[Prompt], infos: list[dict[str, Any]]) -> list[StepSample]:
        self._any_process_playing(True)
        prompt_ids = [self._encoder.prompt_ids(p) for p in prompts]
        self._idle_prompt = prompt_ids[-1]
        completion_ids, logprobs = self._generate_single_turn(prompt_ids, None, {}, 1)
        return [
            StepSample(self._encoder.decode(c), p, list(c), None if logprobs is None else list(lp))
            for p, c, lp in zip(prompt_ids, completion_ids, logprobs or [None] * len(prompt_ids))
        ]

    def _wait_for_other_processes(self) -> None:
        """Join generation's collective calls (vLLM gathers, ZeRO-3 parameter gathers) with an
        idle prompt until every process has finished its episodes, so none waits forever."""
        while self._any_process_playing(False):
            self._generate_single_turn([self._idle_prompt], None, {}, 1)

    def _play(self, inputs: list[dict[str, Any]], group_size: int) -> list[Episode[StepSample]]:
        if len(inputs) % group_size:
            raise ValueError(
                f"this process got {len(inputs)} rows, not a multiple of num_generations={group_size}: "
                "make per_device_train_batch_size * steps_per_generation a multiple of num_generations"
            )
        tasks = [_task_of(row) for row in inputs]
        groups = [tasks[g : g + group_size] for g in range(0, len(tasks), group_size)]
        if any(len(set(group)) != 1 for group in groups):
            raise ValueError(
                "the num_generations rows of a group name different tasks; expected copies of one row"
            )
        task_ids = [group[0][0] for group in groups]
        seeds = [group[0][1] for group in groups]
        if len({t is None for t in task_ids}) > 1 or len({s is None for s in seeds}) > 1:
            raise ValueError("give every dataset row a task_id, or none; the same for seed")
        episodes = play_episodes(
            self._pool(len(groups), group_size),
            self._respond,
            task_ids=None if task_ids[0] is None else task_ids,
            seeds=None if seeds[0] is None else seeds,
        )
        self._wait_for_other_processes()
        return episodes

    # --------------------------------------------------------------- advantages
    def train(self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any) -> Any:
        """TRL's ``train``; a resume also restores what the estimator carried (:data:`ADVANTAGE_STATE`)."""
        checkpoint = (
            get_last_checkpoint(self.args.output_dir)
            if resume_from_checkpoint is True
            else resume_from_checkpoint
        )
        saved = Path(checkpoint) / ADVANTAGE_STATE if checkpoint else None
        if saved is not None and saved.is_file():
            self.advantage_state = json.loads(saved.read_text())
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def _save_rng_state(self, output_dir: str) -> None:
        """Hugging Face's RNG states, and beside them in the checkpoint what the estimator carries."""
        super()._save_rng_state(output_dir)
        if self.accelerator.is_main_process:
            durable.write_text(Path(output_dir) / ADVANTAGE_STATE, json.dumps(self.advantage_state))

    def _step_advantages(
        self, episodes: list[Episode[StepSample]], num_groups: int, training: bool
    ) -> tuple[np.ndarray, np.ndarray]:
        """This process's step advantages, and every process's (for logs), from all processes'
        steps; a training batch updates what the estimator carries, an evaluation's does not."""
        columns = step_columns(episodes)
        # group ids unique across processes
        columns["group_id"] += num_groups * self.accelerator.process_index
        every = gather_object([columns])
        progress = ProgressColumns.concatenate([c.pop("progress") for c in every])
        merged = {name: np.concatenate([c[name] for c in every]) for name in columns if name != "progress"}
        credit = step_credit(
            merged["reward"],
            merged["traj_id"],
            merged["group_id"],
            merged["fingerprints"],
            merged["invalid"],
            self.advantage,
            next_states=merged["next_state"],
            action_keys=merged["action_key"],
            won=merged["outcome"] == "won",
            progress=progress,
            state=self.advantage_state,
        )
        advantages = credit.advantages
        if training:
            self.advantage_state = credit.carried()
        start = sum(len(c["reward"]) for c in every[: self.accelerator.process_index])
        return advantages[start : start + len(columns["reward"])], advantages

    # --------------------------------------------------------------------- batch
    def _logps(self, model: Any, batch: dict[str, torch.Tensor], size: int) -> torch.Tensor:
        ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
        mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
        logps, _, _ = self._get_per_token_logps_and_entropies(
            model, ids, mask, batch["completion_ids"].size(1), batch_size=size
        )
        return logps

    def _reference_logps(self, batch: dict[str, torch.Tensor], size: int) -> torch.Tensor:
        if self.ref_model is not None:
            return self._logps(self.ref_model, batch, size)
        model = self.accelerator.unwrap_model(self.model)  # a PEFT adapter: the base model is the reference
        with use_adapter(model, adapter_name="ref" if "ref" in model.peft_config else None):
            return self._logps(self.model, batch, size)

    def _step_batch(self, samples: list[StepSample], advantages: np.ndarray, mode: str) -> dict[str, Any]:
        """The tensors ``GRPOTrainer._compute_loss`` reads, padded to whole micro-batches in training."""
        device = self.accelerator.device
        n = len(samples)
        copies = (-n) % self.args.steps_per_generation if mode == "train" else 0
        samples = samples + [samples[i % n] for i in range(copies)]
        advantage = torch.zeros(len(samples), dtype=torch.float32)
        advantage[:n] = torch.as_tensor(advantages, dtype=torch.float32)
        pad_id = self._tokenizer.pad_token_id

        def padded(rows: list[list[Any]], value: Any, side: str, dtype: torch.dtype) -> torch.Tensor:
            return pad([torch.tensor(r, dtype=dtype) for r in rows], value, side, self.pad_to_multiple_of).to(
                device
            )

        prompts = [s.prompt_ids for s in samples]
        completions = [s.completion_ids for s in samples]
        batch: dict[str, Any] = {
            "prompt_ids": padded(prompts, pad_id, "left", torch.long),
            "prompt_mask": padded([[1] * len(p) for p in prompts], 0, "left", torch.long),
            "completion_ids": padded(completions, pad_id, "right", torch.long),
            "completion_mask": padded([[1] * len(c) for c in completions], 0, "right", torch.long),
            "advantages": advantage.to(device),
        }
        loss_mask = batch["completion_mask"]
        if copies:  # the copies take part in the forward pass but not in the loss
            batch["tool_mask"] = torch.ones_like(loss_mask)
            batch["tool_mask"][n:] = 0
            loss_mask = loss_mask * batch["tool_mask"]
        batch["num_items_in_batch"] = self.accelerator.gather(loss_mask.sum()).sum()
        if all(s.logprobs is not None for s in samples):
            batch["sampling_per_token_logps"] = padded(
                [s.logprobs for s in samples], 0.0, "right", torch.float32
            )
        size = (
            self.args.per_device_train_batch_size if mode == "train" else self.args.per_device_eval_batch_size
        )
        with torch.no_grad():
            if self.args.gradient_accumulation_steps % (self.args.steps_per_generation * self.num_iterations):
                batch["old_per_token_logps"] = self._logps(self.model, batch, size)
            if self.beta != 0.0:
                batch["ref_per_token_logps"] = self._reference_logps(batch, size)
        return batch

    def _log_episodes(self, episodes: list[Episode[StepSample]], advantages: np.ndarray, mode: str) -> None:
        """Env metrics over all processes' episodes, and the completions table's columns."""
        summaries = [
            (e.won, e.score, len(e.steps), [(s.reward, s.invalid) for s in e.steps]) for e in episodes
        ]
        every = [summary for part in gather_object([summaries]) for summary in part]
        steps = [step for *_, episode_steps in every for step in episode_steps]
        rewards = [reward for reward, _ in steps]
        metrics = {
            "env/success_rate": np.mean([won for won, *_ in every]),
            "env/score": np.mean([score for _, score, *_ in every]),
            "env/episode_return": np.mean([sum(r for r, _ in episode_steps) for *_, episode_steps in every]),
            "env/episode_length": np.mean([length for _, _, length, _ in every]),
            "env/invalid_rate": np.mean([invalid for _, invalid in steps]),
            "env/step_samples": len(steps),
            "reward": np.mean(rewards),
            "advantage/mean": advantages.mean(),
            "advantage/std": advantages.std(),
        }
        for name, value in metrics.items():
            self._metrics[mode][name].append(float(value))
        local = [s for e in episodes for s in e.steps]
        prompts = [s.prompt if isinstance(s.prompt, str) else list(s.prompt.messages) for s in local]
        self._logs["prompt"].extend(gather_object(prompts))
        self._logs["completion"].extend(gather_object([s.response.text for s in local]))
        self._logs["rewards"][environment_reward.__name__].extend(rewards)
        self._logs["advantages"].extend(advantages.tolist())

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        mode = "train" if self.model.training else "eval"
        group_size = self.num_generations if mode == "train" else self.num_generations_eval
        episodes = self._play(inputs, group_size)
        self.last_episodes = episodes
        mine, every = self._step_advantages(episodes, len(inputs) // group_size, mode == "train")
        samples = [s.response for e in episodes for s in e.steps]
        self._log_episodes(episodes, every, mode)
        return self._step_batch(samples, mine, mode)
