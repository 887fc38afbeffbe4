"""OpenRLHF agent API against the real ``openrlhf`` package: its MultiTurnAgentExecutor runs our agent,
its loader reads our --agent_func_path file, and its experience builder takes the result.

The vLLM engine is GPU-only; a local stand-in replaces it (ExpertEngine below), replying with the
Rooms expert's commands from a replica of the env, as token ids like vLLM's. vllm and flash_attn,
imported by OpenRLHF modules at import time, are stubbed where those modules are imported.
"""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import gymnasium as gym
import pytest
from integration_setup import ENV_ID, ROOMS, import_error_without
from transformers import AutoTokenizer

from hgpo_train.openrlhf.stubs import stubbed_gpu_packages
from integrations.openrlhf_agent import HGPOAgentExecutor, agent_executor, parse_label, write_tasks

ENV_KWARGS = {"response_format": "plain", "max_steps": 30, **ROOMS}


class ExpertEngine:
    """Stands in for OpenRLHF's vLLM engine: replies with the expert's command for a replica of the
    episode (after ``invalid_first`` inadmissible replies), each ending with the end-of-turn token."""

    def __init__(self, tokenizer, task_id: int, invalid_first: int = 0, calls: bool = False) -> None:
        self.tokenizer = tokenizer
        self.calls = calls  # the expert's commands as hermes tool calls (the reply that is not: as text)
        self.replica = gym.make(ENV_ID, history_length=0, **ENV_KWARGS)
        self.replica.reset(options={"task_id": task_id})
        self.invalid_left = invalid_first
        self.replies: list[str] = []

    async def generate(self, prompt_token_ids, sampling_params, multi_modal_data=None):
        if self.invalid_left:
            self.invalid_left -= 1
            reply = "fly away"
        else:
            reply = self.replica.unwrapped.expert_action()
        self.replica.step(reply)
        if self.calls and reply != "fly away":
            reply = f'<tool_call>\n{{"name": "act", "arguments": {{"command": "{reply}"}}}}\n</tool_call>'
        self.replies.append(reply)
        ids = self.tokenizer.encode(reply, add_special_tokens=False) + [self.tokenizer.eos_token_id]
        text = self.tokenizer.decode(ids, skip_special_tokens=sampling_params.skip_special_tokens)
        return SimpleNamespace(
            outputs=[SimpleNamespace(token_ids=ids, text=text, finish_reason="stop", logprobs=None)]
        )


def sampling_params():
    """The fields of vLLM's SamplingParams the executor reads, with OpenRLHF's defaults."""
    return SimpleNamespace(max_tokens=None, logprobs=None, skip_special_tokens=False)


def play(executor, tokenizer, label, engine):
    return asyncio.run(executor.execute("", label, sampling_params(), 4096, tokenizer, engine))


def test_an_episode_through_openrlhfs_executor_and_experience_builder(tiny_model):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    executor = agent_executor(ENV_ID, **ENV_KWARGS)()
    engine = ExpertEngine(tokenizer, task_id=5, invalid_first=1)
    result = play(executor, tokenizer, json.dumps({"task_id": 5}), engine)

    assert result["reward"] == pytest.approx(10.0 - 0.1)  # won, one invalid step
    assert result["scores"] == pytest.approx(10.0 - 0.1)
    assert result["extra_logs"]["won"] == 1.0 and result["extra_logs"]["invalid_steps"] == 1.0

    # the token sequence is the conversation in the model's chat template: env turns and replies
    reference = gym.make(ENV_ID, history_length=0, **ENV_KWARGS)
    text, _ = reference.reset(options={"task_id": 5})
    messages = [{"role": "user", "content": text}]
    for reply in engine.replies:
        text, _, terminated, truncated, _ = reference.step(reply)
        messages.append({"role": "assistant", "content": reply})
        if not (terminated or truncated):
            messages.append({"role": "user", "content": text})
    rendered = tokenizer.apply_chat_template(messages, tokenize=False)
    tokens = result["observation_tokens"]
    assert rendered.startswith(tokenizer.decode(tokens)) and rendered[len(tokenizer.decode(tokens)) :] == "\n"
    # the action ranges are exactly the replies
    assert [tokenizer.decode(tokens[a:b]) for a, b in result["action_ranges"]] == [
        r + "<|im_end|>" for r in engine.replies
    ]

    with stubbed_gpu_packages():  # openrlhf's samples_generator imports vllm at module level
        from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator

        experience = SamplesGenerator._process_response_into_experience(None, result, max_len=4096)
    assert experience.rewards.item() == pytest.approx(9.9)
    assert experience.info["won"].item() == 1.0
    assert experience.action_mask.sum().item() == sum(b - a for a, b in result["action_ranges"])


