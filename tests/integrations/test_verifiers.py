"""verifiers (v1) integration against the real ``verifiers`` package: our env played through
verifiers' own rollout machinery (its ``null`` chat harness in a subprocess runtime, its
interception server and eval client), a scripted model standing in for the LLM
(tests/scripted_model.py: no model can be downloaded here)."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import verifiers.v1 as vf
from integration_setup import ENV_ID, ROOMS, import_error_without
from verifiers.v1.utils.loaders import load_environment

from hgpo_train.advantage import AdvantageConfig, step_credit
from integrations.verifiers import (
    HGPOEnvConfig,
    HGPOTasksetConfig,
    assign_step_credit,
    trace_steps,
)
from integrations.verifiers.env import TURN_FIELDS

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from scripted_model import scripted_model

REPO = Path(__file__).resolve().parents[2]
ENV_KWARGS = {"history_length": 2, "max_steps": 6, **ROOMS}
ROLLOUTS = 3


def play_group(env_kwargs: dict, rollouts: int, seed: int = 0) -> list[vf.Trace]:
    """``rollouts`` episodes of task ``seed`` through verifiers, against the scripted model."""
    # verifiers' harness runs its chat program with uv: the one this environment installed
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    taskset = HGPOTasksetConfig(id="hgpo-verifiers", env=ENV_ID, env_kwargs=env_kwargs, first_seed=seed)
    agent = vf.AgentConfig(harness={"id": "null"}, runtime={"type": "subprocess"})
    env = load_environment(HGPOEnvConfig(taskset=taskset, agent=agent))
    task = next(iter(env.taskset))

    async def run(url: str) -> list[vf.Episode]:
        model = vf.ModelContext(model="scripted", client=vf.EvalClientConfig(base_url=url))
        async with env.serving():
            return await asyncio.gather(*(env.run_episode(task, model) for _ in range(rollouts)))

    with scripted_model() as url:
        episodes = asyncio.run(run(url))
    assert all(episode.ok for episode in episodes), [episode.errors for episode in episodes]
    return [episode.traces[0] for episode in episodes]


@pytest.fixture(scope="module")
def group() -> list[vf.Trace]:
    return play_group(ENV_KWARGS, ROLLOUTS)


def replay(trace: vf.Trace, env_kwargs: dict = ENV_KWARGS) -> dict:
    """The trace's replies played on the env directly: its prompts, keys and reward."""
    env = gym.make(ENV_ID, **env_kwargs)
    prompt, info = env.reset(seed=trace.task.data.info["seed"])
    played = {name: [] for name in TURN_FIELDS}
    played["prompts"] = [prompt]
    played["task_key"] = info["task_key"]
    for message in trace.assistant_messages:
        played["fingerprints"].append(list(info["fingerprints"]))
        played["turn"].append(info["turn"])
        prompt, reward, terminated, truncated, info = env.step(message.content)
        played["prompts"].append(prompt)
        played["action_key"].append(info["action_key"])
        played["next_state"].append(info["fingerprints"][0])
        played["reward"].append(reward)
        played["invalid"].append(not info["action_valid"])
    assert terminated or truncated
    played["prompts"].pop()  # the prompt after the last step is never shown
    played["won"] = info["won"]
    env.close()
    return played


def test_a_played_task_matches_playing_the_env_directly(group):
    assert_played_as_the_env_plays(group, ENV_KWARGS)


def assert_played_as_the_env_plays(group: list[vf.Trace], env_kwargs: dict) -> None:
    assert len({trace.task.key for trace in group}) == 1
    replies = {tuple(m.content for m in trace.assistant_messages) for trace in group}
    assert len(replies) > 1, "the rollouts of the group should differ"
    for trace in group:
        played = replay(trace, env_kwargs)
        shown = [node.message.content for node in trace.nodes if node.message.role == "user"]
        assert shown == played["prompts"]  # the memory's prompts, turn by turn
        assert trace.task.key == str(played["task_key"])
        turns = trace.info["hgpo"]["turns"]
        for name in TURN_FIELDS:
            assert [turn[name] for turn in turns] == played[name], name
        assert trace.rewards["env_reward"].score == sum(played["reward"])
        assert trace.info["hgpo"]["won"] == played["won"]
        assert trace.metrics["invalid_steps"] == sum(t["invalid"] for t in turns)


