"""Evaluation on a fixed task list: success rate overall and per task type, and the env score.

Each task id of ``eval.tasks`` is played once per seed of ``eval.seeds`` (the seed drives the
env reset and the sampling), or in whole passes until ``eval.min_episodes``, with the env arguments of ``eval.env_kwargs`` on top of
``env.kwargs`` (the held-out split: Rooms ``split=eval``, ALFWorld ``valid_seen`` or
``valid_unseen``, WebShop ``test``).

    python -m hgpo_train.eval --run runs/demo                 # a run's latest checkpoint
    python -m hgpo_train.eval --env rooms --model PATH --output results.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hgpo_env.vector import GroupedEnvPool
from hgpo_train.checkpoint import latest_checkpoint
from hgpo_train.config import Config, ConfigError, describe_options, load_config
from hgpo_train.modeling import resolve_device
from hgpo_train.policy import build_generator, load_run_policy
from hgpo_train.rollout import Generator, collect_rollouts, count_tasks, make_pool


@dataclass
class EpisodeResult:
    task_id: int
    seed: int
    task: str
    task_type: str | None
    won: bool
    score: float
    length: int


@dataclass
class EvalResult:
    episodes: list[EpisodeResult]

    def metrics(self, prefix: str = "") -> dict[str, float]:
        """Success rate and score (means over all episodes), per task type, and the spread over seeds."""
        won = np.array([e.won for e in self.episodes], dtype=float)
        out = {
            f"{prefix}success_rate": float(won.mean()),
            f"{prefix}score": float(np.mean([e.score for e in self.episodes])),
            f"{prefix}episode_length": float(np.mean([e.length for e in self.episodes])),
        }
        by_seed: dict[int, list[bool]] = defaultdict(list)
        by_type: dict[str, list[bool]] = defaultdict(list)
        for e in self.episodes:
            by_seed[e.seed].append(e.won)
            if e.task_type is not None:
                by_type[e.task_type].append(e.won)
        out[f"{prefix}success_rate_std_over_seeds"] = float(np.std([np.mean(v) for v in by_seed.values()]))
        for task_type, wins in sorted(by_type.items()):
            out[f"{prefix}success_rate/{task_type}"] = float(np.mean(wins))
        return out

    def to_json(self) -> dict[str, Any]:
        return {"metrics": self.metrics(), "episodes": [asdict(e) for e in self.episodes]}


class Evaluator:
    """Plays the fixed task list with a generator; env pools are made once and reused."""

    def __init__(self, config: Config, generator: Generator, tokenizer: Any = None) -> None:
        self.config = config
        self.generator = generator
        self.tokenizer = tokenizer
        self._pools: dict[int, GroupedEnvPool] = {}

    def _pool(self, size: int) -> GroupedEnvPool:
        if size not in self._pools:
            self._pools[size] = make_pool(
                self.config.env,
                size,
                1,
                seed=0,
                tokenizer=self.tokenizer,
                env_kwargs=self.config.eval.env_kwargs,
            )
        return self._pools[size]

    def task_ids(self) -> list[int]:
        """One seed's episodes: ``eval.tasks`` (null: every task of the eval split), repeated in
        whole passes until ``eval.min_episodes``."""
        tasks = self.config.eval.tasks
        if tasks is None:
            count = count_tasks(self.config.env, self.config.eval.env_kwargs)
            if count is None:
                raise ConfigError(
                    f"eval.tasks is null but {self.config.env.env_id} has no finite task list: list the task ids"
                )
            tasks = range(count)
        passes = -(-(self.config.eval.min_episodes or 0) // len(tasks)) or 1
        return list(tasks) * passes

    def run(self) -> EvalResult:
        cfg = self.config
        tasks = self.task_ids()
        chunk = min(len(tasks), cfg.env.num_groups * cfg.env.group_size)
        episodes = []
        rng_state = torch.get_rng_state()  # evaluation must not shift the training run's randomness
        try:
            for seed in cfg.eval.seeds:
                torch.manual_seed(seed)
                for start in range(0, len(tasks), chunk):
                    ids = tasks[start : start + chunk]
                    batch = collect_rollouts(
                        self._pool(len(ids)),
                        self.generator,
                        seeds=[seed] * len(ids),
                        task_ids=ids,
                        constrained=cfg.generation.constrained,
                        temperature=cfg.eval.temperature,
                    )
                    e = batch.episodes
                    for j, task_id in enumerate(ids):  # one env per group, groups in task order
                        episodes.append(
                            EpisodeResult(
                                int(task_id),
                                int(seed),
                                e.task[j],
                                e.task_type[j],
                                bool(e.won[j]),
                                float(e.score[j]),
                                int(e.length[j]),
                            )
                        )
        finally:
            torch.set_rng_state(rng_state)
        return EvalResult(episodes)

    def close(self) -> None:
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hgpo_train.eval",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="config keys (section.field=value):\n" + describe_options(),
    )
    parser.add_argument(
        "--run", type=Path, help="a training run folder: its config.yaml and latest checkpoint"
    )
    parser.add_argument("--checkpoint", type=Path, help="a checkpoint folder (default: the run's latest)")
    parser.add_argument("--env", help="rooms, alfworld, webshop or any registered env id (sets env.name)")
    parser.add_argument("--config", type=Path, help="YAML run config (ignored with --run)")
    parser.add_argument("--model", help="hub name or local folder (default: the config's)")
    parser.add_argument("--output", type=Path, help="write the JSON results here")
    parser.add_argument(
        "overrides", nargs="*", help="section.field=value, e.g. eval.tasks=[0,1,2] eval.seeds=[0]"
    )
    args = parser.parse_args(argv)
    if args.run is not None and not (args.run / "config.yaml").is_file():
        print(f"error: --run {args.run}: not a training run folder (no config.yaml)", file=sys.stderr)
        return 2
    config_path = args.run / "config.yaml" if args.run else args.config
    try:
        config = load_config(config_path, args.overrides, env=args.env, model=args.model)
    except ConfigError as error:
        print(f"config error: {error}", file=sys.stderr)
        return 2
    run_dir = args.run or Path(config.train.output_dir)
    checkpoint = args.checkpoint or (latest_checkpoint(args.run) if args.run else None)
    loaded = load_run_policy(config, run_dir, resolve_device(config.train.device), checkpoint)
    evaluator = Evaluator(config, build_generator(config, loaded), loaded.tokenizer)
    try:
        result = evaluator.run()
    finally:
        evaluator.close()
    print(json.dumps(result.metrics(), indent=2))
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(result.to_json(), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
