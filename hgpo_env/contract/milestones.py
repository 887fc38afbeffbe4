"""Milestones an env sees: progress the text alone does not state reliably, reported in ``info``.

Credit for groups where every rollout failed alike (MVPO, ``shared/MVPO_SPEC.md``) needs to know
how far each rollout got. Only the env knows that exactly, so an env that has milestones reports,
for every observation (reset and each step), two keys:

* ``info["progress_signature"]``: a short text naming the kind of place the observation shows
  and the episode's depth, ``PLACE|dN`` with ``N = 3 * (t // 3)`` for the observation's 0-based
  index ``t`` (the spec's depth bin), e.g. ``countertop|apple+knife|d6``;
* ``info["milestones"]``: five 0/1 flags, what this observation reports of the step that
  produced it (at reset: no reward, a valid start). The env's :attr:`~hgpo_env.textenv.core.TextEnv.milestones`
  names them, in the spec's order: three kinds of progress, success, an invalid step.

Envs without milestones report neither key.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import NamedTuple

SIGNATURE_KEY = "progress_signature"
MILESTONES_KEY = "milestones"
COUNT = 5
"""Every env reports five flags: progress, progress, progress, success, invalid."""
DEPTH_BIN = 3


class Progress(NamedTuple):
    """What an env reports of one observation: the place it shows (the signature without its
    depth) and its five milestone flags."""

    place: str
    flags: tuple[bool, bool, bool, bool, bool]


def signature(place: str, index: int) -> str:
    """``place`` with the depth bin of the episode's ``index``-th observation (0: the reset's)."""
    return f"{place}|d{DEPTH_BIN * (index // DEPTH_BIN)}"


def progress_info(progress: Progress, index: int) -> dict[str, object]:
    """The two ``info`` keys of one observation."""
    if len(progress.flags) != COUNT:
        raise ValueError(f"an env reports {COUNT} milestone flags, got {len(progress.flags)}")
    return {
        SIGNATURE_KEY: signature(progress.place, index),
        MILESTONES_KEY: tuple(int(bool(flag)) for flag in progress.flags),
    }


def check_names(names: Sequence[str]) -> tuple[str, ...]:
    """An env's milestone names, checked: five distinct names."""
    names = tuple(names)
    if len(names) != COUNT or len(set(names)) != COUNT:
        raise ValueError(f"milestones must be {COUNT} distinct names, got {names!r}")
    return names


class Vocabulary:
    """Whole words of a fixed list found in a text, in order of appearance (lower-case)."""

    def __init__(self, words: Iterable[str]) -> None:
        ordered = sorted({w.lower() for w in words}, key=len, reverse=True)  # longest first
        self._pattern = re.compile(r"\b(" + "|".join(map(re.escape, ordered)) + r")\b")

    def found(self, text: str) -> list[str]:
        """Distinct words of the list in ``text``, first appearance first."""
        return list(dict.fromkeys(self._pattern.findall(text.lower())))

    def first(self, text: str, default: str = "none") -> str:
        match = self._pattern.search(text.lower())
        return match.group(1) if match else default
