"""HGPO-Corridor-v0: a sign in the hall names the key that opens the vault at the far end of a
corridor, and nothing on the way shows it again: an env where a window of the last K steps forgets.

The hall shows the sign and two keys; the agent takes one and walks ``length`` corridor rooms
east, whose descriptions never mention keys, to the vault. There ``use red key`` and ``use blue
key`` are offered whatever it carries: the key the sign named, carried, opens the vault (the
win); any other use sounds the alarm and ends the episode. The decisive fact (which key is right,
and which one the agent took) is shown in the hall, ``length`` + 1 steps before the vault: with
``length`` >= 2K a window of K steps no longer shows it there, while a summary or notes that
state it do. The agent's choice of key makes rollouts of one task differ in what they must
remember, so ``python -m hgpo_env audit`` finds the window's keys aliasing at the vault.

With ``keys_in_hand`` the agent holds both keys from the start and the hall offers only the way
east: the vault's choice is then the episode's only one, and only the sign's fact makes it. A
policy that forgets the sign then wins half the time at best, whatever it does; without
``keys_in_hand``, "take the red key, use the red key" wins the same half with no memory at all.
"""

from __future__ import annotations

from hgpo_env.textenv.core import TextEnv, Transition

KEYS = ("red", "blue")
HALL, LOST = 0, -1


class CorridorEnv(TextEnv):
    """Task ``i`` names key ``KEYS[i]`` on the sign; ``length`` corridor rooms lie between hall and vault."""

    env_family = "corridor"
    prompt_intro = (
        "You are in a building with a hall, a long corridor and a vault at its east end. You can "
        "take and drop keys, walk east and west, and use a key on the vault door. What you carry "
        "is not shown in room descriptions."
    )

    def __init__(
        self,
        *,
        length: int = 4,
        max_steps: int = 20,
        success_reward: float = 10.0,
        keys_in_hand: bool = False,
        render_mode: str | None = None,
        protocol: str = "strict",
    ) -> None:
        super().__init__(
            max_steps=max_steps, success_reward=success_reward, render_mode=render_mode, protocol=protocol
        )
        if length < 1:
            raise ValueError(f"length must be at least 1, got {length}")
        self.length = length
        self.keys_in_hand = keys_in_hand
        self.position = HALL
        self.carried: tuple[str, ...] = ()
        self.right_key = KEYS[0]
        self.opened = False

    @property
    def num_tasks(self) -> int:
        return len(KEYS)

    def _start_task(self, task_id: int) -> str:
        self.right_key = KEYS[task_id]
        self.position, self.opened = HALL, False
        self.carried = KEYS if self.keys_in_hand else ()
        return self._describe()

    @property
    def task(self) -> str:
        return "open the vault at the east end of the corridor."

    @property
    def won(self) -> bool:
        return self.opened

    @property
    def done(self) -> bool:
        return self.opened or self.position == LOST

    def task_identity(self) -> str:
        held = ", both keys in hand" if self.keys_in_hand else ""
        return f"corridor of {self.length}{held}, vault opened by the {self.right_key} key"

    @property
    def _vault(self) -> int:
        return self.length + 1

    def _describe(self) -> str:
        if self.position == HALL:
            keys = [f"{key} key" for key in KEYS if key not in self.carried]
            return (
                f"You are in the hall. A sign on the wall reads: the vault opens with the {self.right_key} "
                f"key. You see: {', '.join(keys) or 'nothing to take'}. Exits: east."
            )
        if self.position == self._vault:
            return "You are at the vault door. Exits: west."
        return "You are in the corridor. Exits: east, west."

    @property
    def admissible_actions(self) -> list[str]:
        if self.position == HALL:
            if self.keys_in_hand:
                return ["go east"]
            if not self.carried:
                return [f"take {key} key" for key in KEYS] + ["go east"]
            return [f"drop {key} key" for key in self.carried] + ["go east"]
        if self.position == self._vault:
            return [f"use {key} key" for key in KEYS] + ["go west"]
        return ["go east", "go west"]

    def _apply(self, command: str) -> str | Transition:
        verb, _, argument = command.partition(" ")
        if verb == "go":
            self.position += 1 if argument == "east" else -1
            return f"You walk {argument}. {self._describe()}"
        key = argument.removesuffix(" key")
        if verb == "take":
            self.carried = (key,)
            return f"You take the {key} key. {self._describe()}"
        if verb == "drop":
            self.carried = ()
            return f"You drop the {key} key. {self._describe()}"
        if key in self.carried and key == self.right_key:  # use
            self.opened = True
            return "The key turns and the vault door opens."
        self.position = LOST
        return f"The {key} key does not open the vault. The alarm sounds and the corridor is sealed."

    def expert_action(self) -> str:
        """Take the key the sign names, walk to the vault and use it."""
        if self.position == HALL and self.right_key not in self.carried:
            return f"take {self.right_key} key" if not self.carried else f"drop {self.carried[0]} key"
        if self.position == self._vault:
            return f"use {self.right_key} key"
        return "go east"
