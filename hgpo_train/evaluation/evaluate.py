"""Evaluation on a fixed task panel: success (pass@1), unbiased pass@k, score, per task type.

Each task id of ``eval.tasks`` (null: every task of the split) is played once per seed of
``eval.seeds`` (the seed drives the env reset and the sampling), in whole passes until
``eval.min_episodes`` and at least ``eval.samples_per_task`` times, with the env arguments of
``eval.env_kwargs`` on top of ``env.kwargs`` (the held-out split: Rooms ``split=eval``, ALFWorld
``valid_seen`` or ``valid_unseen``, WebShop ``test``). Every episode's task key is recorded, the
tasks make a panel (:mod:`hgpo_env.tools.panel`) whose hash goes into the results with the settings
and the provenance, and with ``eval.panel`` an env whose tasks differ from the manifest's is
refused at its first differing episode.

    python -m hgpo_train eval --run runs/demo                 # a run's latest checkpoint
    python -m hgpo_train eval --env rooms --model PATH --output results.json
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import sys
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hgpo_env.tools.panel import Panel, PanelError, panel_from_episodes
from hgpo_env.vector import GroupedEnvPool
from hgpo_train.config import Config, ConfigError, load_config
from hgpo_train.config.keys import describe_options, dotted_flags_as_overrides, flatten_dotted
from hgpo_train.rollout.collect import collect_rollouts, count_tasks, make_pool
from hgpo_train.rollout.episodes import Generator
from hgpo_train.run import durable
from hgpo_train.run.checkpoint import latest_checkpoint
from hgpo_train.run.provenance import run_info
from hgpo_train.update.modeling import resolve_device
from hgpo_train.update.policy import build_generator, load_run_policy


@dataclass
class EpisodeResult:
    task_id: int
    seed: int
    task: str
    task_type: str | None
    won: bool
    score: float
    length: int
    task_key: str
    """The task's key (decimal: 64-bit integers do not survive JSON doubles)."""


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of a task solved ``c`` times in ``n`` samples: ``1 - C(n-c, k) / C(n, k)``,
    the chance that ``k`` samples drawn without replacement hold a success."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))


@dataclass
class EvalResult:
    episodes: list[EpisodeResult]
    panel: Panel | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    """How the episodes were sampled (seeds, temperature, samples per task)."""

    def metrics(self, prefix: str = "") -> dict[str, float]:
        """Success rate (pass@1) and score, means over all episodes, their spread over seeds
        (population sd of the per-seed means), unbiased pass@k for k = 2, 4, ... up to the fewest
        samples of a task, and success per task type."""
        won = np.array([e.won for e in self.episodes], dtype=float)
        score = np.array([e.score for e in self.episodes], dtype=float)
        out = {
            f"{prefix}success_rate": float(won.mean()),
            f"{prefix}score": float(score.mean()),
            f"{prefix}episode_length": float(np.mean([e.length for e in self.episodes])),
        }
        seeds = np.array([e.seed for e in self.episodes])
        per_seed = [(won[seeds == s].mean(), score[seeds == s].mean()) for s in np.unique(seeds)]
        out[f"{prefix}success_rate_std_over_seeds"] = float(np.std([w for w, _ in per_seed]))
        out[f"{prefix}score_std_over_seeds"] = float(np.std([x for _, x in per_seed]))
        samples: dict[int, list[bool]] = defaultdict(list)
        by_type: dict[str, list[bool]] = defaultdict(list)
        for e in self.episodes:
            samples[e.task_id].append(e.won)
            if e.task_type is not None:
                by_type[e.task_type].append(e.won)
        fewest = min(map(len, samples.values()))
        k = 2
        while k <= fewest:
            rates = [pass_at_k(len(w), sum(w), k) for w in samples.values()]
            out[f"{prefix}pass@{k}"] = float(np.mean(rates))
            k *= 2
        for task_type, wins in sorted(by_type.items()):
            out[f"{prefix}success_rate/{task_type}"] = float(np.mean(wins))
        return out

    def to_json(self, run: dict[str, Any] | None = None, **provenance: Any) -> dict[str, Any]:
        """Metrics, the panel (without its task list), the sampling settings, the ``run`` evaluated
        (its method and training seed, for :mod:`hgpo_train.evaluation.compare`), ``provenance``
        (:func:`hgpo_train.run.provenance.run_info`) and every episode."""
        panel = self.panel.to_json() if self.panel is not None else None
        if panel is not None:
            panel.pop("tasks")
        return {
            "run": run or {},
            "metrics": self.metrics(),
            "panel": panel,
            "settings": self.settings,
            "provenance": provenance,
            "episodes": [asdict(e) for e in self.episodes],
        }


RESULTS = "evals"
"""The run folder's evaluations: one results file per evaluation, ``iter_000010.json``."""


def results_json(config: Config, result: EvalResult, checkpoint: str) -> dict[str, Any]:
    """What a results file holds: the result, the run (method, its settings, training seed) and
    the provenance. The settings are what the prompt shows (K, the memory kind), the estimator's
    and how the rollouts were trained on (their staleness bound, the off-policy correction,
    whether summary turns were): runs of one method that differ in them are different rows of
    :mod:`hgpo_train.evaluation.compare`'s table."""
    settings = {
        "history_length": config.env.history_length,
        "memory": config.env.memory,
        "train_summaries": config.update.train_summaries,
        **flatten_dotted(asdict(config.advantage)),
        "async_staleness": config.train.async_staleness,
        "off_policy_correction": config.update.off_policy_correction,
    }
    settings.pop("estimator")
    run = {
        "method": config.advantage.estimator,
        "method_settings": settings,
        "train_seed": config.train.seed,
        "folder": config.train.output_dir,
    }
    return result.to_json(run, **run_info(config.to_dict(), checkpoint=checkpoint))


