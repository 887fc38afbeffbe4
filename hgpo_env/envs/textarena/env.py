"""HGPO-TextArena-v0: a single-player TextArena game, free-form.

TextArena's step is ``done, info = env.step(text)`` with the messages read from
``get_observation()`` and the rewards from the state once done; this preset maps that onto the
contract. The game's rules (its opening prompt) are the task; what the prompt shows is the game's
new messages, without the echo of the player's own move; ``state_text`` is the latest board where
the game draws one, else those messages. The game's own verdict marks invalid moves (TextArena
allows one retry, then ends the game). A task id is the game's seed; TextArena seeds the global
``random``, which the adapter keeps private to each env; the game is built inside that private
stream too, since some games bind ``random.random`` when built (Secretary), and would otherwise
draw from the unseeded global stream and differ between processes.

Games that need the network at import or reset (Wordle fetches nltk data) do not run offline.
"""

from __future__ import annotations

import json
from typing import Any, Literal

import textarena
from textarena import ObservationType

from hgpo_env.textenv.adapter import Raw, StepResult, TextAdapter, TextEnvSpec, split_task_ids
from hgpo_env.textenv.rng import IsolatedRNG

HELD_OUT_TASKS = 10_000
_NOT_SHOWN = (ObservationType.PROMPT, ObservationType.PLAYER_ACTION)


def _messages(observation: list[tuple[int, str, ObservationType]], *kinds: ObservationType) -> list[str]:
    return [text.strip() for _, text, kind in observation if kind in kinds]


def _start(env: Any, task_id: int) -> tuple[Any, dict[str, Any]]:
    try:
        env.reset(num_players=1, seed=task_id)
    except AssertionError as error:  # how TextArena's multi-player states refuse one player
        raise ValueError(f"{env.env_id} is not a single-player TextArena game: {error}") from None
    return env.get_observation()[1], {}


def _step(env: Any, action: str) -> StepResult:
    done, info = env.step(action=action)
    observation = env.get_observation()[1]
    reward = float(env.state.rewards[0]) if done and env.state.rewards else 0.0
    return observation, reward, bool(done), False, dict(info or {})


def _shown(raw: Raw) -> str:
    kinds = [kind for kind in ObservationType if kind not in _NOT_SHOWN]
    return "\n".join(_messages(raw.observation, *kinds)) or "(no new message)"


def _state(raw: Raw) -> str:
    boards = _messages(raw.observation, ObservationType.GAME_BOARD)
    return boards[-1] if boards else _shown(raw)


def _plain(value: Any) -> Any:
    """JSON for what a game state holds beyond JSON: sets sorted, objects by their fields."""
    if isinstance(value, (set, frozenset)):
        return sorted(map(repr, value))
    if hasattr(value, "__dict__"):
        return vars(value)
    slots = getattr(type(value), "__slots__", None)
    return {name: getattr(value, name, None) for name in slots} if slots else repr(value)


def _accepted(raw: Raw) -> bool:
    state = raw.env.state
    return state.error_count == 0 and not state.game_info[0].get("invalid_move", False)


def _won(raw: Raw) -> bool:
    rewards = raw.env.state.rewards
    return bool(raw.env.state.done and rewards and rewards[0] >= 1)


SPEC = TextEnvSpec(
    family="textarena",
    intro="You are playing a single-player text game. Follow its rules and win.",
    task=lambda raw: "\n".join(_messages(raw.observation, ObservationType.PROMPT)),
    observation=_shown,
    state_text=_state,
    accepted=_accepted,
    won=_won,
    score=lambda raw: float(raw.env.state.rewards[0]) if raw.env.state.rewards else 0.0,
    start=_start,
    step=_step,
    close=lambda env: None,  # TextArena's close() returns the final rewards; nothing to release
)


class TextArenaEnv(TextAdapter):
    """``game``: a single-player TextArena id (``TowerOfHanoi-v0``, ``GuessTheNumber-v0``, ...);
    its raw variant is played, without TextArena's prompt wrappers (the memory wrapper writes the
    prompt)."""

    def __init__(
        self,
        game: str = "TowerOfHanoi-v0",
        *,
        split: Literal["train", "eval"] = "train",
        max_steps: int = 30,
        **options: Any,
    ) -> None:
        raw_id = game if game.endswith("-raw") else f"{game}-raw"
        if raw_id not in textarena.envs.registration.ENV_REGISTRY:
            raise ValueError(f"game {game!r} is not a registered TextArena id")
        rng = IsolatedRNG() if options.get("isolate_rng", True) else None
        game = textarena.make(raw_id) if rng is None else rng.call(textarena.make, raw_id)
        super().__init__(
            game, SPEC, max_steps=max_steps, task_ids=split_task_ids(split, HELD_OUT_TASKS), **options
        )
        self._rng = rng  # the stream the game was built in, seeded by every reset

    def task_identity(self) -> str:
        """The game, its seed (TextArena draws what is still hidden from the seeded global stream)
        and its state after the reset."""
        state = json.dumps(self.env.state.game_state, default=_plain)
        return f"{self.env.env_id} seed {self.task_id} {state}"
