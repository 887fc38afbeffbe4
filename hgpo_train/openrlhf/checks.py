"""A controller that verifies a real OpenRLHF run as it trains, on GPUs or on CPU.

``scripts/openrlhf_gpu_check.py`` (a GPU machine) and the CPU tests (``tests/openrlhf_cpu``) run
the backend with :func:`verifying_trainer`: the first iteration plays the envs and every
iteration trains on that same batch, with fixed synthetic advantages (+1 for even samples, -1 for
odd ones) so the expected effect of an update is known whatever the model. Before each
iteration the first engine scores the batch's first :data:`PROBES` samples (prompt log-probs);
experience making then gives the DeepSpeed policy's log-probs of the same tokens under the same
weights, if the weight sync works; the reference model's log-probs of them show how far the
policy has moved from it. What the run records goes to ``<run>/verify_records.json``;
:func:`verdicts` turns it into pass/fail checks.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

PROBES = 8
"""Samples whose engine and policy log-probs are compared before every iteration."""
RECORDS = "verify_records.json"


def verifying_trainer(skip_sync_at: int | None = None) -> Any:
    """The checking controller class (imports openrlhf; call it where the backend runs).

    ``skip_sync_at``: the 1-based update after which the weight broadcast is skipped, so that
    the next comparison must fail (the negative control of the sync check).
    """
    import ray
    import torch
    import vllm

    from hgpo_train.openrlhf.experience_maker import StepAdvantageMaker
    from hgpo_train.openrlhf.trainer import HGPOTrainer

    class RecordingMaker(StepAdvantageMaker):
        """Writes the shared advantages as usual and records them, then replaces them with fixed +/-1."""

        records: list[dict[str, Any]]

        def compute_advantages_and_returns(self, experiences: list[Any]) -> list[Any]:
            experiences = super().compute_advantages_and_returns(experiences)
            record: dict[str, Any] = {"samples": {}, "actor_logprobs": {}}
            num = den = gap = 0.0
            for exp in experiences:
                index = np.asarray(exp.index)
                mask = exp.action_mask.float()
                for k, i in enumerate(index.tolist()):
                    record["samples"][i] = {
                        "advantage": float(exp.advantages[k].sum() / max(float(mask[k].sum()), 1.0)),
                        "mask_tokens": int(mask[k].sum()),
                    }
                    if i < PROBES and not self.table.padding[i]:
                        record["actor_logprobs"][i] = (
                            exp.action_log_probs[k][exp.action_mask[k]].float().tolist()
                        )
                sign = np.where(self.table.padding[index], 0.0, np.where(index % 2 == 0, 1.0, -1.0))
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
        """Plays the envs once; every iteration trains on that batch and first asks an engine for its log-probs."""

        maker_class = RecordingMaker

        def collect(self, iteration: int) -> Any:
            if not hasattr(self, "fixed_batch"):
                self.fixed_batch, self.engine_logprobs = super().collect(iteration), []
                self.experience_maker.records = []
            batch = self.fixed_batch
            scored = {}
            params = vllm.SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0)
            with self._engines_awake():
                for row in range(min(PROBES, len(batch))):
                    ids = [*batch.prompt_ids[row].tolist(), *batch.response_ids[row].tolist()]
                    out = ray.get(self.vllm_engines[0].generate.remote(ids, params))
                    start = len(batch.prompt_ids[row])
                    scored[row] = [out.prompt_logprobs[i][ids[i]].logprob for i in range(start, len(ids))]
            self.engine_logprobs.append(scored)
            return batch

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
                "actor_logprobs": [r["actor_logprobs"] for r in records],
                "engine_logprobs": self.engine_logprobs,
                "samples": records[0]["samples"],
                "source": self.experience_maker.table.source.tolist(),
                "padding": self.experience_maker.table.padding.tolist(),
                "batch": {
                    "reward": batch.reward.tolist(),
                    "traj_id": batch.traj_id.tolist(),
                    "group_id": batch.group_id.tolist(),
                    "step": batch.step.tolist(),
                    "invalid": batch.invalid.tolist(),
                    "fingerprints": [[str(int(x)) for x in row] for row in batch.fingerprints],
                },
            }
            (self.run_dir / RECORDS).write_text(json.dumps(result))

    return VerifyingTrainer


def logprob_mismatch(records: dict[str, Any]) -> list[float]:
    """Mean |engine - policy| log-prob per token over the probe samples, before each iteration."""
    out = []
    for engine, actor in zip(records["engine_logprobs"], records["actor_logprobs"]):
        diffs = [np.abs(np.subtract(engine[str(i)], actor[str(i)])) for i in actor]
        out.append(float(np.mean(np.concatenate(diffs))))
    return out


def verdicts(run_dir: Path, tolerance: float, min_drift: float) -> tuple[dict[str, Any], bool]:
    """The checks of a verifying run, from what it wrote.

    Comparison ``j`` is made before iteration ``j`` (0-based), after update ``j``'s sync; with a
    skipped sync, that comparison must fail and the others pass.
    """
    rec = json.loads((run_dir / RECORDS).read_text())
    loss, mismatch = rec["loss"], logprob_mismatch(rec)
    skipped = rec["skip_sync_at"]
    synced = [m for j, m in enumerate(mismatch) if j != skipped]
    first, last = rec["engine_logprobs"][0], rec["engine_logprobs"][-1]
    drift = float(np.mean(np.concatenate([np.abs(np.subtract(last[k], first[k])) for k in first])))
    checks = {
        "loss_decreases_on_fixed_batch": {"ok": loss[-1] < loss[0], "loss": loss},
        "weights_reach_vllm": {
            "ok": max(synced) < tolerance and drift > max(min_drift, 2 * max(synced[1:] or [0.0])),
            "engine_vs_policy_logprob_mismatch": mismatch,
            "engine_logprob_drift": drift,
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
