"""Step-level HGPO, GiGPO, GraphGPO, G2PO, CRBC and MVPO as verl advantage estimators (verl 0.9; verl-agent through :func:`step_advantages`).

verl's ``compute_advantage`` gives a registered estimator ``token_level_rewards``,
``response_mask``, ``config`` and ``index`` (``non_tensor_batch["uid"]``) only, so the per-step
data the estimators need rides in ``uid``: :func:`attach_step_keys` replaces each uid with a
:class:`StepKey`, a ``str`` equal to the original uid (so everything in verl that groups by uid
is unchanged) that also carries the step's episode id, position, env reward, invalid flag and
fingerprints (and, where the batch has them, its next state's, its action key and the env's
``won``). It reads them from the batch's ``non_tensor_batch`` under verl-agent's names, which
:class:`integrations.verl_agent.PoolEnvironmentManager` fills; ``next_obs`` is where GraphGPO's
rollout loop stores the anchor each step returned, and graph returns (``graphgpo``, or
``step_return="graph"``) need it; ``crbc`` needs ``action_key`` and ``won`` (the step's
``info["action_key"]`` and ``info["won"]``, which a rollout loop copies from the env's infos);
``mvpo`` needs ``won`` and the milestones of the observation each step acted on and of the one it
produced (:data:`PROGRESS_FIELDS`: ``info["progress_signature"]`` and ``info["milestones"]``
before and after the step). MVPO carries state from batch to batch in its registered function
(:func:`estimator_state`, :func:`restore_estimator_state`: verl's checkpoints do not hold it).

The step reward comes from the key, not from ``token_level_rewards``: verl-agent's episode reward
manager writes the episode's total on every step sample. The estimators' settings come from the
:class:`~hgpo_train.advantage.AdvantageConfig` given to :func:`register_estimators`; verl's
``algorithm.gamma`` and ``norm_adv_by_std_in_grpo`` are not read.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from hgpo_train.advantage import AdvantageConfig, ProgressColumns, step_credit
from integrations._framework import missing_framework

if TYPE_CHECKING:
    from typing_extensions import Self

try:
    import torch
    from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY, register_adv_est
except ImportError as error:
    raise missing_framework(
        "verl",
        error,
        " in an environment of its own (verl pins transformers < 5.11; bash scripts/test_verl.sh makes .venv-verl)",
    ) from error

STEP_FIELDS = {
    "episode": "traj_uid",
    "fingerprints": "anchor_obs",
    "valid": "is_action_valid",
    "reward": "rewards",
}
"""Where :func:`attach_step_keys` reads each step's data in ``non_tensor_batch`` (verl-agent's names)."""
NEXT_STATE_FIELD = "next_obs"
"""Where it reads each step's next anchor, when the batch has it (GraphGPO's rollout loop)."""
CRBC_FIELDS = {"action_key": "action_key", "won": "won"}
"""Where it reads each step's action key and the env's ``won``, when the batch has them (CRBC)."""
PROGRESS_FIELDS = {
    "signature": "progress_signature",
    "milestones": "milestones",
    "next_signature": "next_progress_signature",
    "next_milestones": "next_milestones",
}
"""Where it reads each step's milestones, when the batch has them (MVPO): the env's
``info["progress_signature"]`` and ``info["milestones"]`` of the observation the step acted on,
and of the one it produced."""
ESTIMATOR_NAMES = ("hgpo", "gigpo", "graphgpo", "g2po", "crbc", "mvpo")


class StepKey(str):
    """A sample's uid (its task group) that also carries what step advantages need."""

    episode: str
    step: int
    reward: float
    invalid: bool
    fingerprints: tuple[int, ...]
    next_state: int | None
    """Level-0 key of the state the step led to (None where the batch has no next anchors)."""
    action_key: int | None
    """The key of the command the step executed (None where the batch has no action keys)."""
    won: bool | None
    """The env's ``won`` after the step (None where the batch does not say)."""
    progress: tuple[str, tuple[int, ...], str, tuple[int, ...]] | None
    """The milestones before and after the step (:data:`PROGRESS_FIELDS`' order; None where the
    batch has none)."""

    def __new__(
        cls,
        group: str,
        episode: str,
        step: int,
        reward: float,
        invalid: bool,
        fingerprints: Sequence[int],
        next_state: int | None = None,
        action_key: int | None = None,
        won: bool | None = None,
        progress: tuple[Any, Any, Any, Any] | None = None,
    ) -> Self:
        key = super().__new__(cls, group)
        key.episode, key.step, key.reward, key.invalid = str(episode), int(step), float(reward), bool(invalid)
        key.fingerprints = tuple(int(f) for f in fingerprints)
        key.next_state = None if next_state is None else int(next_state)
        key.action_key = None if action_key is None else int(action_key)
        key.won = None if won is None else bool(won)
        key.progress = None
        if progress is not None:
            signature, milestones, next_signature, next_milestones = progress
            flags = tuple(int(m) for m in milestones), tuple(int(m) for m in next_milestones)
            key.progress = (str(signature), flags[0], str(next_signature), flags[1])
        return key

    def __reduce__(self) -> tuple[Any, ...]:  # batches travel between Ray workers
        fields = (
            self.episode, self.step, self.reward, self.invalid, self.fingerprints, self.next_state, self.action_key,
            self.won, self.progress,
        )  # fmt: skip
        return (StepKey, (str(self), *fields))


