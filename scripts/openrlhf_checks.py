"""A controller that verifies a real OpenRLHF run as it trains, on GPUs or on CPU (a test harness, not the library).

``scripts/openrlhf_gpu_check.py`` (a GPU machine) and the CPU tests (``tests/openrlhf_cpu``) run
the backend with :func:`verifying_trainer`: the first iteration plays the envs and every
iteration trains on that same batch, with fixed synthetic advantages (+1 for even samples, -1 for
odd ones) so the expected effect of an update is known whatever the model. The engine–policy
gap every run logs (:mod:`~hgpo_train.openrlhf.gap`: every engine scores a few samples before
each update, compared with the DeepSpeed policy's log-probs of the same tokens) must stay small
after every sync; the sync after one update is skipped on purpose, and the gap must catch it.
The reference model's log-probs show how far the policy moved. What the run records goes to
``<run>/verify_records.json``; :func:`verdicts` turns it and ``metrics.jsonl`` into pass/fail checks.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

RECORDS = "verify_records.json"


def verifying_trainer(skip_sync_at: int | None = None) -> Any:
    """The checking controller class (imports openrlhf; call it where the backend runs).

    ``skip_sync_at``: the 1-based update after which the weight broadcast is skipped, so that
    the next comparison must fail (the negative control of the sync check).
    """
    import torch

    from hgpo_train.openrlhf.experience_maker import StepAdvantageMaker
    from hgpo_train.openrlhf.trainer import HGPOTrainer

    class RecordingMaker(StepAdvantageMaker):
        """Writes the shared advantages as usual and records them, then replaces them with fixed +/-1."""

        records: list[dict[str, Any]]

        def compute_advantages_and_returns(self, experiences: list[Any]) -> list[Any]:
            experiences = super().compute_advantages_and_returns(experiences)
            record: dict[str, Any] = {"samples": {}}
            num = den = gap = 0.0
            for exp in experiences:
                index = np.asarray(exp.index)
                mask = exp.action_mask.float()
                for k, i in enumerate(index.tolist()):
                    record["samples"][i] = {
                        "advantage": float(exp.advantages[k].sum() / max(float(mask[k].sum()), 1.0)),
                        "mask_tokens": int(mask[k].sum()),
                    }
                sign = np.where(index % 2 == 0, 1.0, -1.0)  # padding samples have no tokens in the mask
                exp.advantages = torch.from_numpy(sign).float()[:, None] * mask
                exp.returns = exp.advantages.clone()
                num += float((exp.advantages * exp.action_log_probs.float()).sum())
                den += float(mask.sum())
                if exp.base_action_log_probs is not None:
                    diff = exp.action_log_probs.float() - exp.base_action_log_probs.float()
                    gap += float((diff.abs() * mask).sum())
            record["loss"] = -num / max(den, 1.0)
            record["reference_gap"] = gap / max(den, 1.0)
            self.records.append(record)
            return experiences

    class VerifyingTrainer(HGPOTrainer):
        """Plays the envs once; every iteration trains on that batch."""

        maker_class = RecordingMaker

        def collect(self, iteration: int, abandon: Any) -> Any:
            if not hasattr(self, "fixed_batch"):
                self.fixed_batch = super().collect(iteration, abandon)
                self.experience_maker.records = []
            return self.fixed_batch

        def make_samples(self, batch: Any, advantages: Any) -> Any:
            samples, self.layout = super().make_samples(batch, advantages)
            return samples, self.layout

        def train_step(self, samples: Any, global_step: int) -> Any:
            self.skip_sync = global_step + 1 == skip_sync_at  # 0-based iteration, 1-based update
            return super().train_step(samples, global_step)

        def broadcast_to_vllm(self) -> None:
            if not getattr(self, "skip_sync", False):
                super().broadcast_to_vllm()

        def fit(self, global_step: int = 0) -> None:
            super().fit(global_step)
            batch = self.fixed_batch
            records = self.experience_maker.records
            result = {
                "skip_sync_at": skip_sync_at,
                "loss": [r["loss"] for r in records],
                "reference_gap": [r["reference_gap"] for r in records],
                "samples": records[0]["samples"],
                "source": self.layout.source.tolist(),
                "padding": self.layout.padding.tolist(),
                "batch": {
                    "reward": batch.reward.tolist(),
                    "traj_id": batch.traj_id.tolist(),
                    "group_id": batch.group_id.tolist(),
                    "step": batch.step.tolist(),
                    "invalid": batch.invalid.tolist(),
                    "summary_turn": batch.summary_turn.tolist() if batch.summary_turn is not None else None,
                    "fingerprints": [[str(int(x)) for x in row] for row in batch.fingerprints],
                },
            }
            (self.run_dir / RECORDS).write_text(json.dumps(result))

    return VerifyingTrainer


def logprob_mismatch(run_dir: Path) -> list[float]:
    """The logged engine–policy gap (the worst engine's mean per token) before each update."""
    from hgpo_train.run.tracking import read_metrics

    return [r["engine_gap/mean"] for r in read_metrics(run_dir / "metrics.jsonl") if "engine_gap/mean" in r]


def verdicts(run_dir: Path, tolerance: float, min_drift: float) -> tuple[dict[str, Any], bool]:
    """The checks of a verifying run, from what it wrote.

    Gap ``j`` is measured before update ``j + 1`` (0-based ``j``), after update ``j``'s sync; with
    a skipped sync, that gap must exceed ``tolerance`` and the others stay below it. The policy
    must move (its log-probs drift from the reference's by more than ``min_drift``), so small gaps
    mean the engines followed it.
    """
    rec = json.loads((run_dir / RECORDS).read_text())
    loss, mismatch, moved = rec["loss"], logprob_mismatch(run_dir), rec["reference_gap"]
    skipped = rec["skip_sync_at"]
    synced = [m for j, m in enumerate(mismatch) if j != skipped]
    checks = {
        "loss_decreases_on_fixed_batch": {"ok": loss[-1] < loss[0], "loss": loss},
        "weights_reach_every_engine": {
            "ok": len(mismatch) == len(loss) and max(synced) < tolerance and moved[-1] > min_drift,
            "engine_vs_policy_logprob_gap": mismatch,
            "policy_moved_from_reference": moved[-1],
            "tolerance": tolerance,
        },
        "run_folder_complete": {
            "ok": (run_dir / "metrics.jsonl").is_file()
            and any((run_dir / "checkpoints" / "openrlhf" / "_actor").glob("global_step*"))
            and (run_dir / "final_model" / "config.json").is_file(),
        },
    }
    if skipped is not None:
        checks["skipped_sync_detected"] = {"ok": mismatch[skipped] > tolerance, "at": skipped}
    return checks, all(c["ok"] for c in checks.values())
