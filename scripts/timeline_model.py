"""A timeline model of one HGPO iteration on a GPU node: lockstep, per-episode and asynchronous.

    python scripts/timeline_model.py                      # the table of docs/training/timeline.md
    python scripts/timeline_model.py --gpus 4 --turns 40  # another node, longer episodes

No GPU was lent to this project, so what 8 GPUs gain is modelled, not measured: each phase's time
comes from the work it does (tokens, env steps) and a rate. The env's rates are measured here
(ALFWorld's step, its prompts' length); the GPU's are published figures or stated assumptions,
every one a flag. ``scripts/openrlhf_gpu_check.py --check-async`` measures the real thing on the
first GPUs lent.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

H100_BF16_TFLOPS = 989.0
"""Dense bf16 peak of an H100 SXM (NVIDIA's datasheet)."""
H100_HBM_TB_S = 3.35
"""Its memory bandwidth (NVIDIA's datasheet)."""


@dataclass(frozen=True)
class Iteration:
    """The work of one iteration: ``episodes`` episodes of ``turns`` turns each."""

    episodes: int
    turns: float
    prompt_tokens: float
    response_tokens: float
    longest_response: float
    env_step_s: float
    env_workers: int

    @property
    def steps(self) -> float:
        return self.episodes * self.turns


@dataclass(frozen=True)
class Node:
    """The GPUs' rates for a model of ``params_b`` billion parameters."""

    params_b: float
    decode_tok_s: float
    """Output tokens per second of one saturated engine GPU."""
    prefill_tok_s: float
    mfu: float
    sync_gb_s: float
    wake_sleep_s: float

    @property
    def step_floor_s(self) -> float:
        """The shortest decode step: every weight read once (bf16) from HBM."""
        return 2 * self.params_b / (H100_HBM_TB_S * 1e3)

    def flops_s(self, gpus: int) -> float:
        return gpus * self.mfu * H100_BF16_TFLOPS * 1e12


def generation_s(work: Iteration, node: Node, engines: int, lockstep: bool) -> float:
    """The rollout's generation on ``engines`` GPUs. Lockstep, each turn waits for its longest
    response, decoded at the step time of the turn's batch; per episode, the engines stay as full
    as the episodes in flight allow, and a chain of one episode's turns is the floor."""
    prefill = work.steps * work.prompt_tokens / (engines * node.prefill_tok_s)
    batch = work.episodes / engines
    step_s = max(node.step_floor_s, batch / node.decode_tok_s)
    if lockstep:
        return prefill + work.turns * work.longest_response * step_s
    saturated = work.steps * work.response_tokens / (engines * node.decode_tok_s)
    chain = work.turns * work.response_tokens * step_s
    return prefill + max(saturated, chain)


def env_s(work: Iteration) -> float:
    """The env steps of a lockstep rollout, turn after turn on the pool's workers."""
    return work.turns * work.episodes * work.env_step_s / work.env_workers


def training_s(work: Iteration, node: Node, gpus: int) -> tuple[float, float]:
    """Experience making (policy and reference forward) and the update (forward and backward),
    over every step's prompt and response tokens, at the node's model FLOPs utilisation."""
    tokens = work.steps * (work.prompt_tokens + work.response_tokens)
    params = node.params_b * 1e9
    return 2 * 2 * params * tokens / node.flops_s(gpus), 6 * params * tokens / node.flops_s(gpus)


def sync_s(node: Node) -> float:
    return 2 * node.params_b / node.sync_gb_s


def timelines(work: Iteration, node: Node, gpus: int) -> dict[str, dict[str, float]]:
    """Phase seconds of one iteration in each mode; ``iteration`` is their critical path."""
    experience, update = training_s(work, node, gpus)
    colocated = {"experience": experience, "update": update, "sync": sync_s(node) + node.wake_sleep_s}
    lockstep = {"generation": generation_s(work, node, gpus, True), "env": env_s(work), **colocated}
    per_episode = {"generation": generation_s(work, node, gpus, False), "env": 0.0, **colocated}
    out = {
        f"sync, lockstep, {gpus} colocated": {**lockstep, "iteration": sum(lockstep.values())},
        f"sync, per-episode, {gpus} colocated": {**per_episode, "iteration": sum(per_episode.values())},
    }
    best: tuple[float, int, dict[str, float]] | None = None
    for engines in range(1, gpus):
        generation = generation_s(work, node, engines, False)
        experience, update = training_s(work, node, gpus - engines)
        phases = {"generation": generation, "env": 0.0, "experience": experience, "update": update}
        phases["sync"] = sync_s(node)
        phases["iteration"] = max(generation, experience + update) + phases["sync"]
        if best is None or phases["iteration"] < best[0]:
            best = (phases["iteration"], engines, phases)
    if best is not None:
        _, engines, phases = best
        out[f"async, per-episode, {engines} GPU(s) sampling + {gpus - engines} training"] = phases
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = parser.add_argument
    add("--gpus", type=int, default=8)
    add("--episodes", type=int, default=128, help="the paper's 16 groups of 8")
    add("--turns", type=float, nargs="+", default=[20.0, 40.0], help="mean episode length (max 50)")
    add(
        "--prompt-tokens",
        type=float,
        default=400,
        help="measured: 1,450 characters at K = 2, about 4 per token",
    )
    add("--response-tokens", type=float, default=150, help="mean reply (<think> ... </think><action>)")
    add("--longest-response", type=float, default=512, help="a lockstep turn's longest: the cap")
    add(
        "--env-step-ms",
        type=float,
        default=2.1,
        help="measured: ALFWorld step, benchmarks/alfworld_latency.py",
    )
    add("--env-workers", type=int, default=16)
    add("--models", type=float, nargs="+", default=[1.5, 7.0], help="billions of parameters")
    add("--decode-tok-s", type=float, nargs="+", default=[25000.0, 12500.0], help="per engine GPU, per model")
    add("--prefill-factor", type=float, default=10.0, help="prefill tokens per decoded token's time")
    add("--mfu", type=float, default=0.3)
    add("--sync-gb-s", type=float, default=50.0, help="weight sync bandwidth (NCCL / CUDA IPC)")
    add("--wake-sleep-s", type=float, default=2.0, help="colocated engines' wake-up and sleep per iteration")
    args = parser.parse_args(argv)
    if len(args.decode_tok_s) != len(args.models):
        parser.error("--decode-tok-s takes one rate per --models entry")
    for params_b, decode in zip(args.models, args.decode_tok_s):
        node = Node(
            params_b, decode, decode * args.prefill_factor, args.mfu, args.sync_gb_s, args.wake_sleep_s
        )
        for turns in args.turns:
            work = Iteration(
                args.episodes,
                turns,
                args.prompt_tokens,
                args.response_tokens,
                args.longest_response,
                args.env_step_ms / 1e3,
                args.env_workers,
            )
            print(f"\n{params_b:g}B model, {args.gpus} GPUs, {args.episodes} episodes of {turns:g} turns")
            print(
                "| mode | generation s | env s | experience s | update s | sync s | iteration s | env steps/s | speedup |"
            )
            print("|---|---|---|---|---|---|---|---|---|")
            modes = timelines(work, node, args.gpus)
            baseline = next(iter(modes.values()))["iteration"]
            for mode, p in modes.items():
                cells = [p[k] for k in ("generation", "env", "experience", "update", "sync", "iteration")]
                print(
                    f"| {mode} | "
                    + " | ".join(f"{c:.1f}" for c in cells)
                    + f" | {work.steps / p['iteration']:.0f} | {baseline / p['iteration']:.2f} |"
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