def attach_step_keys(data: Any, fields: dict[str, str] | None = None) -> Any:
    """Replace ``data.non_tensor_batch["uid"]`` by :class:`StepKey` s; returns ``data``.

    Call it on the rollout's batch before ``compute_advantage`` (and before anything reorders
    the samples: a step's position in its episode is its order in the batch at this point).
    ``fields`` overrides :data:`STEP_FIELDS`, its ``"next_state"`` :data:`NEXT_STATE_FIELD` (each
    step's next anchor, a fingerprint tuple (its level 0 is kept) or a key) and its
    ``"action_key"`` and ``"won"`` :data:`CRBC_FIELDS` and the four of :data:`PROGRESS_FIELDS`;
    these are optional (the milestones all four or none).
    """
    fields = {
        **STEP_FIELDS,
        "next_state": NEXT_STATE_FIELD,
        **CRBC_FIELDS,
        **PROGRESS_FIELDS,
        **(fields or {}),
    }
    batch = data.non_tensor_batch
    missing = sorted(name for name in ["uid", *(fields[f] for f in STEP_FIELDS)] if name not in batch)
    if missing:
        raise ValueError(f"the batch lacks {missing} in non_tensor_batch; present: {sorted(batch)}")
    n = len(batch["uid"])
    next_states = _optional(batch, fields["next_state"], n, _level0)
    action_keys = _optional(batch, fields["action_key"], n, int)
    won = _optional(batch, fields["won"], n, bool)
    progress = [_optional(batch, fields[name], n, lambda value: value) for name in PROGRESS_FIELDS]
    steps_progress = [None if any(v is None for v in row) else row for row in zip(*progress)]
    seen: dict[str, int] = defaultdict(int)
    keys = np.empty(n, dtype=object)
    for i, (group, episode, fingerprints, valid, reward) in enumerate(
        zip(batch["uid"], *(batch[fields[name]] for name in ("episode", "fingerprints", "valid", "reward")))
    ):
        keys[i] = StepKey(
            str(group), episode, seen[str(episode)], reward, not valid, fingerprints, next_states[i], action_keys[i],
            won[i], steps_progress[i],
        )  # fmt: skip
        seen[str(episode)] += 1
    batch["uid"] = keys
    return data


def _optional(batch: dict[str, Any], name: str, n: int, convert: Callable[[Any], Any]) -> list[Any]:
    """The column ``name`` converted, or None per row where the batch lacks it."""
    return [convert(value) for value in batch[name]] if name in batch else [None] * n


def _level0(anchor: Any) -> int:
    return int(anchor) if np.ndim(anchor) == 0 else int(anchor[0])


def _columns(index: Any) -> dict[str, Any]:
    if index is None or not all(isinstance(key, StepKey) for key in index):
        raise ValueError(
            "the hgpo/gigpo/graphgpo/g2po/crbc/mvpo estimators need the steps' keys in non_tensor_batch['uid']: "
            "call integrations.verl.attach_step_keys(batch) before compute_advantage"
        )
    has_next = all(k.next_state is not None for k in index)
    has_crbc = all(k.action_key is not None and k.won is not None for k in index)
    has_won = all(k.won is not None for k in index)
    return {
        "progress": ProgressColumns.from_steps([k.progress for k in index]),
        "group": np.array([str(k) for k in index], dtype=object),
        "episode": np.array([k.episode for k in index], dtype=object),
        "step": np.array([k.step for k in index], dtype=np.int64),
        "reward": np.array([k.reward for k in index], dtype=np.float64),
        "invalid": np.array([k.invalid for k in index], dtype=bool),
        "fingerprints": np.array([k.fingerprints for k in index], dtype=np.uint64),
        "next_state": np.array([k.next_state for k in index], dtype=np.uint64) if has_next else None,
        "action_key": np.array([k.action_key for k in index], dtype=np.uint64) if has_crbc else None,
        "won": np.array([k.won for k in index], dtype=bool) if has_won else None,
    }


