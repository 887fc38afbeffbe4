"""GPU validation of the OpenRLHF backend, in one command, on a machine with CUDA GPUs.

    python scripts/openrlhf_gpu_check.py                        # tiny model built here: no download
    python scripts/openrlhf_gpu_check.py --model /models/Qwen2.5-0.5B-Instruct --gpus 2
    python scripts/openrlhf_gpu_check.py --check-resume         # also restart the run from its checkpoint
    python scripts/openrlhf_gpu_check.py --check-async          # also sync vs async training (>= 2 GPUs)

It runs the real backend (OpenRLHF's launcher, vLLM engines, DeepSpeed policy and reference,
Ray env actors, the HGPO controller) on the built-in Rooms env, colocated on ``--gpus`` GPUs,
for a few iterations: the first plays the envs, and every iteration trains on that same batch,
with fixed synthetic advantages (+1 for even samples, -1 for odd ones) so the expected effect
of an update is known whatever the model. It checks, and exits 1 if any check fails:

1. the loss decreases on the fixed batch: -sum(A * log pi(response)) / tokens, with log pi from
   OpenRLHF's experience making (the policy before each update), falls from first to last;
2. weights reach every vLLM engine: before every update the engine-policy gap the run logs (every
   engine's prompt log-probs of a few samples against the DeepSpeed policy's) stays below the
   run's own warning threshold while the policy moves; the sync after update 2 is skipped on
   purpose, and the gap must then exceed it (the negative control);
3. the run folder is complete: metrics.jsonl, a DeepSpeed checkpoint, the final HF model;
4. with ``--check-resume``, a second launch resumes from the checkpoint and logs one more iteration;
5. with ``--check-async``, the plain backend trains the same Rooms config twice, half the GPUs
   training and half running engines: synchronously, then asynchronously
   (``train.async_staleness=1``, ``update.off_policy_correction=tis``, per-episode agent loops).
   The async run's rollouts must be fresh first and one version behind after, and the engines must
   follow every sync over the broadcast group (the engine gap under its warning); it reports env
   steps per second, the trainer's waiting share and the speedup, the first iteration left out.

It prints throughput (rollout steps and tokens per second, experience making, update and weight
broadcast times) and the peak GPU memory seen by ``nvidia-smi``. Results: ``<out>/gpu_check.json``.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from a checkout without installing
sys.path.insert(0, str(REPO / "benchmarks"))  # the throughput benchmarks' shares

SKIP_SYNC_AT = 2
"""The update after which the weight sync is skipped (the negative control)."""
MIN_DRIFT = 1e-3
"""Smallest mean change of the engine's log-probs over the run that shows new weights arrived."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model", default="tiny", help="'tiny' (built locally) or a local HF chat model folder"
    )
    parser.add_argument("--gpus", type=int, default=0, help="GPUs to use (default: all visible, at most 4)")
    parser.add_argument("--iterations", type=int, default=5, help="updates on the fixed batch (>= 4)")
    parser.add_argument("--lr", type=float, default=None, help="default 1e-4 for tiny, 1e-5 otherwise")
    parser.add_argument("--out", default="runs/openrlhf_gpu_check", help="run folder (replaced)")
    parser.add_argument(
        "--check-resume", action="store_true", help="also relaunch and resume from the checkpoint"
    )
    parser.add_argument(
        "--check-async", action="store_true", help="also compare sync and async training (>= 2 GPUs)"
    )
    return parser.parse_args(argv)


# ----------------------------------------------------------------------------- preflight


def preflight(gpus: int) -> int:
    """Print versions, fail early and clearly on a missing package or GPU; returns the GPU count to use."""
    versions = {}
    for name in ("torch", "ray", "transformers", "deepspeed", "vllm", "flash_attn", "openrlhf"):
        try:
            importlib.import_module(name)
            versions[name] = importlib.metadata.version(name)
        except Exception as error:  # noqa: BLE001  (an ImportError or a broken CUDA build: report both)
            versions[name] = f"MISSING ({type(error).__name__}: {error})"
    for name, version in versions.items():
        print(f"  {name:13s} {version}")
    if any(v.startswith("MISSING") for v in versions.values()):
        sys.exit("preflight: install the GPU stack first (docs/training/openrlhf.md)")
    import torch

    visible = torch.cuda.device_count()
    if not torch.cuda.is_available() or visible == 0:
        sys.exit("preflight: no CUDA GPU visible")
    use = gpus or min(visible, 4)
    if use > visible:
        sys.exit(f"preflight: --gpus {use} but only {visible} visible")
    print(f"  GPUs          {use} of {visible}: {torch.cuda.get_device_name(0)}")
    return use


