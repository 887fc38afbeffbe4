"""``StepBatch``: the columnar record of one iteration's rollouts, one row per step sample.

Everything the advantage estimators, the update and the logs need crosses this boundary, and
nothing else: the OpenRLHF backend fills and consumes the same object. Token ids are kept
exactly as generated (each step is an independent prompt/response sample, never re-tokenised).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hgpo_train.advantage import AdvantageConfig, ProgressColumns, Rows, StepCredit, credit_rows
from hgpo_train.rollout.constrained import Choices
from hgpo_train.rollout.episodes import Prompt


@dataclass
class Episodes:
    """One row per rollout: what happened in the episode as a whole."""

    group_id: np.ndarray
    traj_id: np.ndarray
    task: list[str]
    task_type: list[str | None]
    task_key: np.ndarray
    """uint64: the key of the task each rollout played (``info["task_key"]`` of its reset)."""
    won: np.ndarray
    score: np.ndarray
    """The env-native score at the episode's end (WebShop: purchase score 0..1)."""
    length: np.ndarray
    total_reward: np.ndarray
    truncated: np.ndarray
    """Hit the step limit (or its env failed) rather than terminated."""
    env_error: np.ndarray
    """The env or its worker failed; the episode was cut there."""

    def __len__(self) -> int:
        return len(self.group_id)

    def metrics(self, prefix: str = "") -> dict[str, float]:
        """Success rate, score and length, overall and per task type."""
        if not len(self):
            return {}
        out = {
            f"{prefix}success_rate": float(self.won.mean()),
            f"{prefix}score": float(self.score.mean()),
            f"{prefix}episode_length": float(self.length.mean()),
            f"{prefix}episode_return": float(self.total_reward.mean()),
            f"{prefix}env_errors": float(self.env_error.sum()),
        }
        by_type: dict[str, list[bool]] = defaultdict(list)
        for task_type, won in zip(self.task_type, self.won):
            if task_type is not None:
                by_type[task_type].append(bool(won))
        for task_type, wins in sorted(by_type.items()):
            out[f"{prefix}success_rate/{task_type}"] = float(np.mean(wins))
        return out


