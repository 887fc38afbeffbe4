"""One episode per env of a pool, as the trainers record it: its steps, keys and outcome.

:class:`EpisodeRecorder` turns the pool's results into :class:`Episode` objects the same way
whichever loop plays them (lockstep turns, :func:`hgpo_train.rollout.collect.play_episodes`, or
per-episode agent loops, :func:`hgpo_train.rollout.agent_loop.play_agent_loops`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, NamedTuple, Protocol, TypeVar

from hgpo_env.contract.milestones import MILESTONES_KEY, SIGNATURE_KEY
from hgpo_env.prompting.memory import SUMMARY_TURN
from hgpo_env.vector import ResetResult, StepResult

if TYPE_CHECKING:
    from hgpo_train.rollout.constrained import Choices

R = TypeVar("R")
"""What a response is: any object with a ``text`` attribute (the env's action)."""


class EnvPool(Protocol):
    """What the rollout loops use of a :class:`~hgpo_env.vector.GroupedEnvPool`."""

    def reset(
        self, *, seeds: Sequence[int] | None = None, task_ids: Sequence[int] | None = None
    ) -> list[ResetResult]: ...

    def step(self, actions: Mapping[int, str]) -> list[StepResult]: ...


@dataclass(frozen=True)
class ChatPrompt:
    """A chat prompt (``prompt_format="chat"``) with what renders it: the env's messages, its
    tools' schemas and the template settings it pins (``info["tools"]``,
    ``info["chat_template_kwargs"]``). Rendered once, when its step is sampled."""

    messages: tuple[Mapping[str, Any], ...]
    tools: tuple[Mapping[str, Any], ...] = ()
    template_kwargs: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, observation: str | Sequence[Mapping[str, Any]], info: Mapping[str, Any]) -> str | ChatPrompt:
        """The prompt of an env's observation: its text, or its messages and their rendering."""
        if isinstance(observation, str):
            return observation
        return cls(
            tuple(observation), tuple(info.get("tools") or ()), dict(info.get("chat_template_kwargs") or {})
        )


Prompt = str | ChatPrompt
"""What a policy is asked: a text prompt (wrapped as one user message) or a chat prompt."""


OUTCOMES = ("won", "lost", "truncated", "env_error")
"""How a rollout ends: its task solved; ended by the env without a win; cut by the step limit (or
the env's own); cut by a failure of the env or its worker."""


class Progress(NamedTuple):
    """One step's progress signatures and milestone flags, before and after it."""

    signature: str
    milestones: tuple[int, ...]
    next_signature: str
    next_milestones: tuple[int, ...]

    @classmethod
    def of(cls, before: dict[str, Any], after: dict[str, Any]) -> Progress | None:
        """From the infos of the step's prompt and its result; None without milestones."""
        if SIGNATURE_KEY not in before:
            return None
        after = after if SIGNATURE_KEY in after else before
        return cls(
            before[SIGNATURE_KEY],
            tuple(before[MILESTONES_KEY]),
            after[SIGNATURE_KEY],
            tuple(after[MILESTONES_KEY]),
        )


@dataclass
class EpisodeStep(Generic[R]):
    """One step of an episode: the prompt the env wrote, its fingerprints, the response, the outcome."""

    prompt: Prompt
    fingerprints: tuple[int, ...]
    """The fingerprints that came with ``prompt`` (level 0..K)."""
    response: R
    reward: float
    invalid: bool
    """The response was not a valid admissible action (an env failure is not counted as invalid)."""
    next_state: int = 0
    """Level 0 of the fingerprints the step returned: the key of the state it led to (the terminal
    observation's on a last step; 0 where the env failed)."""
    action_key: int = 0
    """The key of the command the step executed (``info["action_key"]``; 0 where the env failed)."""
    progress: Progress | None = None
    """The milestones of the observation the step acted on and of the one it returned (the first
    again where the env failed); None where the env reports none (:mod:`hgpo_env.contract.milestones`)."""
    summary_turn: bool = False
    """The prompt asked for a summary, not a command (``memory="compaction"``'s summary turn)."""
    window_prompt: Prompt | None = None
    """The prompt a window of K would have shown instead (``info["window_prompt"]``: action turns
    under the memory kinds other than the window), None where the env gives none."""


@dataclass
class Episode(Generic[R]):
    """One env's episode: which group and member played it, its steps and how it ended."""

    group: int
    member: int
    task: str
    task_type: str | None
    task_key: int = 0
    """The task's key from its reset (``info["task_key"]``)."""
    steps: list[EpisodeStep[R]] = field(default_factory=list)
    won: bool = False
    score: float = 0.0
    truncated: bool = False
    env_error: bool = False

    @property
    def outcome(self) -> str:
        """How it ended, one of :data:`OUTCOMES`."""
        if self.env_error:
            return "env_error"
        if self.won:
            return "won"
        return "truncated" if self.truncated else "lost"


class EpisodeRecorder(Generic[R]):
    """The episodes of one pool reset, step by step: the prompt each env shows now and what each
    step did. ``prompts[i]`` / ``infos[i]`` are env ``i``'s current prompt and its info."""

    def __init__(self, resets: Sequence[ResetResult]) -> None:
        self.prompts = {r.env_index: ChatPrompt.of(r.obs, r.info) for r in resets}
        self.infos = {r.env_index: r.info for r in resets}
        self.groups = {r.env_index: r.group for r in resets}
        self._episodes = {
            r.env_index: Episode(
                r.group, r.member, r.info["task"], r.info.get("task_type"), int(r.info.get("task_key", 0))
            )
            for r in resets
        }

    def record(self, response: R, result: StepResult) -> bool:
        """Add the step ``response`` made to its env's episode; True when the episode is over."""
        i = result.env_index
        episode, info = self._episodes[i], self.infos[i]
        failed = "env_error" in result.info
        episode.steps.append(
            EpisodeStep(
                self.prompts[i],
                tuple(info["fingerprints"]),
                response,
                float(result.reward),
                not failed and not result.info.get("action_valid", False),
                int(result.info["fingerprints"][0]) if "fingerprints" in result.info else 0,
                int(result.info.get("action_key", 0)),
                Progress.of(info, result.info),
                info.get("turn") == SUMMARY_TURN,
                ChatPrompt.of(info["window_prompt"], info) if "window_prompt" in info else None,
            )
        )
        self.prompts[i], self.infos[i] = ChatPrompt.of(result.obs, result.info), result.info
        if result.done:
            episode.won = bool(result.info.get("won", False))
            episode.score = float(result.info.get("score", 0.0))
            episode.truncated = result.truncated
            episode.env_error = failed
        return result.done

    def episodes(self) -> list[Episode[R]]:
        """Every episode, in env order (group by group)."""
        return [self._episodes[i] for i in sorted(self._episodes)]


@dataclass
class Generation:
    """One sampled response: ids of the templated prompt and of the response (end token included)."""

    prompt_ids: list[int]
    response_ids: list[int]
    text: str
    choices: Choices | None = None
    """The choices the response was constrained to, or None when unconstrained."""
    logprobs: list[float] | None = None
    """The sampler's log-prob of each response token (NaN for a token it gave none for), when
    asked for (``update.off_policy_correction``)."""


class Generator(Protocol):
    def generate(
        self,
        prompts: Sequence[Prompt],
        admissible: Sequence[Sequence[str]] | None = None,
        temperature: float | None = None,
    ) -> list[Generation]: ...