def test_a_compaction_plays_its_summary_turns_through_verifiers():
    """memory= reaches the env like any gymnasium.make argument: each summary turn is an assistant
    turn of the trace, its prompt the request, its keys and reward 0 the env's own."""
    compaction = {
        **ENV_KWARGS,
        "memory": "compaction",
        "compact_every": 2,
        "history_length": 1,
        "max_steps": 5,
    }
    group = play_group(compaction, ROLLOUTS)
    assert_played_as_the_env_plays(group, compaction)
    turns = [turn for trace in group for turn in trace.info["hgpo"]["turns"]]
    summaries = [turn for turn in turns if turn["turn"] == "summary"]
    assert summaries and all(turn["reward"] == 0.0 and not turn["invalid"] for turn in summaries)
    credit = assign_step_credit(group, AdvantageConfig(estimator="hgpo", gamma=0.95))
    assert len(credit.advantages) == len(turns)


def test_step_credit_lands_on_each_turns_tokens(group):
    for trace in group:  # as a train client's trace: every assistant node with sampled tokens
        for node in trace.nodes:
            node.token_ids = [1, 2, 3, 4] if node.sampled else [5, 6]
            node.mask = [False, True, True, True] if node.sampled else [False, False]
    config = AdvantageConfig(estimator="hgpo", gamma=0.95)
    credit = assign_step_credit(group, config)

    played = [replay(trace) for trace in group]  # the expected credit, from the env's own columns
    expected = step_credit(
        np.concatenate([p["reward"] for p in played]),
        np.concatenate([[i] * len(p["reward"]) for i, p in enumerate(played)]),
        np.zeros(sum(len(p["reward"]) for p in played), dtype=np.int64),
        np.array([f for p in played for f in p["fingerprints"]], dtype=np.uint64),
        np.concatenate([p["invalid"] for p in played]),
        config,
    ).advantages
    np.testing.assert_allclose(credit.advantages, expected, rtol=0, atol=1e-12)
    assert np.abs(expected).max() > 0
    start = 0
    for trace in group:
        turns = len(trace.assistant_messages)
        per_turn = expected[start : start + turns]
        assert trace.info["step_advantages"] == pytest.approx(per_turn, abs=1e-12)
        (branch,) = trace.branches  # verifiers spreads node advantages over the branch's tokens
        spread = np.array(branch.advantages).reshape(-1)
        sampled = np.array(branch.sampled_mask)
        assert np.all(spread[~sampled] == 0)
        np.testing.assert_allclose(spread[sampled], np.repeat(per_turn, 3), atol=1e-12)
        start += turns


def test_any_trace_gets_keys_from_what_each_turn_showed(group):
    trace = max(group, key=lambda t: len(t.assistant_messages)).model_copy(deep=True)
    recorded = trace_steps(trace)
    del trace.info["hgpo"]  # as a trace of any verifiers env: keys from its own messages
    steps = trace_steps(trace, history_length=2, success_reward=10.0)
    turns = len(trace.assistant_messages)
    assert turns >= 3, "the longest rollout should have a third turn to compact before"
    assert steps.fingerprints.shape == (turns, 3) and steps.reward.sum() == trace.reward
    assert np.array_equal(steps.fingerprints != 0, _shown(np.arange(turns)))  # turn t shows t turns
    # the same grouping as the env's keys at level 0: same prompt text, same state
    assert _partition(steps.fingerprints[:, 0]) == _partition(
        [hash(node.message.content) for node in trace.nodes if node.message.role == "user"]
    )
    assert np.array_equal(steps.next_state[:-1], steps.fingerprints[1:, 0])
    assert _partition(steps.action_key) == _partition(recorded.action_key)

    # a compacted context: from turn 2 on, the branch restarts at that turn's prompt
    second = [i for i, node in enumerate(trace.nodes) if node.sampled][1]
    trace.nodes[second + 1].parent = None
    compacted = trace_steps(trace, history_length=2).fingerprints
    shown = _shown(np.where(np.arange(turns) < 2, np.arange(turns), np.arange(turns) - 2))
    assert np.array_equal(compacted != 0, shown)
    assert np.array_equal(compacted[shown], steps.fingerprints[shown])  # what is shown hashes alike


