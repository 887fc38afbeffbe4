"""Checkpoints that survive a kill: written to a temporary folder, then renamed into place.

A checkpoint folder ``checkpoints/iter_000010`` holds the model (full weights, or only the LoRA
adapters), the optimizer state, the RNG states, the iteration count and the resolved config.
Only complete checkpoints ever carry the ``iter_`` name, so the latest one is always loadable;
what a kill leaves behind (a ``.tmp-*`` folder, one checkpoint over ``keep``) is swept away by
:func:`tidy_checkpoints` when the run starts again.
"""

from __future__ import annotations

import errno
import json
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

PREFIX = "iter_"
TMP_PREFIX = ".tmp-"
LOW_SPACE = 1 << 20
"""Free bytes under which a failed write is put down to a full disk (torch does not say so)."""


class CheckpointError(OSError):
    """A checkpoint could not be written; the previous one is untouched."""


def checkpoint_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def save_checkpoint(
    run_dir: str | Path,
    iteration: int,
    model: Any,
    optimizer: torch.optim.Optimizer,
    config_yaml: str,
    keep: int,
) -> Path:
    """Save after ``iteration`` completed iterations; keep the ``keep`` newest checkpoints."""
    root = checkpoint_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{PREFIX}{iteration:06d}"
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=TMP_PREFIX))
    try:
        model.save_pretrained(tmp / "model")
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        torch.save(
            {
                "python": random.getstate(),
                "numpy": np.random.get_state(),
                "torch": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
            },
            tmp / "rng.pt",
        )
        (tmp / "config.yaml").write_text(config_yaml)
        (tmp / "state.json").write_text(json.dumps({"iteration": iteration}))
        if final.exists():  # a re-run of the same iteration after a resume replaces it
            shutil.rmtree(final)
        tmp.replace(final)
    except (OSError, RuntimeError) as error:
        full = _disk_full(error, root)
        shutil.rmtree(tmp, ignore_errors=True)
        if not full:
            raise
        last = latest_checkpoint(run_dir)
        kept = f"the last good checkpoint, {last.name}, is kept" if last else "there is no earlier checkpoint"
        raise CheckpointError(
            errno.ENOSPC, f"no space left on device writing checkpoint {final.name} in {root}; {kept}"
        ) from error
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    tidy_checkpoints(run_dir, keep)
    return final


def _disk_full(error: BaseException, folder: Path) -> bool:
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    try:  # torch reports a short write as "unexpected pos"; the free space tells why
        return shutil.disk_usage(folder).free < LOW_SPACE
    except OSError:
        return False


def clear_run_folder(run_dir: str | Path, items: tuple[str, ...]) -> None:
    """Remove the named files and folders a run wrote into ``run_dir`` (and nothing else there)."""
    for name in items:
        path = Path(run_dir) / name
        shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)


def tidy_checkpoints(run_dir: str | Path, keep: int) -> list[Path]:
    """Remove what a killed save left behind (temporary folders, checkpoints over ``keep``);
    returns what was removed."""
    root = checkpoint_dir(run_dir)
    if not root.is_dir():
        return []
    removed = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(TMP_PREFIX)]
    removed += list_checkpoints(run_dir)[:-keep]
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
    return removed


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    root = checkpoint_dir(run_dir)
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX))


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def checkpoint_iteration(path: Path) -> int:
    return int(json.loads((path / "state.json").read_text())["iteration"])


def load_training_state(path: Path, optimizer: torch.optim.Optimizer) -> int:
    """Restore the optimizer and RNG states; returns the number of completed iterations."""
    optimizer.load_state_dict(torch.load(path / "optimizer.pt", map_location="cpu", weights_only=True))
    rng = torch.load(path / "rng.pt", weights_only=False)
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    torch.set_rng_state(rng["torch"])
    if rng["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
    return checkpoint_iteration(path)
