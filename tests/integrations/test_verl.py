"""verl integration against the real ``verl`` package (0.9.1), in its own environment
(``bash scripts/test_verl.sh``: verl pins transformers < 5.11, this project 5.15).

Real Rooms episodes are played through PoolEnvironmentManager and laid out as verl-agent lays
out step samples; verl's own ``compute_advantage`` then runs the registered estimator, and the
advantages must equal hgpo_train.advantage's estimator on the raw steps, broadcast over each
response's tokens. Nothing is mocked.
"""

from __future__ import annotations

import pickle
import random
import re
import uuid
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from integration_setup import ENV_ID, ROOMS, import_error_without
from reference_credit import reference_advantages
from verl import DataProto
from verl.trainer.config import AlgoConfig
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.ray_trainer import compute_advantage

from hgpo_train.advantage import AdvantageConfig, MVPOState, ProgressColumns
from integrations.verl import (
    StepKey,
    attach_step_keys,
    estimator_state,
    register_estimators,
    restore_estimator_state,
    step_advantages,
)
from integrations.verl_agent import PoolEnvironmentManager

ENV_KWARGS = {"history_length": 2, "response_format": "plain", "max_steps": 10, **ROOMS}
GROUPS, GROUP_SIZE, LENGTH = 3, 4, 7


@pytest.fixture(scope="module")
def rollout() -> dict:
    """Step samples in verl-agent's layout (per env, its steps in order), as columns."""
    rng = random.Random(1)
    manager = PoolEnvironmentManager(
        ENV_ID, GROUPS, GROUP_SIZE, seed=0, pool_options={"num_workers": 1}, **ENV_KWARGS
    )
    try:
        obs, infos = manager.reset([{"task_id": t} for t in (2, 7, 30) for _ in range(GROUP_SIZE)])
        before = infos
        uids = [uid for uid in (str(uuid.uuid4()) for _ in range(GROUPS)) for _ in range(GROUP_SIZE)]
        trajs = [str(uuid.uuid4()) for _ in uids]
        per_env = [[] for _ in uids]
        done = np.zeros(len(uids), dtype=bool)
        while not done.all():
            actions = [rng.choice([*info["admissible_actions"], "fly away"]) for info in infos]
            next_obs, rewards, dones, infos = manager.step(actions)
            for i in np.flatnonzero(~done):
                info = infos[i]
                step = (obs["anchor"][i], next_obs["anchor"][i], info["is_action_valid"], rewards[i])
                step += (info["action_key"], info["won"])
                step += tuple(
                    i[key] for i in (before[i], info) for key in ("progress_signature", "milestones")
                )
                per_env[i].append((uids[i], trajs[i], *step))
            done, obs, before = dones, next_obs, infos
    finally:
        manager.close()
    rows = [row for steps in per_env for row in steps]
    uid, traj, anchor, next_anchor, valid, reward, action_key, won, *progress = (
        np.array(column, dtype=object) for column in zip(*rows)
    )
    return {
        "uid": uid,
        "traj_uid": traj,
        "anchor_obs": anchor,
        "next_obs": next_anchor,  # where GraphGPO's rollout loop keeps the anchor each step returned
        "is_action_valid": valid,
        "rewards": reward,
        "action_key": action_key,  # the env's info, which a rollout loop copies for CRBC
        "won": won,
        # and for MVPO its milestones, before and after the step
        **dict(
            zip(("progress_signature", "milestones", "next_progress_signature", "next_milestones"), progress)
        ),
    }


def batch(rollout: dict) -> DataProto:
    """A DataProto as verl-agent builds it: the episode's return on every step's last token (its
    episode reward manager), response lengths that differ, the step data in non_tensor_batch."""
    n = len(rollout["uid"])
    lengths = torch.randint(1, LENGTH + 1, (n,), generator=torch.Generator().manual_seed(0))
    mask = (torch.arange(LENGTH) < lengths[:, None]).float()
    totals = {
        t: sum(r for tr, r in zip(rollout["traj_uid"], rollout["rewards"]) if tr == t)
        for t in set(rollout["traj_uid"])
    }
    token_rewards = torch.zeros(n, LENGTH)
    token_rewards[torch.arange(n), lengths - 1] = torch.tensor(
        [totals[t] for t in rollout["traj_uid"]], dtype=torch.float32
    )
    non_tensors = {key: np.array(list(value), dtype=object) for key, value in rollout.items()}
    return DataProto.from_dict(
        tensors={"token_level_rewards": token_rewards, "response_mask": mask}, non_tensors=non_tensors
    )


