"""A finished verifiers trace as our step records: one per assistant turn, with the keys our
estimators group by.

A trace played through :class:`~integrations.verifiers.env.HGPOEnv` carries the keys the env
computed (``trace.info["hgpo"]``); those are used as they are. Any other trace gets keys computed
from its own message graph: a turn's state is the text the model was shown since its previous
reply (the task prompt on the first turn, tool results and user turns after), its action the reply
(text and tool calls), and its K+1 fingerprints hash that state with the last k (state, action)
pairs *on the turn's own branch*. So where a harness summarised or compacted the context, a level
the prompt no longer showed is 0 (not shown), as in our envs' prompts under a token budget.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from hgpo_env.contract.fingerprint import Fingerprinter, canonical_text, task_key
from integrations.verifiers.env import TURN_FIELDS

FAMILY = "verifiers"
"""The fingerprint family of keys computed from traces (our envs' traces keep their env's)."""


@dataclass(frozen=True)
class TraceSteps:
    """One rollout's steps, in turn order (row t is the trace's t-th model reply)."""

    task_key: int
    fingerprints: np.ndarray
    """uint64 (T, K+1)."""
    action_key: np.ndarray
    """uint64 (T,)."""
    next_state: np.ndarray
    """uint64 (T,): level 0 of the next turn's fingerprints (the last turn: of what followed it)."""
    reward: np.ndarray
    """float64 (T,): the env's step rewards; a trace without them gets its reward on its last turn."""
    invalid: np.ndarray
    """bool (T,)."""
    won: bool
    nodes: tuple[int, ...]
    """Index into ``trace.nodes`` of each turn's sampled message: where its advantage goes."""


def trace_steps(trace: Any, *, history_length: int = 2, success_reward: float = 1.0) -> TraceSteps:
    """``trace`` (a finished ``verifiers.v1.Trace``) as step records.

    Args:
        history_length: K, for traces whose keys are computed: levels 0..K.
        success_reward: such a trace succeeded (``won``, CRBC's success) when its reward reaches this.
    """
    if trace.has_error:
        why = f" ({trace.last_error.type}: {trace.last_error.message})" if trace.last_error else ""
        raise ValueError(f"trace {trace.id} did not finish cleanly{why}: leave it out of the group")
    nodes = tuple(i for i, node in enumerate(trace.nodes) if node.sampled)
    if not nodes:
        raise ValueError(f"trace {trace.id} has no model turns: nothing to credit")
    recorded = trace.info.get("hgpo")
    if recorded is not None:
        return _recorded_steps(trace, recorded, nodes)
    if history_length < 0:
        raise ValueError(f"history_length must be >= 0, got {history_length}")
    fingerprinter = Fingerprinter(FAMILY)
    turns = [_shown_turns(trace, i) for i in nodes]
    states, levels, actions = [], [], []
    for shown in turns:
        state = fingerprinter.state(shown[-1][0])
        past = [fingerprinter.record(fingerprinter.state(obs), act) for obs, act in reversed(shown[:-1])]
        states.append(state)
        levels.append(fingerprinter.levels(state, past, history_length + 1))
        actions.append(fingerprinter.action(shown[-1][1]))
    after = _text(trace.nodes[j].message for j in range(nodes[-1] + 1, len(trace.nodes)))
    reward = np.zeros(len(nodes))
    reward[-1] = trace.reward
    return TraceSteps(
        task_key=task_key(FAMILY, trace.task.key),
        fingerprints=np.array(levels, dtype=np.uint64),
        action_key=np.array(actions, dtype=np.uint64),
        next_state=np.array([*states[1:], fingerprinter.state(after)], dtype=np.uint64),
        reward=reward,
        invalid=np.zeros(len(nodes), dtype=bool),
        won=bool(trace.reward >= success_reward),
        nodes=nodes,
    )


def _recorded_steps(trace: Any, recorded: dict[str, Any], nodes: tuple[int, ...]) -> TraceSteps:
    turns = recorded["turns"]
    if len(turns) != len(nodes):
        raise ValueError(
            f"trace {trace.id} records keys for {len(turns)} turns but has {len(nodes)} model replies"
        )
    column = {name: [turn[name] for turn in turns] for name in TURN_FIELDS}
    return TraceSteps(
        task_key=int(recorded["task_key"]),
        fingerprints=np.array(column["fingerprints"], dtype=np.uint64),
        action_key=np.array(column["action_key"], dtype=np.uint64),
        next_state=np.array(column["next_state"], dtype=np.uint64),
        reward=np.array(column["reward"], dtype=np.float64),
        invalid=np.array(column["invalid"], dtype=bool),
        won=bool(recorded["won"]),
        nodes=nodes,
    )


def _shown_turns(trace: Any, sampled: int) -> list[tuple[str, str | None]]:
    """(state text, reply) of every turn on ``sampled``'s branch up to it: what its prompt showed."""
    path = []
    node: int | None = sampled
    while node is not None:
        path.append(node)
        node = trace.nodes[node].parent
    turns, shown = [], []
    for i in reversed(path):
        if trace.nodes[i].sampled:
            turns.append((_text(shown), _reply(trace.nodes[i].message)))
            shown = []
        else:
            shown.append(trace.nodes[i].message)
    return turns


def _text(messages: Any) -> str:
    """Messages as one text, each under its role (so a tool result and a user turn differ)."""
    return "\n".join(f"{message.role}: {_content(message)}" for message in messages)


def _reply(message: Any) -> str | None:
    """A model reply as the command our action key hashes: its text and its tool calls."""
    calls = [
        json.dumps({"name": call.name, "arguments": call.arguments}, sort_keys=True)
        for call in getattr(message, "tool_calls", None) or []
    ]
    return canonical_text("\n".join([_content(message), *calls])) or None


def _content(message: Any) -> str:
    content = message.content
    if content is None or isinstance(content, str):
        return content or ""
    return "".join(getattr(part, "text", "") or "" for part in content)
