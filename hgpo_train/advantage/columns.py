"""Reading a batch's raw columns: numpy arrays, torch tensors or lists in, checked numpy out.

Every public function of the package takes its columns through these, so a wrong shape, a NaN
or an unknown mode is one clear error naming the column, whatever the estimator.
"""

from __future__ import annotations

import math
import sys
from typing import Any, Literal

import numpy as np

Mode = Literal["mean_norm", "mean_std_norm"]
MODES: tuple[str, ...] = ("mean_norm", "mean_std_norm")


def to_numpy(x: Any) -> np.ndarray:
    """numpy array of ``x``; a torch tensor is converted without this module importing torch."""
    torch = sys.modules.get("torch")  # if torch was never imported, x cannot be a tensor
    if torch is not None and isinstance(x, torch.Tensor):
        t = x.detach().cpu()
        return (t.double() if t.is_floating_point() else t).numpy()
    return np.asarray(x)


def check_rows(a: np.ndarray, name: str, n: int | None) -> None:
    if n is not None and len(a) != n:
        raise ValueError(f"{name} has {len(a)} rows, expected {n}")


def float_column(x: Any, name: str, n: int | None = None) -> np.ndarray:
    """1-D finite float64 column."""
    a = to_numpy(x)
    if a.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {a.shape}")
    if a.dtype.kind not in "biuf":
        raise ValueError(f"{name} must be numeric, got dtype {a.dtype}")
    a = a.astype(np.float64, copy=False)
    if not np.isfinite(a).all():
        raise ValueError(f"{name} contains NaN or inf")
    check_rows(a, name, n)
    return a


def id_codes(ids: Any, name: str, n: int | None = None) -> np.ndarray:
    """Dense int64 codes 0..m-1 of 1-D ids (ints or strings): equal ids get equal codes. Ids that
    are dense codes already come back as they are (not copied)."""
    a = to_numpy(ids)
    if a.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {a.shape}")
    if a.dtype.kind not in "iuUSO" and a.size:  # an empty list comes as float64
        raise ValueError(f"{name} must hold integers or strings, got dtype {a.dtype}")
    check_rows(a, name, n)
    if a.dtype.kind in "iu" and a.size and 0 <= a.min() and a.max() <= 4 * a.size:
        a = a.astype(np.int64, copy=False)  # small non-negative ints: dense codes in O(n), no sort
        present = np.bincount(a) > 0
        return a if present.all() else (np.cumsum(present) - 1)[a]  # dense already: as they are
    try:
        return np.unique(a, return_inverse=True)[1].astype(np.int64, copy=False)
    except TypeError as err:  # object array of mutually unorderable values
        raise ValueError(f"{name} mixes id types that cannot be compared: {err}") from err


def real_setting(value: Any, name: str, low: float = -math.inf, high: float = math.inf) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{name} must be a real number, got {value!r}") from err
    if not (math.isfinite(v) and low <= v <= high):
        raise ValueError(f"{name} must be finite and in [{low}, {high}], got {value!r}")
    return v


def check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; expected one of {MODES}")


def as_fingerprints(fingerprints: Any, n: int | None = None) -> np.ndarray:
    """Fingerprints as a uint64 array of shape (n, K+1); 0 means the level is missing.

    Accepts a 2-D array or tensor, a list of per-row tuples (``info["fingerprints"]``), or a 1-D
    column (level 0 only). Signed 64-bit integers are reinterpreted bit for bit, because torch
    and some storage formats keep 64-bit hashes as int64.
    """
    if isinstance(fingerprints, (list, tuple)):
        try:
            a = np.array(fingerprints, dtype=np.uint64)
        except (OverflowError, TypeError, ValueError) as err:
            raise ValueError(f"fingerprints must be rows of equally many ints in [0, 2**64): {err}") from err
        if not _all_integers(fingerprints):  # numpy casts 1.7 to 1 without a word
            raise ValueError("fingerprints must be ints, got a non-integer value (a float?)")
    else:
        a = to_numpy(fingerprints)
        if a.dtype.kind == "i":
            a = a.astype(np.int64, copy=False).view(np.uint64)
        elif a.dtype.kind == "u":
            a = a.astype(np.uint64, copy=False)
        else:
            raise ValueError(f"fingerprints must be integers, got dtype {a.dtype}")
    if a.ndim == 1:
        a = a.reshape(-1, 1)
    if a.ndim != 2 or a.shape[1] == 0:
        raise ValueError(f"fingerprints must have shape (n, K+1) with K >= 0, got {a.shape}")
    check_rows(a, "fingerprints", n)
    return a


def level0(fingerprints: Any, n: int | None = None) -> np.ndarray:
    """Level 0 of :func:`as_fingerprints` (the state key) as a contiguous column: sorting and
    gathering a strided view of the (n, K+1) array is ~30 % slower at scale."""
    return np.ascontiguousarray(as_fingerprints(fingerprints, n)[:, 0])


def _all_integers(values: list | tuple) -> bool:
    """Whether a list of ints, or of rows of ints (lists, tuples, arrays), holds only integers."""
    for value in values:
        if isinstance(value, (list, tuple)):
            if not all(map(_is_integer, value)):
                return False
        elif not _is_integer(value):
            return False
    return True


def _is_integer(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    return isinstance(value, (int, np.integer)) or to_numpy(value).dtype.kind in "iu"


def invalid_penalties(invalid: Any, invalid_penalty: float, n: int) -> np.ndarray:
    """Per-row invalid-action penalty ``invalid_penalty * invalid`` (zeros when invalid is None)."""
    coef = real_setting(invalid_penalty, "invalid_penalty", 0.0)
    if invalid is None:
        return np.zeros(n)
    flags = float_column(invalid, "invalid", n)
    if not np.isin(flags, (0.0, 1.0)).all():
        raise ValueError("invalid must hold only 0/1 (or booleans)")
    return coef * flags
