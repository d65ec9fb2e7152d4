"""CPU workarounds for megatron-core 0.16.1: what it takes to run a `GPTModel` without CUDA.

megatron-core targets GPUs; a handful of places in 0.16.1 create tensors on `torch.cuda` even when
the model lives on the CPU. Each workaround below replaces exactly one of them, for this process
only, and only when the trainer runs on the CPU (rl360's tests, a laptop). On GPUs none of this is
installed and Megatron runs as shipped.

- `utils.GlobalMemoryBuffer.get_tensor` (attention-score scratch) allocates on
  `torch.cuda.current_device()`: `CpuGlobalMemoryBuffer` becomes `parallel_state`'s buffer.
- `tensor_parallel.random.CudaRNGStatesTracker` (`fork()` around attention dropout) and
  `model_parallel_cuda_manual_seed` keep CUDA generator states: `CpuRNGStatesTracker` keeps the
  same named states as CPU generator states, seeded as Megatron seeds them.
- `RotaryEmbedding.get_emb` moves `inv_freq` to `torch.cuda.current_device()`: `cpu_rotary(model)`
  makes that one instance compute where `inv_freq` is.
- `transformer.utils.get_default_causal_mask` (used when no mask is given) builds the mask on
  "cuda": not patched; the trainer always passes its own causal mask.
- `TransformerConfig` defaults (fused kernels, gradient-accumulation fusion, GPU initialisation):
  `CPU_CONFIG` turns them off and initialises on the CPU.
- Pipeline parallelism: the schedules (`pipeline_parallel.schedules`) count tokens in a
  `device="cuda"` tensor, the p2p layer (`p2p_communication`) allocates its receive buffers on
  `torch.cuda.current_device()` and calls `torch.cuda.synchronize()`, and a tied model's last stage
  moves its embedding copy `.cuda()` before the all-reduce that initialises it. `cuda_on_cpu()`
  sends those to the CPU while the trainer builds the model and runs a schedule; outside it
  nothing changes (and on a CPU-only torch, those calls raise anyway).

Not used on any device (rl360 has its own, see megatron_trainer.py): Megatron's DDP wrapper and
optimizer wrappers (`get_megatron_optimizer`, `clip_grad_norm_fp32`), which allocate `device='cuda'`
tensors unconditionally in 0.16.1.

Tested through tests/trainer/test_megatron_trainer.py and test_megatron_pipeline.py (real torchrun, gloo).
"""

from __future__ import annotations

import contextlib
import types
from typing import Any

import torch
from megatron.core.tensor_parallel.random import CudaRNGStatesTracker
from megatron.core.utils import GlobalMemoryBuffer
from torch.overrides import TorchFunctionMode

# TransformerConfig fields for a CPU run: initialise on the CPU, and no fused CUDA kernels.
CPU_CONFIG: dict[str, Any] = {
    "use_cpu_initialization": True,
    "gradient_accumulation_fusion": False,
    "bias_activation_fusion": False,
    "bias_dropout_fusion": False,
    "masked_softmax_fusion": False,
    "persist_layer_norm": False,
    "apply_rope_fusion": False,
}


def install(seed: int) -> None:
    """Put the CPU buffer and RNG tracker in place; call after `initialize_model_parallel`."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import random as mrandom

    parallel_state._GLOBAL_MEMORY_BUFFER = CpuGlobalMemoryBuffer()
    tracker = CpuRNGStatesTracker()
    # As model_parallel_cuda_manual_seed seeds it: an offset per TP rank, for dropout inside TP regions.
    tracker.add(mrandom._MODEL_PARALLEL_RNG_TRACKER_NAME,
                seed + 2718 + parallel_state.get_tensor_model_parallel_rank())  # fmt: skip
    mrandom._CUDA_RNG_STATE_TRACKER = tracker
    mrandom._CUDA_RNG_STATE_TRACKER_INITIALIZED = True


def cpu_rotary(model: Any) -> None:
    """Make `model.rotary_pos_emb` compute on the device of its `inv_freq` (the CPU) instead of CUDA."""
    rotary = getattr(model, "rotary_pos_emb", None)
    if rotary is None:
        return

    def get_emb(self: Any, max_seq_len: int, offset: int = 0) -> torch.Tensor:
        # RotaryEmbedding.get_emb of megatron-core 0.16.1, without its move to CUDA.
        freqs = self.get_freqs_non_repeated(max_seq_len, offset)
        if not self.rotary_interleaved:
            emb = torch.cat((freqs, freqs), dim=-1)
        else:
            emb = torch.stack((freqs.view(-1, 1), freqs.view(-1, 1)), dim=-1).view(freqs.shape[0], -1)
        return emb[:, None, None, :]

    rotary.get_emb = types.MethodType(get_emb, rotary)
    # RotaryEmbedding.forward is lru_cached per instance and arguments; nothing cached yet, but be sure.
    cache_clear = getattr(type(rotary).forward, "cache_clear", None)
    if cache_clear is not None:
        cache_clear()


@contextlib.contextmanager
def cuda_on_cpu():  # noqa: ANN201 — a context manager
    """While inside: tensors Megatron asks for on CUDA are made on the CPU (see the module docstring)."""
    saved = (torch.cuda.current_device, torch.cuda.synchronize, torch.Tensor.cuda)
    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.synchronize = lambda device=None: None
    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    try:
        with _CudaFactoriesOnCpu():
            yield
    finally:
        torch.cuda.current_device, torch.cuda.synchronize, torch.Tensor.cuda = saved


class _CudaFactoriesOnCpu(TorchFunctionMode):
    """`torch.zeros(..., device="cuda")` and the like, made on the CPU."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204 — torch's protocol
        kwargs = kwargs or {}
        device = kwargs.get("device")
        if device is not None and (isinstance(device, int) or torch.device(device).type == "cuda"):
            kwargs = {**kwargs, "device": "cpu"}
        return func(*args, **kwargs)


class CpuGlobalMemoryBuffer(GlobalMemoryBuffer):
    """Megatron's reusable scratch buffer, allocated on the CPU."""

    def get_tensor(self, tensor_shape, dtype, name, mem_alloc_context=None):  # noqa: ANN001 — Megatron's signature
        required = 1
        for size in tensor_shape:
            required *= size
        buffer = self.buffer.get((name, dtype))
        if buffer is None or buffer.numel() < required:
            buffer = self.buffer[(name, dtype)] = torch.empty(required, dtype=dtype, requires_grad=False)
        return buffer[:required].view(*tensor_shape)


class CpuRNGStatesTracker(CudaRNGStatesTracker):
    """Megatron's named RNG states (`fork("model-parallel-rng")`), kept as CPU generator states."""

    def add(self, name: str, seed: int) -> None:
        self._is_initialized = True
        if seed in self.seeds_:
            raise ValueError(f"seed {seed} already exists")
        if name in self.states_:
            raise ValueError(f"rng state {name} already exists")
        self.seeds_.add(seed)
        generator = torch.Generator()
        generator.manual_seed(seed)
        self.states_[name] = generator.get_state()

    @contextlib.contextmanager
    def fork(self, name: str = "model-parallel-rng"):  # noqa: ANN201 — a context manager, as Megatron's
        if name not in self.states_:
            raise ValueError(f"rng state {name} is not added")
        outside = torch.get_rng_state()
        torch.set_rng_state(self.states_[name])
        try:
            yield
        finally:
            self.states_[name] = torch.get_rng_state()
            torch.set_rng_state(outside)
