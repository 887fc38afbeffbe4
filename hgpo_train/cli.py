"""Command line: ``python -m hgpo_train [--backend openrlhf] --config FILE [key=value | --key value ...]``.

A first word names one of the trainer's tools instead: ``eval`` (a policy on a task panel),
``compare`` (the table of methods over runs), ``stop`` (ask a run to stop at a safe point) and
``tiny-model`` (build the tiny offline model); ``python -m hgpo_train TOOL --help`` for each.

Trains a policy with GRPO, GiGPO, HGPO, GraphGPO, G2PO, CRBC or MVPO (``advantage.estimator``)
on an HGPO-* env, writing the resolved config, metrics (JSONL, TensorBoard), checkpoints and
evaluations to ``train.output_dir``. Re-running the same command resumes from the latest checkpoint; SIGTERM
stops at the next safe point with a checkpoint, Ctrl-C at once, and either says where the run
can go on from. Both backends read this one command line
and the same config; ``--backend openrlhf`` runs OpenRLHF's launcher on a Ray cluster instead of
this machine's loop (``hgpo_train.openrlhf.backend``).
"""

from __future__ import annotations

import argparse
import errno
import importlib
import json
import os
import signal
import sys
from pathlib import Path

try:
    from hgpo_train.config import Config, ConfigError, load_config
    from hgpo_train.config.keys import describe_options, dotted_flags_as_overrides
    from hgpo_train.run.stopping import STOPPED_EXIT, StopRequested, request_stop, running, stopped_line
    from hgpo_train.run.tracking import read_metrics
except ModuleNotFoundError as missing:  # a core-only install, or a Python without hgpo: name the fix
    print(
        f"error: the trainer needs the train extra (no module {missing.name!r} in {sys.executable}): "
        "pip install -e '.[train]' (--backend openrlhf on CPU: bash scripts/setup_openrlhf_cpu.sh "
        "makes .venv-openrlhf)",
        file=sys.stderr,
    )
    sys.exit(2)


