"""Command line: ``python -m hgpo_env demo`` plays an expert episode; ``check`` checks an env's
contract and fingerprints before training; ``audit`` measures whether its state key sees the
state; ``serve`` puts an env behind an OpenEnv server; ``download`` fetches data."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import sys
from pathlib import Path
from typing import Any

import gymnasium as gym

import hgpo_env
from hgpo_env.prompting.memory import DEFAULT_HISTORY_LENGTH
from hgpo_env.serve.options import ServerOptions
from hgpo_env.textenv.arguments import read_value
from hgpo_env.textenv.registration import MissingExtraError, import_env_module

DOWNLOADABLE = ("alfworld", "webshop")


def demo(env_id: str, seed: int, history_length: int, show_prompts: int) -> bool:
    """Play one episode with the env's expert, printing prompts, fingerprints and the result."""
    env = gym.make(env_id, history_length=history_length)
    if not hasattr(env.unwrapped, "expert_action"):
        env.close()
        raise SystemExit(
            f"{env_id} has no expert to play; `python -m hgpo_env check {env_id}` probes it instead"
        )
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


def parse_env_kwargs(pairs: list[str]) -> dict[str, Any]:
    """``key=value`` pairs, each value read as the trainer reads one (:func:`read_value`: YAML)."""
    kwargs: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key.isidentifier():
            raise ValueError(f"env arguments are key=value, got {pair!r}")
        try:
            kwargs[key] = read_value(text)
        except ValueError as error:
            raise ValueError(f"env argument {key}: {error}") from None
    return kwargs