class Evaluator:
    """Plays the fixed task list with a generator; env pools are made once and reused."""

    def __init__(self, config: Config, generator: Generator, tokenizer: Any = None) -> None:
        self.config = config
        self.generator = generator
        self.tokenizer = tokenizer
        self._pools: dict[int, GroupedEnvPool] = {}
        self._probed = False
        """Whether an env was made with the evaluation's arguments (the first pool checks them)."""

    def _pool(self, size: int) -> GroupedEnvPool:
        if size not in self._pools:
            self._pools[size] = make_pool(
                self.config.env,
                size,
                1,
                seed=0,
                tokenizer=self.tokenizer,
                env_kwargs=self.config.eval.env_kwargs,
                probe=not self._probed,
            )
            self._probed = True
        return self._pools[size]

    def task_ids(self) -> list[int]:
        """One seed's episodes: the panel's tasks (:attr:`panel_tasks`), repeated in whole passes
        until ``eval.min_episodes`` and ``eval.samples_per_task``."""
        return self.panel_tasks * self.passes()

    @functools.cached_property
    def manifest(self) -> Panel | None:
        """``eval.panel``'s panel (a manifest file or a shipped name), refused at once if it is
        another env or split than this evaluation's."""
        if self.config.eval.panel is None:
            return None
        manifest = Panel.load(self.config.eval.panel)
        if (manifest.env_id, manifest.split) != (self.config.env.env_id, self.split):
            raise PanelError(
                f"eval.panel {self.config.eval.panel} is {manifest.env_id} {manifest.split}; this evaluation "
                f"plays {self.config.env.env_id} {self.split} (env.name, eval.env_kwargs)"
            )
        return manifest

    @functools.cached_property
    def panel_tasks(self) -> list[int]:
        """The task ids of one pass, in play order: ``eval.panel``'s, else ``eval.tasks`` (null: every
        task of the split; counting them builds an env, once)."""
        if self.manifest is not None:
            return list(self.manifest.task_ids)
        tasks = self.config.eval.tasks
        if tasks is None:
            count = count_tasks(self.config.env, self.config.eval.env_kwargs)
            self._probed = True
            if count is None:
                raise ConfigError(
                    f"eval.tasks is null but {self.config.env.env_id} has no finite task list: list the task ids"
                )
            tasks = range(count)
        return list(tasks)

    def passes(self) -> int:
        """Whole passes over the task list per seed: enough for ``eval.min_episodes`` and at
        least ``eval.samples_per_task``."""
        to_reach = -(-(self.config.eval.min_episodes or 0) // len(self.panel_tasks))
        return max(to_reach, self.config.eval.samples_per_task, 1)

    @property
    def split(self) -> str | None:
        return {**self.config.env.kwargs, **self.config.eval.env_kwargs}.get("split")

    def run(self) -> EvalResult:
        cfg = self.config
        panel_tasks, manifest = self.panel_tasks, self.manifest
        expected = dict(zip(manifest.task_ids, manifest.task_keys)) if manifest else {}
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
                        response_format=cfg.env.response_format,
                        temperature=cfg.eval.temperature,
                    )
                    e = batch.episodes
                    for j, task_id in enumerate(ids):  # one env per group, groups in task order
                        key = int(e.task_key[j])
                        if expected and expected[task_id] != key:
                            raise PanelError(
                                f"task {task_id} is another task here than in eval.panel (task key {key}, "
                                f"the panel's {expected[task_id]}): the env's data differs from the panel's"
                            )
                        episodes.append(
                            EpisodeResult(
                                int(task_id),
                                int(seed),
                                e.task[j],
                                e.task_type[j],
                                bool(e.won[j]),
                                float(e.score[j]),
                                int(e.length[j]),
                                str(key),
                            )
                        )
        finally:
            torch.set_rng_state(rng_state)
        played = [(e.task_id, int(e.task_key)) for e in episodes]
        panel = panel_from_episodes(cfg.env.env_id, self.split, panel_tasks, played)
        if manifest is not None:
            manifest.check(panel)
        settings = {
            "seeds": list(cfg.eval.seeds),
            "temperature": cfg.eval.temperature,
            "passes": self.passes(),
            "constrained": cfg.generation.constrained,
        }
        return EvalResult(episodes, panel, settings)

    def record(self, iteration: int, run_dir: Path) -> EvalResult:
        """:meth:`run`, keeping the results file of the policy after ``iteration`` in the run
        folder (both trainers' evaluations, in the format of ``python -m hgpo_train eval``)."""
        result = self.run()
        path = run_dir / RESULTS / f"iter_{iteration:06d}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        durable.write_text(
            path, json.dumps(results_json(self.config, result, f"iteration {iteration}"), indent=2)
        )
        return result

    def close(self) -> None:
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hgpo_train eval",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="config keys (section.field=value):\n" + describe_options(Config),
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
    args = parser.parse_args(dotted_flags_as_overrides(sys.argv[1:] if argv is None else argv, Config))
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
    evaluator = Evaluator(config, build_generator(config, loaded, training=False), loaded.tokenizer)
    try:
        result = evaluator.run()
    except PanelError as error:
        print(f"panel error: {error}", file=sys.stderr)
        return 2
    finally:
        evaluator.close()
    print(json.dumps(result.metrics(), indent=2))
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        source = str(checkpoint) if checkpoint else config.model.name_or_path
        args.output.write_text(json.dumps(results_json(config, result, source), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