def expected(rollout: dict, config: AdvantageConfig, state: MVPOState | None = None) -> np.ndarray:
    fingerprints = np.array([tuple(a) for a in rollout["anchor_obs"]], dtype=np.uint64)
    progress = ProgressColumns.from_columns(
        np.array(list(rollout["progress_signature"])),
        np.array(list(rollout["next_progress_signature"])),
        np.array([tuple(m) for m in rollout["milestones"]]),
        np.array([tuple(m) for m in rollout["next_milestones"]]),
        len(rollout["uid"]),
    )
    return reference_advantages(
        [float(r) for r in rollout["rewards"]],
        list(rollout["traj_uid"]),
        list(rollout["uid"]),
        [not v for v in rollout["is_action_valid"]],
        fingerprints,
        config,
        [a[0] for a in rollout["next_obs"]],
        [int(k) for k in rollout["action_key"]],
        [bool(w) for w in rollout["won"]],
        progress,
        state,
    )


@pytest.mark.parametrize(
    ("estimator", "step_return"),
    [
        ("hgpo", None), ("gigpo", None), ("graphgpo", None), ("hgpo", "graph"), ("g2po", None), ("crbc", None),
        ("mvpo", None),
    ],
)  # fmt: skip
@pytest.mark.parametrize("mode", ["mean_norm", "mean_std_norm"])
def test_verls_compute_advantage_runs_the_registered_estimator(rollout, estimator, step_return, mode):
    own_mode = "mean_std_norm" if estimator == "mvpo" else mode  # MVPO's only mode, whatever is registered
    config = AdvantageConfig(estimator=estimator, mode=own_mode, step_return=step_return, gamma=0.5)
    register_estimators(AdvantageConfig(mode=mode, step_return=step_return, gamma=0.5))
    data = attach_step_keys(batch(rollout))
    shuffle = np.random.default_rng(0).permutation(len(data))
    data.reorder(torch.as_tensor(shuffle))  # as verl's balance_batch may: the estimator restores step order
    data = compute_advantage(data, estimator, config=AlgoConfig(adv_estimator=estimator))

    want = expected(rollout, config)[shuffle]
    assert np.abs(want).max() > 1e-3  # the comparison can fail
    if estimator == "crbc":  # and CRBC's step credit from its episode term alone
        episode_only = replace(config, crbc=replace(config.crbc, step_weight=0.0))
        assert not np.allclose(want, expected(rollout, episode_only)[shuffle])
    if config.returns == "graph":  # and it tells graph returns from discounted ones
        assert not np.allclose(want, expected(rollout, replace(config, step_return="discounted"))[shuffle])
    mask = data.batch["response_mask"]
    np.testing.assert_allclose(
        data.batch["advantages"].numpy(), (want[:, None] * mask.numpy()), rtol=1e-5, atol=1e-6
    )
    assert torch.equal(data.batch["returns"], data.batch["advantages"])


def test_mvpo_carries_its_state_from_batch_to_batch(rollout):
    register_estimators(names=["mvpo"])
    config = AdvantageConfig(estimator="mvpo")
    first = compute_advantage(
        attach_step_keys(batch(rollout)), "mvpo", config=AlgoConfig(adv_estimator="mvpo")
    )
    carried = estimator_state("mvpo")
    assert carried is not None and carried["weights"] != [0.2, 0.3, 0.5, 10.0, 0.0]
    second = compute_advantage(
        attach_step_keys(batch(rollout)), "mvpo", config=AlgoConfig(adv_estimator="mvpo")
    )
    mask = second.batch["response_mask"].numpy()
    for data, state in ((first, None), (second, MVPOState.from_dict(carried))):
        want = expected(rollout, config, state)
        np.testing.assert_allclose(
            data.batch["advantages"].numpy(), want[:, None] * mask, rtol=1e-5, atol=1e-6
        )
    restore_estimator_state("mvpo", carried)  # as a resume would, from what was saved beside the checkpoint
    third = compute_advantage(
        attach_step_keys(batch(rollout)), "mvpo", config=AlgoConfig(adv_estimator="mvpo")
    )
    assert torch.equal(third.batch["advantages"], second.batch["advantages"])


DOCS_PAGE = Path(__file__).resolve().parents[2] / "docs" / "integrations" / "verl.md"


def docs_example(number: int) -> str:
    return re.findall(r"^```python\n(.*?)^```", DOCS_PAGE.read_text(), re.DOTALL | re.MULTILINE)[number - 1]


def assert_docs_advantages(data: DataProto, rollout: dict) -> None:
    """HGPO with the docs' settings on every response token."""
    want = expected(rollout, AdvantageConfig(gamma=0.95, mode="mean_norm"))
    mask = data.batch["response_mask"].numpy()
    np.testing.assert_allclose(data.batch["advantages"].numpy(), want[:, None] * mask, rtol=1e-5, atol=1e-6)