def env_from_args(args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    """The env id and its arguments; ``module:Id`` imports ``module`` (which registers ``Id``) first."""
    try:
        env_id = import_env_module(args.env_id)
    except Exception as error:  # noqa: BLE001 (a user's module may raise anything at import)
        module = args.env_id.rpartition(":")[0]
        raise ValueError(
            f"importing {module} for {args.env_id} failed: {type(error).__name__}: {error}"
        ) from None
    return env_id, parse_env_kwargs(args.env_kwargs)


BAD_ENV = (gym.error.Error, ValueError, TypeError, FileNotFoundError, MissingExtraError)
"""What a bad env id or env argument raises: reported in one line."""


def serve(args: argparse.Namespace) -> int:
    from hgpo_env.textenv.registration import extra_hint

    with extra_hint("hgpo_env.serve"):
        from hgpo_env.serve.server import serve as run_server

    from hgpo_env.serve.auth import read_token

    try:
        problem = ServerOptions.from_args(args).problem()
        if problem:
            raise ValueError(problem)
        env_id, env_kwargs = env_from_args(args)
        run_server(env_id, env_kwargs, ServerOptions.from_args(args, token=read_token(args.token_file)))
    except BAD_ENV as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


def check(args: argparse.Namespace) -> int:
    from hgpo_env.tools.check import check_env_health

    try:
        env_id, env_kwargs = env_from_args(args)
        report = check_env_health(
            env_id,
            env_kwargs,
            groups=args.groups,
            group_size=args.group_size,
            max_steps=args.max_steps,
            history_length=args.history_length,
            seed=args.seed,
            **({"probes": args.probe} if args.probe else {}),
        )
    except BAD_ENV as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(report.format())
    return 0 if report.ok else 1


def audit(args: argparse.Namespace) -> int:
    from hgpo_env.tools.audit import AuditError, audit_env, print_progress

    try:
        env_id, env_kwargs = env_from_args(args)
        with contextlib.redirect_stdout(sys.stderr):  # what envs print would corrupt --json
            report = audit_env(
                env_id,
                env_kwargs,
                episodes=args.episodes,
                group_size=args.group_size,
                max_steps=args.max_steps,
                history_length=args.history_length,
                seed=args.seed,
                policy=args.policy,
                progress=print_progress,
            )
    except (*BAD_ENV, AuditError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(json.dumps(report.to_json()) if args.json else report.format())
    return 0


def print_panel(args: argparse.Namespace) -> int:
    from hgpo_env.tools.panel import PanelError, build_panel

    if "=" in (args.split or ""):  # no split named: the first key=value came in its place
        args.env_kwargs, args.split = [args.split, *args.env_kwargs], None
    try:
        env_id, env_kwargs = env_from_args(args)
        tasks = range(args.tasks) if args.tasks is not None else None
        panel = build_panel(env_id, args.split, tasks, env_kwargs)
    except (*BAD_ENV, PanelError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(json.dumps(panel.to_json()))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hgpo_env", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    play = commands.add_parser("demo", help="play one expert episode and print prompts and fingerprints")
    play.add_argument("--env", default="HGPO-Rooms-v0", choices=sorted(hgpo_env.ENV_CLASSES))
    play.add_argument("--seed", type=int, default=0, help="picks the task")
    play.add_argument(
        "--history-length", type=int, default=DEFAULT_HISTORY_LENGTH, help="K, steps of memory in the prompt"
    )
    play.add_argument("--show-prompts", type=int, default=2, help="how many full prompts to print")
    health = commands.add_parser(
        "check", help="check an env's info contract and fingerprints before training"
    )
    health.add_argument("env_id", help='a registered id, or "module:Id" to import module first')
    health.add_argument("env_kwargs", nargs="*", metavar="key=value", help="env arguments")
    health.add_argument("--groups", type=int, default=3, help="task groups to play")
    health.add_argument("--group-size", type=int, default=4, help="episodes per group")
    health.add_argument("--max-steps", type=int, default=20, help="steps per episode at most")
    health.add_argument("--history-length", type=int, default=DEFAULT_HISTORY_LENGTH, help="K")
    health.add_argument("--seed", type=int, default=0)
    health.add_argument(
        "--probe",
        action="append",
        metavar="COMMAND",
        help="a command to try on a free-form env without an expert (repeat it; default: look, inventory, wait, help)",
    )
    keys = commands.add_parser("audit", help="measure whether an env's state key sees the state")
    keys.add_argument("env_id", help='a registered id, or "module:Id" to import module first')
    keys.add_argument("env_kwargs", nargs="*", metavar="key=value", help="env arguments")
    keys.add_argument("--episodes", type=int, default=64, help="episodes to play, in task groups")
    keys.add_argument("--group-size", type=int, default=8, help="episodes per task group")
    keys.add_argument("--max-steps", type=int, default=30, help="steps per episode at most")
    keys.add_argument("--history-length", type=int, default=4, help="K: context levels measured above 0")
    keys.add_argument("--seed", type=int, default=0, help="picks the tasks and seeds the policy")
    keys.add_argument(
        "--policy",
        choices=("random", "expert"),
        default="random",
        help="random admissible commands, or the env's expert",
    )
    keys.add_argument("--json", action="store_true", help="print the report as one JSON object")
    server = commands.add_parser("serve", help="serve an env over the network as an OpenEnv environment")
    server.add_argument("env_id", help='a registered id, or "module:Id" to import module first')
    server.add_argument(
        "env_kwargs", nargs="*", metavar="key=value", help="env arguments, fixed for every session"
    )
    server.add_argument(
        "--token-file",
        default=None,
        help="file holding the bearer token every request must carry (default: $HGPO_SERVE_TOKEN, if set)",
    )
    ServerOptions.add_arguments(server)
    panel = commands.add_parser(
        "panel", help="print an evaluation split's task panel: task ids, task keys and their hash"
    )
    panel.add_argument("env_id", help='a registered id, or "module:Id" to import module first')
    panel.add_argument("split", nargs="?", default=None, help="the split (default: the env's own)")
    panel.add_argument("env_kwargs", nargs="*", metavar="key=value", help="env arguments (data paths)")
    panel.add_argument(
        "--tasks", type=int, default=None, help="the first N task ids (needed where tasks have no end)"
    )
    fetch = commands.add_parser("download", help="fetch an official dataset (needs network)")
    fetch.add_argument("family", choices=DOWNLOADABLE)
    fetch.add_argument("--dest", type=Path, default=None, help="target folder (default: under $HGPO_DATA)")
    args = parser.parse_args(argv)
    if args.command == "demo":
        return 0 if demo(args.env, args.seed, args.history_length, args.show_prompts) else 1
    if args.command == "check":
        return check(args)
    if args.command == "serve":
        return serve(args)
    if args.command == "panel":
        return print_panel(args)
    if args.command == "audit":
        return audit(args)
    path = importlib.import_module(f"hgpo_env.envs.{args.family}").download(args.dest)
    print(f"{args.family} data ready in {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
