"""Checkpoints that survive a kill: written to a temporary folder, then renamed into place.

A checkpoint folder ``checkpoints/iter_000010`` holds the model (full weights, or only the LoRA
adapters), the optimizer state, the RNG states, the iteration count, what the advantage estimator
carries across iterations (MVPO's weights and success EMA) and the resolved config.
Only complete checkpoints ever carry the ``iter_`` name, so the latest one is always loadable;
what a kill leaves behind (a ``.tmp-*`` folder, one checkpoint over ``keep``) is swept away by
:func:`tidy_checkpoints` when the run starts again. Every iteration is checkpointed (so a kill
loses at most the iteration in progress), on a thread while the next rollout runs
(:class:`BackgroundSave`); :func:`kept_iterations` says which of them stay.
"""

from __future__ import annotations

import errno
import json
import random
import shutil
import tempfile
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hgpo_train.run import durable
from hgpo_train.run.tracking import STAGED

PREFIX = "iter_"
TMP_PREFIX = ".tmp-"
LOW_SPACE = 1 << 20
"""Free bytes under which a failed write is put down to a full disk (torch does not say so)."""


class CheckpointError(OSError):
    """A checkpoint could not be written; the previous one is untouched."""


def checkpoint_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def kept_iterations(saved: Iterable[int], keep: int, save_every: int) -> set[int]:
    """The checkpoints to keep of those ``saved``: the newest ``keep`` at multiples of
    ``save_every`` (``train.save_every``/``keep_checkpoints``), and the newest of all."""
    ordered = sorted(saved)
    milestones = [i for i in ordered if save_every and i % save_every == 0]
    return set(milestones[-keep:]) | set(ordered[-1:])


def rng_states() -> dict[str, Any]:
    """Every generator's state, as a checkpoint restores it."""
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }


def save_checkpoint(
    run_dir: str | Path,
    iteration: int,
    model: Any,
    optimizer: torch.optim.Optimizer,
    config_yaml: str,
    keep: int,
    save_every: int,
    rng: dict[str, Any] | None = None,
    advantage_state: dict[str, Any] | None = None,
) -> Path:
    """Save after ``iteration`` completed iterations (``rng``: the generators' states then, default
    now; ``advantage_state``: what the estimator carries to the next iteration); keep what
    :func:`kept_iterations` says."""
    root = checkpoint_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{PREFIX}{iteration:06d}"
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=TMP_PREFIX))
    try:
        model.save_pretrained(tmp / "model")
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        torch.save(rng if rng is not None else rng_states(), tmp / "rng.pt")
        (tmp / "config.yaml").write_text(config_yaml)
        state = {"iteration": iteration, "advantage_state": advantage_state}
        (tmp / "state.json").write_text(json.dumps(state))
        durable.sync_tree(tmp)  # the files on disk before the name that says they are complete
        if final.exists():  # a re-run of the same iteration after a resume replaces it
            discard(final)
        tmp.replace(final)
        durable.sync_folder(root)
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
    tidy_checkpoints(run_dir, keep, save_every)
    return final


class BackgroundSave:
    """One checkpoint at a time written on a thread, while the caller goes on with work that leaves
    the weights and optimizer state alone (sampling the next rollout, evaluating);
    :meth:`wait` before changing them. A failed save raises in :meth:`wait`."""

    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint")
        self._pending: Future[Path] | None = None

    def start(self, save: Callable[[], Path]) -> None:
        self.wait()
        self._pending = self._executor.submit(save)

    def wait(self) -> Path | None:
        """The path of the save in progress once it is written, None when there was none."""
        pending, self._pending = self._pending, None
        return pending.result() if pending is not None else None

    def close(self) -> None:
        """Finish the save in progress (a stopped run keeps it), then end the thread."""
        try:
            self.wait()
        finally:
            self._executor.shutdown()


def _disk_full(error: BaseException, folder: Path) -> bool:
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    try:  # torch reports a short write as "unexpected pos"; the free space tells why
        return shutil.disk_usage(folder).free < LOW_SPACE
    except OSError:
        return False


RUN_FOLDER_ITEMS = (
    "checkpoints",
    "config.yaml",
    "driver.log",
    "evals",
    "final_model",
    "final_model.partial",
    "metrics.jsonl",
    STAGED,
    "openrlhf.yaml",
    "run_info.jsonl",
    "tensorboard",
    "tiny_model",
)
"""What a run of either backend writes into its folder: all that ``--overwrite`` removes."""


def clear_run_folder(run_dir: str | Path) -> None:
    """Remove the files and folders a run wrote into ``run_dir`` (:data:`RUN_FOLDER_ITEMS`, and
    nothing else there)."""
    for name in RUN_FOLDER_ITEMS:
        path = Path(run_dir) / name
        shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
        durable.temporary_name(path).unlink(missing_ok=True)  # a kill during its write left it


def tidy_checkpoints(run_dir: str | Path, keep: int, save_every: int) -> list[Path]:
    """Remove what a killed save left behind (temporary folders) and the checkpoints
    :func:`kept_iterations` does not keep; returns what was removed."""
    root = checkpoint_dir(run_dir)
    if not root.is_dir():
        return []
    removed = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(TMP_PREFIX)]
    saved = {checkpoint_number(p): p for p in list_checkpoints(run_dir)}
    kept = kept_iterations(saved, keep, save_every)
    removed += [p for i, p in saved.items() if i not in kept]
    for path in removed:
        discard(path)
    return removed


def discard(folder: Path) -> None:
    """Remove a checkpoint folder, first renaming it out of the ``iter_`` names: a kill during the
    removal must not leave a half-removed folder under a name that says it is complete."""
    doomed = folder if folder.name.startswith(TMP_PREFIX) else folder.with_name(TMP_PREFIX + folder.name)
    if doomed != folder:
        shutil.rmtree(doomed, ignore_errors=True)  # what an earlier removal's kill left
        folder.replace(doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    root = checkpoint_dir(run_dir)
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX))


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def checkpoint_number(path: Path) -> int:
    """The iteration in a checkpoint folder's name (``iter_000010`` -> 10)."""
    return int(path.name.removeprefix(PREFIX))


def checkpoint_iteration(path: Path) -> int:
    return int(json.loads((path / "state.json").read_text())["iteration"])


def checkpoint_advantage_state(path: Path) -> dict[str, Any] | None:
    """What the estimator carried into the iteration after the checkpoint (None: nothing, or a
    checkpoint from before estimators carried state)."""
    return json.loads((path / "state.json").read_text()).get("advantage_state")


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