def make_estimator(advantage: AdvantageConfig) -> Callable[..., tuple[Any, Any]]:
    """A verl estimator function (the signature ``compute_advantage`` calls) for ``advantage``;
    its ``state`` attribute is what the estimator carries to the next batch (MVPO's)."""

    def estimate(
        token_level_rewards: torch.Tensor,
        response_mask: torch.Tensor,
        config: Any = None,
        index: Any = None,
        **_: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        c = _columns(index)
        if advantage.returns == "graph" and c["next_state"] is None:
            raise ValueError(
                f"graph returns need each step's next anchor in non_tensor_batch[{NEXT_STATE_FIELD!r}] "
                "(GraphGPO's rollout loop stores it) before attach_step_keys"
            )
        if advantage.estimator == "crbc" and c["action_key"] is None:
            raise ValueError(
                f"crbc needs each step's action key and won in non_tensor_batch{list(CRBC_FIELDS.values())} "
                "(the env's info['action_key'] and info['won']) before attach_step_keys"
            )
        if advantage.estimator == "mvpo" and (c["progress"] is None or c["won"] is None):
            raise ValueError(
                f"mvpo needs each step's won and milestones in non_tensor_batch{list(PROGRESS_FIELDS.values())} "
                "(the env's info['progress_signature'] and info['milestones'] before and after the step) "
                "before attach_step_keys"
            )
        order = np.argsort(c["step"], kind="stable")  # each episode's rows in chronological order
        optional = {
            name: None if c[name] is None else c[name][order] for name in ("next_state", "action_key", "won")
        }
        credit = step_credit(
            c["reward"][order],
            c["episode"][order],
            c["group"][order],
            c["fingerprints"][order],
            c["invalid"][order],
            advantage,
            next_states=optional["next_state"],
            action_keys=optional["action_key"],
            won=optional["won"],
            progress=None if c["progress"] is None else c["progress"].take(order),
            state=estimate.state,
        )
        estimate.state = credit.carried()
        sorted_advantages = credit.advantages
        per_sample = np.empty(len(order))
        per_sample[order] = sorted_advantages
        scores = torch.as_tensor(
            per_sample, dtype=token_level_rewards.dtype, device=token_level_rewards.device
        )
        advantages = scores.unsqueeze(-1) * response_mask
        return advantages, advantages

    estimate.hgpo_estimator = True  # marks the registry entries register_estimators may replace
    estimate.state = None
    return estimate


def estimator_state(name: str) -> dict[str, Any] | None:
    """What registered estimator ``name`` carries to the next batch (MVPO's milestone weights and
    success EMA; None for the others): save it beside verl's checkpoint."""
    return _registered(name).state


def restore_estimator_state(name: str, state: dict[str, Any] | None) -> None:
    """Give registered estimator ``name`` the state :func:`estimator_state` saved (on resume)."""
    _registered(name).state = state


def _registered(name: str) -> Any:
    estimate = ADV_ESTIMATOR_REGISTRY.get(name)
    if estimate is None or not getattr(estimate, "hgpo_estimator", False):
        raise ValueError(f"{name!r} is not an estimator register_estimators registered")
    return estimate


def register_estimators(
    advantage: AdvantageConfig | None = None, names: Sequence[str] = ESTIMATOR_NAMES
) -> None:
    """Register step-level ``hgpo``, ``gigpo``, ``graphgpo``, ``g2po``, ``crbc`` and ``mvpo`` with
    verl (``algorithm.adv_estimator=hgpo``), with ``advantage``'s settings (default: the paper's
    ALFWorld ones; ``step_return`` applies to the first three and is dropped for the others,
    ``crbc`` weighs its step credit by ``advantage.crbc.step_weight`` and ``mvpo`` by
    ``advantage.mvpo.omega``, not ``step_weight``, and ``mvpo`` always normalises with
    ``mean_std_norm``, its only mode); calling it again replaces them (and their state)."""
    base = advantage or AdvantageConfig()
    for name in names:
        if name not in ESTIMATOR_NAMES:
            raise ValueError(f"unknown estimator {name!r}; expected some of {ESTIMATOR_NAMES}")
        previous = ADV_ESTIMATOR_REGISTRY.get(name)
        if previous is not None and not getattr(previous, "hgpo_estimator", False):
            raise ValueError(f"verl already has an estimator named {name!r} that is not this project's")
        ADV_ESTIMATOR_REGISTRY.pop(name, None)
        own_credit = {"step_return": None, **({"step_weight": 1.0} if name in ("crbc", "mvpo") else {})}
        settings = own_credit if name in ("g2po", "crbc", "mvpo") else {}
        if name == "mvpo":
            settings["mode"] = "mean_std_norm"
        register_adv_est(name)(make_estimator(dataclasses.replace(base, estimator=name, **settings)))


def step_advantages(data: Any, advantage: AdvantageConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """``(advantages, returns)`` of a rollout batch, for trainers without verl's estimator
    registry (verl-agent's fork): attaches the step keys, then runs the estimator."""
    if not all(isinstance(key, StepKey) for key in data.non_tensor_batch["uid"]):
        attach_step_keys(data)
    estimate = make_estimator(advantage)
    return estimate(
        data.batch["token_level_rewards"], data.batch["response_mask"], index=data.non_tensor_batch["uid"]
    )