@contextmanager
def gpu_memory_peaks() -> Iterator[dict[int, int]]:
    """Peak ``memory.used`` (MiB) per GPU while the block runs, polled from nvidia-smi every 2 s."""
    peak: dict[int, int] = {}
    stop = threading.Event()

    def poll() -> None:
        while not stop.wait(2.0):
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                check=False,
            ).stdout
            for line in out.strip().splitlines():
                index, used = (int(x) for x in line.split(","))
                peak[index] = max(peak.get(index, 0), used)

    if shutil.which("nvidia-smi"):
        threading.Thread(target=poll, daemon=True).start()
    try:
        yield peak
    finally:
        stop.set()


# ----------------------------------------------------------------------------- checks and report


def throughput(run_dir: Path, peak: dict[int, int]) -> dict[str, Any]:
    from hgpo_train.run.tracking import read_metrics

    records = [r for r in read_metrics(run_dir / "metrics.jsonl") if "rollout/step_samples" in r]
    first, later = records[0], records[1:] or records[:1]

    def mean(key: str) -> float:
        return float(sum(r.get(key, 0.0) for r in later) / len(later))

    return {
        "rollout_step_samples": first["rollout/step_samples"],
        "rollout_steps_per_s": first["throughput/steps_per_s"],
        "rollout_tokens_per_s": first["throughput/tokens_per_s"],
        "rollout_generate_s": first["time/generate_s"],
        "rollout_env_s": first["time/env_s"],
        "make_experience_s": mean("time/make_experience_s"),
        "ppo_update_s": mean("time/update_s"),
        "weight_broadcast_s": mean("time/sync_s"),
        "update_samples_per_s": first["rollout/step_samples"] / max(mean("time/update_s"), 1e-9),
        "peak_gpu_memory_mib": peak,
    }


def run_config(args: argparse.Namespace, gpus: int, out: Path) -> list[str]:
    """Overrides of the check run: Rooms, a few short episodes, colocated on ``gpus`` GPUs."""
    lr = args.lr if args.lr is not None else (1e-4 if args.model == "tiny" else 1e-5)
    return [
        f"model.name_or_path={args.model}",
        "env.name=rooms",
        "env.response_format=plain",
        "env.max_steps=5",
        "env.num_groups=4",
        "env.group_size=4",
        "env.num_workers=4",
        "generation.max_new_tokens=32",
        "advantage.estimator=hgpo",
        f"update.lr={lr}",
        "update.kl_coef=0.01",
        "update.entropy_coef=0.0",
        f"update.mini_batch_size={8 * gpus}",
        "update.micro_batch_size=4",
        f"train.iterations={args.iterations}",
        f"train.output_dir={out}",
        "train.save_every=2",
        "train.eval_every=0",
        "logging.tensorboard=false",
        "tiny.hidden_size=256",
        "tiny.num_heads=4",
        "tiny.intermediate_size=512",
        "tiny.vocab_size=2048",
        "tiny.corpus_episodes=32",
        f"openrlhf.gpus_per_node={gpus}",
        f"openrlhf.vllm_num_engines={gpus}",
        "openrlhf.colocate_all=true",
        "openrlhf.vllm_gpu_memory_utilization=0.3",
        "openrlhf.vllm_enable_prefix_caching=false",
        "openrlhf.vllm_enforce_eager=true",
        "openrlhf.max_len=2048",
        "openrlhf.env_actor_cpus=0.5",
    ]


def check_resume(out: Path, overrides: list[str], iterations: int) -> dict[str, Any]:
    """Relaunch the plain backend for one more iteration; it must resume, not restart."""
    from hgpo_train.run.tracking import read_metrics

    overrides = [o for o in overrides if not o.startswith("train.iterations=")] + [
        f"train.iterations={iterations + 1}"
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "hgpo_train", "--backend", "openrlhf", *overrides], cwd=REPO, check=False
    )
    logged = [r["iteration"] for r in read_metrics(out / "metrics.jsonl")]
    return {
        "ok": proc.returncode == 0 and logged == list(range(1, iterations + 2)),
        "returncode": proc.returncode,
        "logged_iterations": logged,
    }


SPLIT_KEYS = (
    "openrlhf.gpus_per_node",
    "openrlhf.vllm_num_engines",
    "openrlhf.colocate_all",
    "update.mini_batch_size",
)
"""What :func:`async_runs` sets anew: the GPUs split between training and engines."""


