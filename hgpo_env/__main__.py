"""Command line: ``python -m hgpo_env demo`` plays an expert episode; ``download`` fetches data."""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path

import gymnasium as gym

import hgpo_env

DOWNLOADABLE = ("alfworld", "webshop")


def demo(env_id: str, seed: int, history_length: int, show_prompts: int) -> bool:
    """Play one episode with the env's expert, printing prompts, fingerprints and the result."""
    env = gym.make(env_id, history_length=history_length)
    prompt, info = env.reset(seed=seed)
    print(f"{env_id}  task: {info['task']}  (type {info['task_type']})")
    print(f"initial fingerprint: {info['initial_fingerprint']:#018x}\n")
    step, done, total = 0, False, 0.0
    while not done:
        if step < show_prompts:
            print(f"----- prompt at step {step + 1} -----\n{prompt}\n")
        command = env.unwrapped.expert_action()
        response = f"<think>The expert's plan says: {command}.</think><action>{command}</action>"
        prompt, reward, terminated, truncated, info = env.step(response)
        step += 1
        total += float(reward)
        levels = " ".join(f"L{k}={key:#018x}" for k, key in enumerate(info["fingerprints"]))
        print(f"step {step:2d}  {command:<34} reward {float(reward):4.1f}  {levels}")
        done = terminated or truncated
    print(
        f"\nresult: {'won' if info['won'] else 'not won'} in {step} steps, return {total}, score {info['score']}"
    )
    env.close()
    return bool(info["won"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hgpo_env", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    play = commands.add_parser("demo", help="play one expert episode and print prompts and fingerprints")
    play.add_argument("--env", default="HGPO-Rooms-v0", choices=sorted(hgpo_env.ENV_CLASSES))
    play.add_argument("--seed", type=int, default=0, help="picks the task")
    play.add_argument("--history-length", type=int, default=2, help="K, steps of memory in the prompt")
    play.add_argument("--show-prompts", type=int, default=2, help="how many full prompts to print")
    fetch = commands.add_parser("download", help="fetch an official dataset (needs network)")
    fetch.add_argument("family", choices=DOWNLOADABLE)
    fetch.add_argument("--dest", type=Path, default=None, help="target folder (default: under $HGPO_DATA)")
    args = parser.parse_args(argv)
    if args.command == "demo":
        return 0 if demo(args.env, args.seed, args.history_length, args.show_prompts) else 1
    path = importlib.import_module(f"hgpo_env.envs.{args.family}").download(args.dest)
    print(f"{args.family} data ready in {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