@dataclass
class StepBatch:
    """Step samples of one iteration, in columns. Rows of a rollout are in chronological order."""

    group_id: np.ndarray
    """int64 (n,): the task group."""
    traj_id: np.ndarray
    """int64 (n,): the rollout within its group (0..N-1)."""
    step: np.ndarray
    """int64 (n,): 0-based step in its rollout."""
    reward: np.ndarray
    """float64 (n,): env reward after the step."""
    invalid: np.ndarray
    """bool (n,): the response was not a valid admissible action."""
    fingerprints: np.ndarray
    """uint64 (n, K+1): context fingerprints, 0 where the level is not shown."""
    next_state: np.ndarray
    """uint64 (n,): level 0 of the fingerprints the step returned, the key of the state it led to
    (the terminal observation's on a rollout's last step); graph returns read it."""
    action_key: np.ndarray
    """uint64 (n,): the key of the command each step executed (``info["action_key"]``)."""
    outcome: np.ndarray
    """str (n,): how the row's rollout ended (:data:`hgpo_train.rollout.episodes.OUTCOMES`: won, lost,
    truncated, env_error)."""
    prompt_ids: list[np.ndarray]
    response_ids: list[np.ndarray]
    choices: list[Choices | None]
    """Per row, the choices (token sequences, slot templates) a constrained response was chosen
    from (None: unconstrained)."""
    episodes: Episodes
    progress: ProgressColumns | None = None
    """The milestones of each step's observations, where the env reports them (MVPO reads them)."""
    summary_turn: np.ndarray | None = None
    """bool (n,): the row's prompt asked for a summary of the steps leaving the context, not a
    command (``env.memory: compaction``'s summary turns); None: a batch without memory turns."""
    policy_version: np.ndarray | None = None
    """int64 (n,): how many updates the weights that sampled the row had seen (a trainer sets it,
    :mod:`hgpo_train.rollout.overlap`); None: not recorded."""
    behaviour_logprobs: list[np.ndarray] | None = None
    """float32 per row, one per response token: its log-prob under the weights that sampled it
    (NaN where the sampler gave none), for ``update.off_policy_correction``; None: not recorded."""
    window_prompts: list[Prompt | None] | None = None
    """Per row, the prompt a window of K would have shown instead (action turns under
    ``env.memory: compaction`` or ``notes``), for the tokens the memory saves; None: none given."""
    extras: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.group_id)
        columns = {
            "traj_id": self.traj_id,
            "step": self.step,
            "reward": self.reward,
            "invalid": self.invalid,
            "fingerprints": self.fingerprints,
            "next_state": self.next_state,
            "action_key": self.action_key,
            "outcome": self.outcome,
            "prompt_ids": self.prompt_ids,
            "response_ids": self.response_ids,
            "choices": self.choices,
            **({"summary_turn": self.summary_turn} if self.summary_turn is not None else {}),
            **({"policy_version": self.policy_version} if self.policy_version is not None else {}),
            **(
                {"behaviour_logprobs": self.behaviour_logprobs} if self.behaviour_logprobs is not None else {}
            ),
        }
        for name, column in columns.items():
            if len(column) != n:
                raise ValueError(f"StepBatch column {name} has {len(column)} rows, expected {n}")
        if self.behaviour_logprobs is not None:
            for row, (logprobs, response) in enumerate(zip(self.behaviour_logprobs, self.response_ids)):
                if len(logprobs) != len(response):
                    raise ValueError(
                        f"row {row}: {len(logprobs)} behaviour log-probs for {len(response)} response tokens"
                    )
        if self.fingerprints.ndim != 2 or self.fingerprints.dtype != np.uint64:
            raise ValueError("fingerprints must be a (n, K+1) uint64 array")

    def __len__(self) -> int:
        return len(self.group_id)

    @property
    def rows(self) -> Rows:
        """The columns every estimator reads, checked."""
        return Rows.from_columns(
            self.reward,
            self.traj_id,
            self.group_id,
            self.fingerprints,
            self.invalid,
            self.next_state,
            self.action_key,
            self.outcome == "won",
            self.progress,
        )

    def credit(self, config: AdvantageConfig, state: dict[str, Any] | None = None) -> StepCredit:
        """The step credit (advantages, and the values they were made from) of these rows under
        ``config``, with what the estimator carried from the last iteration (``state``): the one
        path from a batch to advantages, for every trainer."""
        return credit_rows(self.rows, config, state)

    @property
    def response_lengths(self) -> np.ndarray:
        return np.array([len(r) for r in self.response_ids], dtype=np.int64)

    @property
    def prompt_lengths(self) -> np.ndarray:
        return np.array([len(p) for p in self.prompt_ids], dtype=np.int64)

    def metrics(self) -> dict[str, float]:
        """Rollout statistics of the batch: episodes, invalid rate, token counts; with summary
        turns, how many per episode and their length, and the action prompts' length apart."""
        out = self.episodes.metrics("rollout/")
        if len(self):
            out.update(
                {
                    "rollout/step_samples": float(len(self)),
                    "rollout/invalid_rate": float(self.invalid.mean()),
                    "rollout/prompt_tokens": float(self.prompt_lengths.mean()),
                    "rollout/response_tokens": float(self.response_lengths.mean()),
                }
            )
        if self.summary_turn is not None and self.summary_turn.any():
            summaries, actions = self.summary_turn, ~self.summary_turn
            out.update(
                {
                    "memory/summary_turns_per_episode": float(summaries.sum() / len(self.episodes)),
                    "memory/summary_tokens": float(self.response_lengths[summaries].mean()),
                    "memory/summary_invalid_rate": float(self.invalid[summaries].mean()),
                    "memory/action_prompt_tokens": float(self.prompt_lengths[actions].mean())
                    if actions.any()
                    else 0.0,
                }
            )
        return out

    def take(self, rows: np.ndarray) -> StepBatch:
        """The batch of ``rows`` only (episodes and extras as they are: they describe the rollout)."""
        rows = np.asarray(rows, dtype=np.int64)
        pick = [int(r) for r in rows]
        return StepBatch(
            group_id=self.group_id[rows],
            traj_id=self.traj_id[rows],
            step=self.step[rows],
            reward=self.reward[rows],
            invalid=self.invalid[rows],
            fingerprints=self.fingerprints[rows],
            next_state=self.next_state[rows],
            action_key=self.action_key[rows],
            outcome=self.outcome[rows],
            prompt_ids=[self.prompt_ids[r] for r in pick],
            response_ids=[self.response_ids[r] for r in pick],
            choices=[self.choices[r] for r in pick],
            episodes=self.episodes,
            progress=self.progress.take(rows) if self.progress is not None else None,
            summary_turn=self.summary_turn[rows] if self.summary_turn is not None else None,
            policy_version=self.policy_version[rows] if self.policy_version is not None else None,
            behaviour_logprobs=[self.behaviour_logprobs[r] for r in pick]
            if self.behaviour_logprobs is not None
            else None,
            window_prompts=[self.window_prompts[r] for r in pick]
            if self.window_prompts is not None
            else None,
            extras=self.extras,
        )
