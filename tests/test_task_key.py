"""``info["task_key"]``: one stable identity per task, hidden configuration included, and the pool
refusing a group whose members did not play the same task."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import pytest
import xxhash

import hgpo_env
from hgpo_env.contract.fingerprint import task_key
from hgpo_env.vector import GroupedEnvPool, GroupMismatchError

HERE = Path(__file__).parent


def keys_of(env_id: str, task_ids: list[int], **kwargs) -> list[int]:
    env = gym.make(env_id, response_format="plain", **kwargs)
    keys = []
    for task_id in task_ids:
        _, info = env.reset(seed=0, options={"task_id": task_id})
        keys.append(info["task_key"])
    env.close()
    return keys


def test_task_key_follows_its_definition():
    seed = xxhash.xxh3_64_intdigest(b"hgpo-task|v1|rooms")
    assert task_key("rooms", "house 7") == xxhash.xxh3_64_intdigest(b"house 7", seed)
    assert task_key("rooms", b"house 7") == task_key("rooms", "house 7") != task_key("webshop", "house 7")


def test_rooms_key_is_the_layout_on_every_step():
    env = gym.make("HGPO-Rooms-v0", response_format="plain")
    _, info = env.reset(seed=1, options={"task_id": 10_003})
    key = info["task_key"]
    assert key == task_key("rooms", repr(env.unwrapped.task_spec))
    for _ in range(3):
        *_, info = env.step(env.unwrapped.expert_action())
        assert info["task_key"] == key  # constant within the episode, on every step's info
    assert len(set(keys_of("HGPO-Rooms-v0", list(range(10_000, 10_040))))) == 40


def test_alfworld_and_webshop_keys_tell_tasks_apart(shared_data: Path):
    pytest.importorskip("alfworld")
    games = {"split": "valid_seen", "data_path": shared_data / "alfworld", "disk_cache": False}
    alfworld = keys_of("HGPO-ALFWorld-v0", [0, 1, 2, 0], **games)
    assert len(set(alfworld[:3])) == 3 and alfworld[0] == alfworld[3]
    shop = {"data_path": shared_data / "webshop"}
    webshop = keys_of("HGPO-WebShop-v0", [0, 1, 2, 0], **shop)
    assert len(set(webshop[:3])) == 3 and webshop[0] == webshop[3]


STABILITY = """
import json, sys
import gymnasium as gym
import hgpo_env
from hgpo_env.envs.textarena import TextArenaEnv
keys = [gym.make("HGPO-Rooms-v0").reset(options={"task_id": t})[1]["task_key"] for t in (5, 10_005)]
keys += [TextArenaEnv("Secretary-v0").reset(options={"task_id": t})[1]["task_key"] for t in (1, 2)]
print(json.dumps(keys))
"""


def test_keys_are_equal_across_processes_and_hash_seeds():
    """Secretary binds random.random when built: before the preset built it inside the env's
    private stream, its draws (and so its task) differed between processes for one seed."""
    pytest.importorskip("textarena")
    runs = []
    for hash_seed in ("1", "2"):
        answer = subprocess.run(
            [sys.executable, "-c", STABILITY],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": hash_seed},
        )
        runs.append(json.loads(answer.stdout.strip().splitlines()[-1]))
    assert runs[0] == runs[1] and len(set(runs[0])) == 4


def test_the_pool_verifies_hidden_state_that_first_observations_do_not_show():
    """Lockbox: every task starts with the same text; the seed sets the combination."""
    with GroupedEnvPool(
        "byo_envs:TestLockbox-v0", 4, 3, num_workers=2, seed=0, response_format="plain"
    ) as pool:
        results = pool.reset(seeds=[1, 2, 3, 4])
    assert len({r.info["initial_fingerprint"] for r in results}) == 1  # blind to the combination
    keys = [{results[i].info["task_key"] for i in pool.members(g)} for g in range(4)]
    assert all(len(k) == 1 for k in keys) and len(set().union(*keys)) >= 2


def test_the_pool_refuses_members_on_different_hidden_states():
    """A combination drawn from the unseeded global stream: the members' task keys differ, and
    the error names them."""
    with (
        GroupedEnvPool(
            "byo_envs:TestGlobalLockbox-v0", 2, 4, num_workers=2, seed=0, response_format="plain"
        ) as pool,
        pytest.raises(GroupMismatchError) as refused,
    ):
        pool.reset(seeds=[1, 2])
    message = str(refused.value)
    assert "group 0 (seed 1" in message and "members [" in message and "differ from the other" in message
    assert "in task_key;" in message  # the first observations agree: only the key saw it


def test_a_default_key_cannot_see_hidden_state():
    """Without a task_key source the adapter's key is the task id, task and first text: a dropped
    seed shows there, a hidden state the seed did not set does not (the health check says so)."""
    with GroupedEnvPool(
        "byo_envs:TestLockboxDefaultKey-v0", 2, 4, num_workers=2, seed=0, response_format="plain"
    ) as pool:
        results = pool.reset(seeds=[1, 2])
    assert len({r.info["task_key"] for r in results[:4]}) == 1


class SeedDropper(gym.Wrapper):
    """What a server that forgets the seed does: the env below draws its own task."""

    def reset(self, *, seed=None, options=None):
        return self.env.reset()


def test_a_dropped_seed_changes_the_default_key():
    from byo_envs import LOCKBOX, Lockbox

    keys = set()
    for _ in range(4):
        text_env = hgpo_env.TextAdapter(Lockbox(), dataclasses.replace(LOCKBOX, task_key=None))
        env = hgpo_env.KStepMemory(hgpo_env.ParseResponse(SeedDropper(text_env), "plain"))
        keys.add(env.reset(seed=5)[1]["task_key"])
    assert len(keys) == 4


def test_the_check_plays_the_wrapped_envs_expert_and_flags_seed_blind_tasks():
    from hgpo_env.tools.check import check_env_health

    keyed = check_env_health("TestLockbox-v0", {"max_steps": 12}, groups=3, group_size=2)
    assert keyed.ok and not keyed.warnings, keyed.format()
    assert keyed.won >= 3  # the even members follow the lockbox's own expert_action: every one opens it
    plain = check_env_health("TestLockboxPlainKey-v0", {"max_steps": 12}, groups=3, group_size=2)
    assert plain.ok and "cannot see what the seed hides" in " ".join(plain.warnings), plain.format()
    stuck = check_env_health("TestStuckLockbox-v0", {"max_steps": 12}, groups=3, group_size=2)
    assert stuck.ok and "may ignore its seed" in " ".join(stuck.warnings), stuck.format()
