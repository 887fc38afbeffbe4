"""HGPO-* environments in OpenRLHF's agent API (``--train.agent_func_path``, OpenRLHF 0.11), environment level.

OpenRLHF's ``MultiTurnAgentExecutor`` plays one episode per sample as a growing token sequence:
prompt, response, environment feedback, response, ... and trains on it as one trajectory with
its own estimator (``--algo.advantage.estimator group_norm`` is GRPO over ``--rollout.n_samples_per_prompt``
samples). This module supplies the agent: each sample's label names a task, the env's turns are
written in the model's chat template, and the episode's env reward (minus a penalty per invalid
step) is the sample's reward. A chat env (``prompt_format="chat"``, ``history_length=0``: the
sequence is the memory) opens with its system message and first observation rendered with its
tools, and each later turn is its observation (a tool message after a reply that called a tool).
For step-level HGPO on OpenRLHF use this project's own backend (``python -m hgpo_train --backend
openrlhf``): there every step is its own sample, grouped by fingerprints.

Point OpenRLHF at a file that defines ``AgentExecutor``, e.g.::

    from integrations.openrlhf_agent import agent_executor
    AgentExecutor = agent_executor("HGPO-ALFWorld-v0", max_steps=50)

or at ``integrations/openrlhf_agent_func.py``, which reads the env from ``$HGPO_ENV_ID`` and
``$HGPO_ENV_KWARGS`` (JSON).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from hgpo_train.rollout.generation import end_token_id
from integrations._framework import missing_framework, turn_message
from integrations.session import EnvSession

try:
    import torch
    from openrlhf.utils.agent import AgentInstanceBase, MultiTurnAgentExecutor
except ImportError as error:
    raise missing_framework("openrlhf-agent", error) from error


def parse_label(label: Any) -> tuple[int | None, int | None]:
    """``(task_id, seed)`` from a sample's label: ``{"task_id": 3, "seed": 7}`` (either key), its
    JSON text, or a bare task id."""
    if isinstance(label, str):
        try:
            label = json.loads(label)
        except json.JSONDecodeError as error:
            raise ValueError(f"label {label!r} is neither JSON nor a task id") from error
    if isinstance(label, int) and not isinstance(label, bool):
        return label, None
    if isinstance(label, dict) and ({"task_id", "seed"} & label.keys()):
        task_id, seed = label.get("task_id"), label.get("seed")
        return (None if task_id is None else int(task_id), None if seed is None else int(seed))
    raise ValueError(
        f"a label must name a task: {{'task_id': i}} and/or {{'seed': s}}, or an int; got {label!r}"
    )


def write_tasks(path: str | Path, task_ids: Iterable[int]) -> Path:
    """A JSONL prompt dataset for OpenRLHF, one row per task: ``--data.input_key prompt --data.label_key label``.

    The prompt is empty (the agent writes the first turn from the env); the label names the task,
    so the ``--rollout.n_samples_per_prompt`` samples of a row play the same task.
    """
    path = Path(path)
    with path.open("w") as out:
        for task_id in task_ids:
            out.write(json.dumps({"prompt": "", "label": json.dumps({"task_id": int(task_id)})}) + "\n")
    return path


class ChatTurns:
    """The env's turns in the model's chat template, as text to append to the token sequence,
    rendered with the env's tools and template settings (a chat env's ``info["tools"]`` and
    ``info["chat_template_kwargs"]``).

    The model ends its reply with the end-of-turn token (kept in OpenRLHF's action text, whose
    ``skip_special_tokens`` is False by default); the next turn adds what the template puts after
    it, then the user (or tool) turn and the assistant header.
    """

    def __init__(
        self,
        tokenizer: Any,
        tools: Sequence[Mapping[str, Any]] = (),
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.tools = [dict(tool) for tool in tools] or None
        self.template_kwargs = dict(template_kwargs or {})
        self.end_text = tokenizer.decode([end_token_id(tokenizer)])
        reply = "\ue000"  # a private-use character: no template emits it by itself
        self._exchange = [{"role": "user", "content": "-"}, {"role": "assistant", "content": reply}]
        self._closed = self._render(self._exchange)
        self._after_reply = self._closed[self._closed.rindex(reply) + len(reply) :]
        if not self._after_reply.startswith(self.end_text):
            raise ValueError(f"the chat template does not end a reply with {self.end_text!r}")

    def _render(self, messages: list[dict[str, Any]], **kwargs: Any) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, tools=self.tools, **self.template_kwargs, **kwargs
        )

    def first(self, prompt: Any) -> str:
        """The episode's opening: a text prompt as a user turn, or a chat env's messages."""
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        return self._render(messages, add_generation_prompt=True)

    def next(self, message: dict[str, Any], reply_closed: bool) -> str:
        """The turn ``message`` after a reply; ``reply_closed``: the reply already ends with the
        end-of-turn text."""
        opened = self._render([*self._exchange, message], add_generation_prompt=True)
        if not opened.startswith(self._closed):
            raise ValueError("the chat template renders earlier turns differently once a turn is added")
        after = self._after_reply[len(self.end_text) :] if reply_closed else self._after_reply
        return after + opened[len(self._closed) :]

    def strip_end(self, reply: str) -> tuple[str, bool]:
        """The reply without its end-of-turn text, and whether it had one."""
        closed = reply.endswith(self.end_text)
        return (reply[: -len(self.end_text)] if closed else reply), closed


class HGPOAgentInstance(AgentInstanceBase):
    """One episode of one sample: OpenRLHF makes an instance per sample and calls reset, then step."""

    def __init__(self, executor: HGPOAgentExecutor, tokenizer: Any) -> None:
        self.executor = executor
        self.tokenizer = tokenizer
        self.turns: ChatTurns | None = None
        self.session: EnvSession | None = None

    async def reset(self, states: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        task_id, seed = parse_label(states["label"])
        self.session = self.executor.take_session()
        prompt = await asyncio.to_thread(self.session.reset, task_id=task_id, seed=seed)
        self.turns = self.executor.chat_turns(self.tokenizer, self.session.info)
        return {"observation": self.turns.first(prompt)}

    async def step(self, state_dict: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        session, turns = self.session, self.turns
        if session is None or turns is None:
            raise RuntimeError("step() before reset()")
        reply, closed = turns.strip_end(state_dict["action_text"])
        before = session.episode_return
        prompt, _, done = await asyncio.to_thread(session.step, reply)
        feedback = "" if done else turns.next(turn_message(prompt, session.info), closed)
        result = {
            "rewards": torch.tensor(
                session.episode_return - before
            ),  # summed by OpenRLHF: the episode return
            "scores": torch.tensor(session.episode_return),
            "environment_feedback": feedback,
            "done": done,
            "sampling_params": state_dict.get("sampling_params"),
            "extra_logs": {
                "won": float(session.won),
                "env_score": session.score,
                "env_steps": float(session.steps),
                "invalid_steps": float(session.invalid_steps),
            },
        }
        if done:
            self.executor.return_session(session)
            self.session = None
        return result


class HGPOAgentExecutor(MultiTurnAgentExecutor):
    """OpenRLHF's multi-turn executor over an HGPO-* env; envs are reused across samples.

    Args:
        env_id: a registered HGPO-* id.
        invalid_penalty: subtracted from the sample's reward per invalid step.
        env_kwargs: passed to ``gymnasium.make`` (``response_format``, ``max_steps``, env options).
    """

    def __init__(self, env_id: str, *, invalid_penalty: float = 0.1, **env_kwargs: Any) -> None:
        super().__init__(HGPOAgentInstance)
        self.env_id = env_id
        self.invalid_penalty = invalid_penalty
        self.env_kwargs = env_kwargs
        self._idle: list[EnvSession] = []
        self._turns: ChatTurns | None = None

    def take_session(self) -> EnvSession:
        """An idle env, or a new one: as many envs as episodes run at once, not one per sample."""
        if self._idle:
            return self._idle.pop()
        return EnvSession(self.env_id, invalid_penalty=self.invalid_penalty, **self.env_kwargs)

    def return_session(self, session: EnvSession) -> None:
        self._idle.append(session)

    def chat_turns(self, tokenizer: Any, info: Mapping[str, Any]) -> ChatTurns:
        """The turns in ``tokenizer``'s template with the env's tools and settings (from a reset's
        ``info``: the same for every episode of the env), made once."""
        if self._turns is None or self._turns.tokenizer is not tokenizer:
            self._turns = ChatTurns(tokenizer, info.get("tools", ()), info.get("chat_template_kwargs"))
        return self._turns

    async def execute(
        self, prompt, label, sampling_params, max_length: int, hf_tokenizer, llm_engine, images=None
    ):
        # The instance writes turns in the tokenizer's chat template, and OpenRLHF makes instances
        # without arguments: bind this executor and the tokenizer (the same for every call).
        made: list[HGPOAgentInstance] = []  # this call's instance (made before its first await)

        def make_instance() -> HGPOAgentInstance:
            made.append(HGPOAgentInstance(self, hf_tokenizer))
            return made[-1]

        self.agent_instance_cls = make_instance
        try:
            return await super().execute(
                prompt, label, sampling_params, max_length, hf_tokenizer, llm_engine, images
            )
        finally:  # an episode OpenRLHF cut for length never saw `done`: its env goes back too
            for instance in made:
                if instance.session is not None:
                    self.return_session(instance.session)
                    instance.session = None

    def close(self) -> None:
        """Close the idle envs (all of them once no episode runs)."""
        while self._idle:
            self._idle.pop().close()


def agent_executor(env_id: str, **kwargs: Any) -> type[HGPOAgentExecutor]:
    """The ``AgentExecutor`` class an ``--train.agent_func_path`` file must define (OpenRLHF makes it
    without arguments); ``kwargs`` go to :class:`HGPOAgentExecutor`. Bad env arguments fail here."""
    EnvSession(env_id, **kwargs).close()

    class AgentExecutor(HGPOAgentExecutor):
        def __init__(self) -> None:
            super().__init__(env_id, **kwargs)

    return AgentExecutor