def test_the_docs_estimator_lines_run(rollout):
    """docs/integrations/verl.md's lines, run on a batch of real steps, then verl's compute_advantage."""
    code = docs_example(1)
    scope = {"batch": batch(rollout)}
    exec(code, scope)  # noqa: S102  -- the documentation's own lines
    data = compute_advantage(scope["batch"], "hgpo", config=AlgoConfig(adv_estimator="hgpo"))
    assert_docs_advantages(data, rollout)


def test_the_docs_verl_agent_lines_run(rollout):
    """The lines a verl-agent user pastes, run with verl-agent's names in scope (Rooms for ALFWorld)."""
    code = docs_example(2).replace('"HGPO-ALFWorld-v0"', '"HGPO-Rooms-v0"')
    config = SimpleNamespace(
        data=SimpleNamespace(train_batch_size=GROUPS),
        env=SimpleNamespace(rollout=SimpleNamespace(n=GROUP_SIZE), seed=0),
    )
    data = batch(rollout)
    scope = {"config": config, "batch": data, "data": data, "adv_estimator": "hgpo", "gamma": 0.95}
    try:
        exec(code, scope)  # noqa: S102  -- the documentation's own lines
        assert scope["envs"].reset([{"task_id": 2}] * (GROUPS * GROUP_SIZE))[0]["text"][0]
    finally:
        scope["envs"].close()
    assert_docs_advantages(data, rollout)


def test_step_advantages_for_trainers_without_the_registry(rollout):
    config = AdvantageConfig(estimator="hgpo", mode="mean_norm")
    advantages, _ = step_advantages(batch(rollout), config)
    np.testing.assert_allclose(
        advantages.sum(-1) / batch(rollout).batch["response_mask"].sum(-1),
        expected(rollout, config),
        rtol=1e-5,
        atol=1e-6,
    )


def test_step_keys_behave_as_the_uid_and_survive_pickling(rollout):
    data = attach_step_keys(batch(rollout))
    keys = data.non_tensor_batch["uid"]
    assert list(keys) == list(rollout["uid"]) and len(set(keys)) == GROUPS
    restored = pickle.loads(pickle.dumps(data))
    key = restored.non_tensor_batch["uid"][5]
    restored_fields = (key.episode, key.step, key.fingerprints, key.next_state, key.action_key, key.won)
    assert isinstance(key, StepKey) and restored_fields == (
        keys[5].episode,
        keys[5].step,
        keys[5].fingerprints,
        rollout["next_obs"][5][0],
        rollout["action_key"][5],
        rollout["won"][5],
    )
    assert [k.step for k in keys[:3]] == [0, 1, 2]


def test_clear_errors(rollout, monkeypatch):
    register_estimators()
    with pytest.raises(ValueError, match="attach_step_keys"):
        compute_advantage(batch(rollout), "hgpo", config=AlgoConfig(adv_estimator="hgpo"))
    data = batch(rollout)
    del data.non_tensor_batch["anchor_obs"]
    with pytest.raises(ValueError, match="anchor_obs"):
        attach_step_keys(data)
    data = batch(rollout)
    del data.non_tensor_batch["next_obs"]  # a stock verl-agent rollout: no next anchors
    register_estimators(AdvantageConfig(step_return="graph"), names=["hgpo"])
    with pytest.raises(ValueError, match="next_obs"):
        compute_advantage(attach_step_keys(data), "hgpo", config=AlgoConfig(adv_estimator="hgpo"))
    data = batch(rollout)
    del data.non_tensor_batch["action_key"]  # a stock verl-agent rollout: no action keys
    register_estimators(names=["crbc"])
    with pytest.raises(ValueError, match=r"crbc needs each step's action key and won .*'action_key', 'won'"):
        compute_advantage(attach_step_keys(data), "crbc", config=AlgoConfig(adv_estimator="crbc"))
    data = batch(rollout)
    del data.non_tensor_batch["milestones"]  # a rollout loop that copies no milestones
    register_estimators(names=["mvpo"])
    with pytest.raises(ValueError, match=r"mvpo needs each step's won and milestones .*'progress_signature'"):
        compute_advantage(attach_step_keys(data), "mvpo", config=AlgoConfig(adv_estimator="mvpo"))
    with pytest.raises(ValueError, match="'nope' is not an estimator register_estimators registered"):
        estimator_state("nope")
    monkeypatch.setitem(core_algos.ADV_ESTIMATOR_REGISTRY, "hgpo", len)  # someone else's "hgpo"
    with pytest.raises(ValueError, match="not this project's"):
        register_estimators(names=["hgpo"])


def test_missing_verl_names_the_extra(monkeypatch):
    message = import_error_without(monkeypatch, "integrations.verl", "verl.trainer.ppo.core_algos")
    assert "pip install -e '.[verl]' in an environment of its own" in message
    assert "scripts/test_verl.sh" in message