def _shown(earlier: np.ndarray) -> np.ndarray:
    """Levels 0..2 a turn's prompt shows when it shows ``earlier`` turns before it."""
    return np.arange(3)[None, :] <= earlier[:, None]


def _partition(keys) -> set[frozenset[int]]:
    """Which positions share a key: equal partitions mean the same grouping."""
    where: dict = {}
    for i, key in enumerate(keys):
        where.setdefault(int(key), set()).add(i)
    return {frozenset(rows) for rows in where.values()}


def test_bad_input_is_one_line(group, monkeypatch):
    with pytest.raises(ValueError, match=r"no env 'HGPO-Nope-v0' to make tasks from"):
        HGPOTasksetConfig(id="hgpo-verifiers", env="HGPO-Nope-v0")
    with pytest.raises(ValueError, match="the verifiers taskset plays text prompts"):
        HGPOTasksetConfig(id="hgpo-verifiers", env="HGPO-Rooms-v0", env_kwargs={"prompt_format": "chat"})
    other = group[0].model_copy(deep=True)
    other.task.key = "another task"
    with pytest.raises(
        ValueError, match=r"^a group is the rollouts of one task; these traces have 2 task keys$"
    ):
        assign_step_credit([group[1], other])
    empty = group[0].model_copy(deep=True)
    empty.nodes = [node for node in empty.nodes if not node.sampled]
    with pytest.raises(ValueError, match=rf"^trace {empty.id} has no model turns: nothing to credit$"):
        trace_steps(empty)
    failed = group[0].model_copy(deep=True)
    failed.ok, failed.errors = False, [vf.Error(type="ProviderError", message="upstream closed")]
    with pytest.raises(ValueError, match=r"did not finish cleanly \(ProviderError: upstream closed\)"):
        assign_step_credit([group[1], failed])
    with pytest.raises(ValueError, match=r"^assign_step_credit needs at least one trace$"):
        assign_step_credit([])
    episode = vf.Episode(task=group[0].task, traces=[group[0]])
    with pytest.raises(
        TypeError, match=r"^assign_step_credit takes verifiers Traces, got a Episode: pass their"
    ):
        assign_step_credit([episode])
    with pytest.raises(ValueError, match=r"^two success definitions: success_reward=1.0 and AdvantageConfig"):
        assign_step_credit(group, AdvantageConfig(estimator="g2po", success_reward=5.0))
    message = import_error_without(monkeypatch, "integrations.verifiers.env", "verifiers")
    assert message == "this integration needs verifiers: pip install -e '.[verifiers]'"


def test_a_module_id_env_gives_tasks_keyed_as_the_env_keys_them():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # byo_envs, as a user's module
    config = HGPOTasksetConfig(id="hgpo-verifiers", env="byo_envs:TestLockbox-v0", first_seed=3)
    tasks = list(load_environment(HGPOEnvConfig(taskset=config)).taskset.take(2))
    env = gym.make("byo_envs:TestLockbox-v0")
    for seed, task in zip((3, 4), tasks, strict=True):
        prompt, info = env.reset(seed=seed)
        assert (task.data.prompt, task.key, task.data.info["seed"]) == (prompt, str(info["task_key"]), seed)


def test_the_docs_script_runs_as_written(tmp_path):
    """docs/integrations/verifiers.md's script (this environment's, not the docs test's: it needs
    verifiers), its model URL pointed at the scripted model."""
    page = (REPO / "docs/integrations/verifiers.md").read_text()
    code = re.findall(r"^```python\n(.*?)^```", page, re.DOTALL | re.MULTILINE)[0]
    assert "http://127.0.0.1:8001/v1" in code
    script = tmp_path / "example.py"
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"  # this environment's uv
    with scripted_model() as url:
        script.write_text(code.replace("http://127.0.0.1:8001/v1", url))
        command, env = [sys.executable, str(script)], {**os.environ, "PATH": path}
        run = subprocess.run(
            command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False
        )
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.strip().splitlines()
    assert len(lines) == 4 and all(line.split()[1] in ("True", "False") for line in lines), run.stdout