def test_a_chat_env_opens_with_its_messages_and_answers_calls_with_tool_turns(tiny_model):
    chat = {**ENV_KWARGS, "prompt_format": "chat", "response_format": "tool_call"}
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    executor = agent_executor(ENV_ID, **chat)()
    engine = ExpertEngine(tokenizer, task_id=5, invalid_first=1, calls=True)
    result = play(executor, tokenizer, json.dumps({"task_id": 5}), engine)
    assert result["reward"] == pytest.approx(10.0 - 0.1)  # won by calls, one reply without a call

    # the sequence is the env's messages, then each reply and the observation it led to: a tool
    # message after a call, a user message after the reply that made none; rendered with the tools
    reference = gym.make(ENV_ID, history_length=0, **chat)
    conversation, info = reference.reset(options={"task_id": 5})
    assert [m["role"] for m in conversation] == ["system", "user"]
    for reply in engine.replies:
        messages, _, terminated, truncated, _ = reference.step(reply)
        conversation.append({"role": "assistant", "content": reply})
        if not (terminated or truncated):
            role = "tool" if reply.startswith("<tool_call>") else "user"
            conversation.append({"role": role, "content": messages[-1]["content"]})
    assert {"user", "tool"} <= {m["role"] for m in conversation[2:]}
    rendered = tokenizer.apply_chat_template(conversation, tools=info["tools"], tokenize=False)
    played = tokenizer.decode(result["observation_tokens"])
    assert "<|im_start|>tools" in played and rendered == played + "\n"


def test_samples_of_one_prompt_play_its_task_and_share_envs(tiny_model):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    executor = agent_executor(ENV_ID, **ENV_KWARGS)()

    async def group(label, size):
        engines = [ExpertEngine(tokenizer, task_id=label) for _ in range(size)]
        runs = [executor.execute("", label, sampling_params(), 4096, tokenizer, e) for e in engines]
        return await asyncio.gather(*runs)

    first = asyncio.run(group(7, 4))
    assert len({tuple(r["observation_tokens"][: r["action_ranges"][0][0]]) for r in first}) == 1
    assert all(r["reward"] == pytest.approx(10.0) for r in first)
    assert len(executor._idle) == 4  # four episodes at once: four envs, all idle again
    asyncio.run(group(9, 4))
    assert len(executor._idle) == 4  # reused, none made


def test_openrlhf_loads_the_agent_func_file(monkeypatch):
    monkeypatch.setenv("HGPO_ENV_ID", ENV_ID)
    monkeypatch.setenv("HGPO_ENV_KWARGS", json.dumps(ENV_KWARGS))
    with stubbed_gpu_packages():
        from openrlhf.trainer.ray.vllm_engine import _load_agent_executor

        executor = _load_agent_executor("integrations/openrlhf_agent_func.py")
    assert isinstance(executor, HGPOAgentExecutor)
    assert executor.env_id == ENV_ID and executor.env_kwargs == ENV_KWARGS
    monkeypatch.delenv("HGPO_ENV_ID")
    with stubbed_gpu_packages(), pytest.raises(RuntimeError, match="HGPO_ENV_ID"):
        _load_agent_executor("integrations/openrlhf_agent_func.py")


def test_labels_and_task_files(tmp_path):
    path = write_tasks(tmp_path / "tasks.jsonl", [4, 11])
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [parse_label(row["label"]) for row in rows] == [(4, None), (11, None)]
    assert parse_label({"seed": 3}) == (None, 3) and parse_label(12) == (12, None)
    for bad in ("{}", "north", {"task": 1}, True):
        with pytest.raises(ValueError, match="label"):
            parse_label(bad)


def test_bad_env_arguments_fail_when_the_executor_class_is_made():
    with pytest.raises(TypeError):
        agent_executor(ENV_ID, colour=1)
    with pytest.raises(ValueError, match="keeps the conversation, which is a chat env's memory"):
        agent_executor(ENV_ID, prompt_format="chat", history_length=2)


def test_missing_openrlhf_names_the_extra(monkeypatch):
    message = import_error_without(monkeypatch, "integrations.openrlhf_agent", "openrlhf.utils.agent")
    assert "pip install -e '.[openrlhf-agent]'" in message and "\n" not in message


def test_episodes_cut_for_length_give_their_envs_back(tiny_model, monkeypatch):
    """OpenRLHF stops an episode once its token budget is spent, without a `done` from the env."""
    import integrations.openrlhf_agent as agent_module

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    executor = agent_executor(ENV_ID, **ENV_KWARGS)()
    built, closed = [], []

    class CountedSession(agent_module.EnvSession):
        def __init__(self, *args, **kwargs):
            built.append(self)
            super().__init__(*args, **kwargs)

        def close(self):
            closed.append(self)
            super().close()

    monkeypatch.setattr(agent_module, "EnvSession", CountedSession)

    async def group(size):
        engines = [ExpertEngine(tokenizer, task_id=7, invalid_first=100) for _ in range(size)]
        runs = [executor.execute("", "7", sampling_params(), 600, tokenizer, e) for e in engines]
        return await asyncio.gather(*runs)

    for _ in range(3):  # 12 samples, 4 at a time, every one cut for length
        results = asyncio.run(group(4))
        assert all(r["extra_logs"]["env_steps"] < 30 for r in results)  # cut before the env's own end
    assert len(built) == 4 and len(executor._idle) == 4  # 4 envs served the 12 samples
    executor.close()
    assert not executor._idle and sorted(map(id, closed)) == sorted(map(id, built))