TOOLS = {
    "eval": "hgpo_train.evaluation.evaluate",
    "compare": "hgpo_train.evaluation.compare",
    "stop": "hgpo_train.run.stopping",
    "tiny-model": "hgpo_train.update.tiny_model",
}
"""The first words that run a tool (its module's ``main``) rather than training."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m hgpo_train",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Config keys, settable in the YAML file, as section.field=value or as --section.field "
        "value (the openrlhf: section is read by --backend openrlhf only):\n\n" + describe_options(Config),
    )
    parser.add_argument(
        "--backend",
        choices=["local", "openrlhf"],
        default="local",
        help="local: this machine (HF generate or vLLM); openrlhf: Ray + DeepSpeed + vLLM engines, "
        "set by the openrlhf: section",
    )
    parser.add_argument(
        "--env",
        help="rooms, alfworld, webshop or any registered env id, e.g. HGPO-BabyAI-v0 or module:Id "
        "(sets env.name; default: the config's, else alfworld)",
    )
    parser.add_argument("--config", help="YAML run config, e.g. configs/alfworld_qwen2.5-1.5b_k2.yaml")
    parser.add_argument(
        "--model", help="hub name or local folder (sets model.name_or_path); 'tiny' builds one"
    )
    parser.add_argument(
        "--ray-address",
        help="--backend openrlhf: join this Ray cluster ('auto' or HOST:PORT; sets openrlhf.ray_address; "
        "default $RAY_ADDRESS, else a local cluster)",
    )
    parser.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="--backend openrlhf: resolve OpenRLHF's arguments with its own parser, print them, exit",
    )
    parser.add_argument(
        "--allow-config-change",
        action="store_true",
        help="resume a run folder whose saved config differs from this one (refused by default)",
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="--backend openrlhf: show Ray's, vLLM's, DeepSpeed's and OpenRLHF's output on the console "
        "too (always in the run folder's driver.log)",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="start the run folder again: remove what the run wrote there (checkpoints, metrics, config) first",
    )
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="section.field=value",
        help="override any config key, e.g. advantage.estimator=gigpo update.lr=1e-5 (or --update.lr 1e-5)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in TOOLS:
        return importlib.import_module(TOOLS[argv[0]]).main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(dotted_flags_as_overrides(argv, Config))
    openrlhf = args.backend == "openrlhf"
    if not openrlhf and (args.ray_address or args.dry_run or args.verbose):
        parser.error("--ray-address, --dry-run and --verbose are options of --backend openrlhf")
    # RAY_ADDRESS is Ray's own convention (ray job submit sets it): it joins that cluster as the flag does
    ray_address = args.ray_address or (os.environ.get("RAY_ADDRESS") if openrlhf else None)
    try:
        config = load_config(
            args.config, args.overrides, env=args.env, model=args.model, ray_address=ray_address
        )
        if openrlhf:
            from hgpo_train.openrlhf.checks import validate_cluster

            validate_cluster(config)
    except ConfigError as error:
        print(f"config error: {error}", file=sys.stderr)
        return 2
    if args.print_config:
        print(config.to_yaml(), end="")
        return 0
    signal.signal(signal.SIGTERM, _interrupt)  # until the run can stop at a safe point
    if openrlhf:
        return _openrlhf(config, args)
    try:
        return _train(config, args)
    except KeyboardInterrupt:
        print("stopped before training started", file=sys.stderr)
        return STOPPED_EXIT


def _openrlhf(config: Config, args: argparse.Namespace) -> int:
    try:
        from hgpo_train.openrlhf.backend import run
    except ModuleNotFoundError as missing:
        print(
            f"error: the openrlhf backend's packages are not in this Python ({sys.executable}; no "
            f"module {missing.name!r}): on CPU run bash scripts/setup_openrlhf_cpu.sh, then "
            ".venv-openrlhf/bin/python -m hgpo_train ...; on GPUs pip install -e '.[openrlhf]'",
            file=sys.stderr,
        )
        return 2
    return run(
        config,
        dry_run=args.dry_run,
        allow_config_change=args.allow_config_change,
        overwrite=args.overwrite,
        verbose=args.verbose,
    )


def _train(config: Config, args: argparse.Namespace) -> int:
    from hgpo_env.textenv.registration import MissingExtraError
    from hgpo_env.tools.panel import PanelError
    from hgpo_env.vector import PoolError
    from hgpo_train.local.train import Trainer
    from hgpo_train.run.checkpoint import CheckpointError
    from hgpo_train.update.modeling import ModelLoadError

    try:
        trainer = Trainer(config, allow_config_change=args.allow_config_change, overwrite=args.overwrite)
    except (ConfigError, ModelLoadError, PoolError, MissingExtraError, OSError, ValueError) as error:
        print(f"error: {type(error).__name__}: {error}", file=sys.stderr)  # bad config, model or data
        return 2
    if trainer.resumed_from is not None:
        print(f"resuming from {trainer.resumed_from} (iteration {trainer.start_iteration})", file=sys.stderr)
    signal.signal(signal.SIGTERM, lambda *_: request_stop(trainer.run_dir, "SIGTERM"))
    try:
        with running(trainer.run_dir):
            metrics = trainer.fit()
    except StopRequested as stopped:
        last = trainer.last_checkpoint()
        print(stopped_line(stopped, last.name if last else None), file=sys.stderr)
        return STOPPED_EXIT
    except PanelError as error:  # eval.panel names other tasks than the env plays
        print(f"panel error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        last = trainer.last_checkpoint()
        print(
            f"stopped at iteration {trainer.completed}; last checkpoint {last.name if last else 'none'}; "
            "re-run the same command to resume",
            file=sys.stderr,
        )
        return STOPPED_EXIT
    except OSError as error:
        if error.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        where = "" if isinstance(error, CheckpointError) else f" writing to {trainer.run_dir}"
        print(f"error: {error.strerror}{where}", file=sys.stderr)  # a full disk: no traceback
        return 1
    finally:
        trainer.close()
    print_summary(trainer.logger.path, metrics)
    print(f"run folder: {trainer.run_dir}")
    return 0


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def print_summary(metrics_path: Path, last: dict[str, float]) -> None:
    """The eval success rate before and after training, and the last rollout metrics."""
    evals = [r for r in read_metrics(metrics_path) if "eval/success_rate" in r]
    if len(evals) >= 2:
        first, final = evals[0], evals[-1]
        print(
            f"eval success rate: {first['eval/success_rate']:.3f} at iteration {first['iteration']} -> "
            f"{final['eval/success_rate']:.3f} at iteration {final['iteration']}"
        )
    print(
        json.dumps({k: round(v, 4) for k, v in last.items() if k.startswith(("rollout/", "eval/"))}, indent=2)
    )


if __name__ == "__main__":
    sys.exit(main())
