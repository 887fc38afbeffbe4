"""WebShop memory: 128 envs in one process, and 128 envs in a GroupedEnvPool.

    python benchmarks/webshop_memory.py [--envs 128] [--workers 2] [--no-pool]

Envs in one process share the catalog, goals, search index and part-of-speech tagger, so each
extra env costs only its session state. Resident memory (RSS) is read with psutil after every
env has played an oracle episode (search, product page, options, purchase). Uses WebShop's small setting when its files are
found (``../shared/data/webshop``, ``$WEBSHOP_DATA``, data home), else the generated catalog.
"""

from __future__ import annotations

import gc
import warnings
from pathlib import Path

import gymnasium as gym
import psutil
from command_line import options
from webshop_common import data_path

import hgpo_env  # noqa: F401
from hgpo_env.envs.webshop.sources import GeneratedCatalogWarning
from hgpo_env.vector import GroupedEnvPool

MIB = 1 << 20


def rss(pid: int | None = None) -> float:
    return psutil.Process(pid).memory_info().rss / MIB


def exercise(env: gym.Env, seed: int) -> gym.Env:
    """Play one oracle episode, so everything an episode loads is loaded."""
    env.reset(seed=seed)
    done = False
    while not done:
        _, _, terminated, truncated, _ = env.step(f"<action>{env.unwrapped.expert_action()}</action>")
        done = terminated or truncated
    return env


def played_env(**kwargs: object) -> gym.Env:
    """A pool worker's env, after one oracle episode."""
    return exercise(gym.make("HGPO-WebShop-v0", **kwargs), 0)


def in_one_process(num_envs: int, folder: Path | None) -> None:
    base = rss()
    first = exercise(gym.make("HGPO-WebShop-v0", data_path=folder), 0)
    gc.collect()
    one = rss()
    envs = [first] + [gym.make("HGPO-WebShop-v0", data_path=folder) for _ in range(num_envs - 1)]
    for seed, env in enumerate(envs):
        exercise(env, seed)
    gc.collect()
    total = rss()
    print(
        f"one process: interpreter+imports {base:.0f} MiB, first env (catalog, goals, index, nouns) "
        f"+{one - base:.0f} MiB, {num_envs} envs {total:.0f} MiB in all, "
        f"{(total - one) / (num_envs - 1) * 1024:.0f} KiB per further env"
    )


def in_a_pool(num_envs: int, workers: int, folder: Path | None) -> None:
    group_size = 8
    with GroupedEnvPool(
        played_env, num_envs // group_size, group_size, num_workers=workers, seed=0, data_path=folder
    ) as pool:
        pool.reset()
        for _ in range(2):
            pool.step({i: "<action>click[back to search]</action>" for i in pool.running})
        sizes = [rss(pid) for pid in pool.worker_pids()]
        print(
            f"pool: {pool.num_envs} envs on {pool.num_workers} workers, worker RSS "
            f"{', '.join(f'{s:.0f}' for s in sizes)} MiB ({sum(sizes) / pool.num_envs:.1f} MiB per env in all)"
        )


def main() -> None:
    args = options(__doc__, envs=128, workers=2, no_pool=False)
    warnings.simplefilter("ignore", GeneratedCatalogWarning)
    in_one_process(args.envs, data_path())
    if not args.no_pool:
        in_a_pool(args.envs, args.workers, data_path())


if __name__ == "__main__":
    main()
