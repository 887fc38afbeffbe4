"""Metrics sinks: a JSONL file (always), TensorBoard and Weights & Biases (when configured).

``metrics.jsonl`` has one JSON object per completed iteration with an ``iteration`` key, written
once the iteration (and its evaluation, when one is due) is done. Its training metrics are also
*staged* (``metrics.staged.json``, written durably) before the iteration's checkpoint starts, so
a kill at any moment leaves every checkpointed iteration's metrics on disk: a resume from a
checkpoint whose line is missing finishes that line from the staged metrics (the run loop does,
:func:`~hgpo_train.run.loop.run_iterations`). On resume, lines of iterations after the checkpoint
are dropped first, so each iteration is in the record exactly once.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from hgpo_train.config import LoggingConfig
from hgpo_train.run import durable

STAGED = "metrics.staged.json"
"""The last trained iteration's metrics, on disk before its checkpoint starts."""


def truncate_jsonl(path: Path, keep_through: int) -> list[int]:
    """Drop the lines of ``path`` whose ``iteration`` is above ``keep_through`` (and a line cut by
    a kill); returns the iterations kept."""
    if not path.is_file():
        return []
    kept, iterations = [], []
    for line in path.read_text().splitlines():
        try:
            iteration = json.loads(line).get("iteration", 0)
        except json.JSONDecodeError:  # a line cut by the kill
            continue
        if iteration <= keep_through:
            kept.append(line)
            iterations.append(iteration)
    durable.write_text(path, "".join(line + "\n" for line in kept))
    return iterations


class MetricsLogger:
    """Writes each iteration's metrics to every configured sink.

    ``start_iteration``: the iteration the run resumes after (0 for a fresh start); the record
    keeps what it holds up to there (:attr:`logged`), and TensorBoard drops its events from the
    first iteration to be logged again on.
    """

    def __init__(
        self,
        run_dir: str | Path,
        config: LoggingConfig,
        *,
        start_iteration: int = 0,
        run_config: dict[str, Any] | None = None,
    ) -> None:
        self.path = Path(run_dir) / "metrics.jsonl"
        self.staged_path = Path(run_dir) / STAGED
        self.logged = set(truncate_jsonl(self.path, start_iteration))
        """The iterations the record holds."""
        first_new = start_iteration + 1 if start_iteration in self.logged else start_iteration
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (open for the run, closed in close())
        self._tb = None
        self._wandb = None
        if config.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(Path(run_dir) / "tensorboard"), purge_step=first_new)
        if config.wandb_project:
            try:
                import wandb
            except ImportError as error:
                raise ImportError(
                    "logging.wandb_project is set but wandb is not installed (pip install wandb)"
                ) from error
            self._wandb = wandb.init(
                project=config.wandb_project,
                name=config.wandb_run_name,
                config=run_config,
                dir=str(run_dir),
                resume="allow",
            )

    def log(self, iteration: int, metrics: dict[str, float]) -> None:
        """Record ``metrics`` of ``iteration`` (1-based: the number of completed iterations)."""
        record = {"iteration": iteration, **{k: _plain(v) for k, v in metrics.items()}}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())
        self.logged.add(iteration)
        if self._tb is not None:
            for key, value in metrics.items():
                if isinstance(value, (int, float)) and math.isfinite(value):
                    self._tb.add_scalar(key, value, iteration)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(metrics, step=iteration)

    def stage(self, iteration: int, metrics: dict[str, float]) -> None:
        """Put ``iteration``'s metrics on disk before its checkpoint starts (:data:`STAGED`)."""
        record = {"iteration": iteration, **{k: _plain(v) for k, v in metrics.items()}}
        durable.write_text(self.staged_path, json.dumps(record))

    def staged(self, iteration: int) -> dict[str, float] | None:
        """The metrics :meth:`stage` put down for ``iteration``, None when it holds another one."""
        try:
            record = json.loads(self.staged_path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None
        return record if record.pop("iteration", None) == iteration else None

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


def _plain(value: Any) -> Any:
    """JSON-safe scalars (numpy numbers become Python numbers; NaN stays a float)."""
    return value.item() if hasattr(value, "item") else value


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl`` file, in order (a last line cut by a kill is skipped)."""
    lines = [line for line in Path(path).read_text().splitlines() if line.strip()]
    records = [json.loads(line) for line in lines[:-1]]
    try:
        records += [json.loads(line) for line in lines[-1:]]
    except json.JSONDecodeError:
        pass
    return records
