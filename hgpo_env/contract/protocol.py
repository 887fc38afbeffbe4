"""Environment protocols: how a model response becomes a game command and when a step is valid.

``"strict"`` (default): :func:`~hgpo_env.prompting.actions.parse_response`'s rules; the env rejects a
command outside its admissible list without touching the game, and such a step is invalid.

``"verl-agent"``: the rules of the ALFWorld and WebShop environments the GiGPO and HGPO papers
trained and evaluated on (verl-agent's ``projection.py`` and env managers):

* The response is lower-cased; the command is the stripped text between the first ``<action>``
  and the first ``</action>``.
* Without both action tags, the last :data:`FALLBACK_CHARS` characters of the lower-cased
  response (30 in ALFWorld, 20 in WebShop) are sent as the command, and the step is invalid.
* Otherwise the step is valid only when ``<think>`` and ``</think>`` both occur in the response
  as written (case-sensitive) and it has no character in U+4E00-U+9FFF; the command is sent
  either way.
* Admissibility is not checked: the game answers any command itself (ALFWorld: "Nothing
  happens."; WebShop: nothing changes), and validity is the response's alone.

Beyond the papers' rules, what is sent (and so shown in later prompts) is kept encodable and
bounded: lone surrogates become replacement characters (U+FFFD) and the command is cut at :data:`MAX_SENT_CHARS`
characters, so no prompt breaks a tokenizer or grows with a runaway response.
"""

from __future__ import annotations

PROTOCOLS = ("strict", "verl-agent")
FALLBACK_CHARS = {"alfworld": 30, "webshop": 20}
"""Characters of a tag-less response sent as the command, per env family (verl-agent's values)."""
MAX_SENT_CHARS = 512
"""Longest command sent under the verl-agent rules (theirs is unbounded)."""


def check_protocol(protocol: str, env_family: str) -> None:
    """Raise a clear error for an unknown protocol or one the env family does not define."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol must be one of {PROTOCOLS}, got {protocol!r}")
    if protocol == "verl-agent" and env_family not in FALLBACK_CHARS:
        raise ValueError(
            f"protocol='verl-agent' is defined for {tuple(FALLBACK_CHARS)} (the papers' envs), not {env_family!r}"
        )