def async_runs(overrides: list[str], gpus: int, out: Path) -> dict[str, list[str]]:
    """The sync and the async run of ``--check-async``: the check's config with half the GPUs
    training and half running engines in both (async engines cannot share the policy's GPUs)."""
    half = gpus // 2
    split = [o for o in overrides if o.split("=")[0] not in (*SPLIT_KEYS, "train.output_dir")] + [
        f"openrlhf.gpus_per_node={half}",
        f"openrlhf.vllm_num_engines={half}",
        "openrlhf.colocate_all=false",
        f"update.mini_batch_size={8 * half}",
        "generation.agent_loop=per_episode",
    ]
    asynchronous = ["train.async_staleness=1", "update.off_policy_correction=tis"]
    return {
        "sync": [*split, f"train.output_dir={out / 'sync'}"],
        "async": [*split, *asynchronous, f"train.output_dir={out / 'async'}"],
    }


def check_async(overrides: list[str], gpus: int, out: Path, gap_warning: float) -> dict[str, Any]:
    """Run :func:`async_runs` one after the other; the async run's verdict and both runs' throughput."""
    from async_throughput import run_shares

    from hgpo_train.run.tracking import read_metrics

    result: dict[str, Any] = {}
    for mode, run in async_runs(overrides, gpus, out).items():
        proc = subprocess.run(
            [sys.executable, "-m", "hgpo_train", "--backend", "openrlhf", *run], cwd=REPO, check=False
        )
        if proc.returncode != 0:
            return {"ok": False, "failed_run": mode, "returncode": proc.returncode}
        records = [r for r in read_metrics(out / mode / "metrics.jsonl") if "rollout/step_samples" in r]
        steps_per_s, idle, waiting = run_shares(records[1:])
        result[mode] = {
            "env_steps_per_s": steps_per_s,
            "no_rollout_share": idle,
            "trainer_waiting_share": waiting,
            "staleness": [r["rollout/staleness_max"] for r in records],
            "engine_gap_max": max(
                (r["engine_gap/mean"] for r in records if "engine_gap/mean" in r), default=None
            ),
            "behaviour_kl": [r.get("update/behaviour_kl") for r in records],
        }
    asynchronous = result["async"]
    result["speedup"] = asynchronous["env_steps_per_s"] / result["sync"]["env_steps_per_s"]
    staleness, gap = asynchronous["staleness"], asynchronous["engine_gap_max"]
    result["ok"] = staleness == [0] + [1] * (len(staleness) - 1) and gap is not None and gap < gap_warning
    return result


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.iterations <= SKIP_SYNC_AT + 1:
        sys.exit(f"--iterations must be at least {SKIP_SYNC_AT + 2}")
    print("preflight:")
    gpus = preflight(args.gpus)
    if args.check_async and gpus < 2:
        sys.exit("--check-async needs at least 2 GPUs: asynchronous engines cannot share the policy's")
    out = (REPO / args.out).resolve() if not Path(args.out).is_absolute() else Path(args.out)
    shutil.rmtree(out, ignore_errors=True)

    from openrlhf_checks import verdicts, verifying_trainer

    from hgpo_train.config import load_config
    from hgpo_train.openrlhf.backend import run_paths, train
    from hgpo_train.openrlhf.checks import validate_cluster

    overrides = run_config(args, gpus, out)
    config = load_config(None, overrides)
    validate_cluster(config)
    cluster = config.openrlhf
    started = time.perf_counter()
    with gpu_memory_peaks() as peak:
        train(config, cluster, run_paths(config), trainer_class=verifying_trainer(skip_sync_at=SKIP_SYNC_AT))
    import ray

    ray.shutdown()
    checks, ok = verdicts(out, cluster.engine_gap_warning, MIN_DRIFT)
    if args.check_resume:
        checks["resume_from_checkpoint"] = check_resume(out, overrides, args.iterations)
        ok = ok and checks["resume_from_checkpoint"]["ok"]
    if args.check_async:
        checks["async_training"] = check_async(
            overrides, gpus, out / "async_check", cluster.engine_gap_warning
        )
        ok = ok and checks["async_training"]["ok"]
    result = {
        "ok": ok,
        "wall_s": time.perf_counter() - started,
        "checks": checks,
        "throughput": throughput(out, peak),
    }
    (out / "gpu_check.json").write_text(json.dumps(result, indent=2))
    print("\n" + json.dumps(result, indent=2))
    print(
        f"\n{'PASS' if ok else 'FAIL'}: "
        + ", ".join(f"{k}={'ok' if v['ok'] else 'FAILED'}" for k, v in checks.items())
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
