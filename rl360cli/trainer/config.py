"""Configuration of the policy model, the trainer and the weight broadcast to the engines."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from rl360cli.configload import check_at_least, check_integer, check_non_negative, check_positive, check_range


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelConfig:
    # `tiny`: a small Llama-style model built from scratch with a tokenizer trained on the task set;
    # `huggingface`: a saved Hugging Face model folder (`path`); `gguf-package`: a GGUF file shipped
    # inside a pip package (`package`, `gguf_file`), dequantised once and cached as a Hugging Face folder.
    kind: Literal["tiny", "huggingface", "gguf-package"] = "tiny"
    path: str | None = None
    package: str | None = None
    gguf_file: str | None = None
    # tiny only
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    # Byte-level BPE vocabulary the tiny model's tokenizer is trained up to (fewer when merges run out).
    vocab_size: int = 512
    # Supervised warm-up on synthetic examples before RL (tiny models start from nothing).
    warmup_steps: int = 0
    warmup_lr: float = 3e-3
    # Conversations per warm-up step.
    warmup_batch_size: int = 32
    # The warm-up's seed, when the policy should not change with `[run] seed` (a fixed base model
    # that runs of several seeds start from); unset: the run's seed.
    warmup_seed: int | None = None
    dtype: Literal["float32", "bfloat16"] = "float32"

    def __post_init__(self) -> None:
        if self.kind == "huggingface" and not self.path:
            raise ValueError("kind 'huggingface' needs `path` (a saved model folder)")
        if self.kind == "gguf-package" and not (self.package and self.gguf_file):
            raise ValueError("kind 'gguf-package' needs `package` and `gguf_file`")
        check_at_least(self, 1, "hidden_size", "num_layers", "num_heads", "warmup_batch_size")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size ({self.hidden_size}) must be a multiple of num_heads ({self.num_heads})")
        check_non_negative(self, "warmup_steps")
        check_at_least(self, 262, "vocab_size", fix="a token per byte plus 6 special ones")
        check_positive(self, "warmup_lr")


@dataclass(frozen=True, kw_only=True, slots=True)
class SimulatedTrainerConfig:
    """`[trainer.simulated]`: the stand-in trainer of `kind = "simulated"` (rl360cli/trainer/simulated.py)."""

    # What one training step takes, plus this much per thousand loss tokens of its batch.
    step_s: float = 5.0
    step_s_per_1k_loss_tokens: float = 0.0

    def __post_init__(self) -> None:
        check_non_negative(self, "step_s", "step_s_per_1k_loss_tokens")


@dataclass(frozen=True, kw_only=True, slots=True)
class LoraConfig:
    """`[trainer.lora]`: train a low-rank adapter instead of every weight (the torch trainer; docs/trainer.md,
    "LoRA"). Each targeted linear layer's weight W stays frozen; the layer computes x W^T + (alpha / rank) x A^T B^T
    with A [rank, in] and B [out, rank] trained (B starts at zero, so policy v0 is unchanged). The engines get
    each targeted weight merged, W + (alpha / rank) B A, and nothing else."""

    # The adapter's rank r: A and B hold r x (in + out) numbers per targeted layer.
    rank: int
    # The adapter's scale is alpha / rank (peft's `lora_alpha`).
    alpha: float
    # Linear layers to adapt, by the last part of their module name (`q_proj` adapts every layer's
    # `model.layers.N.self_attn.q_proj`) or a longer suffix of it; each must name a linear layer of the policy,
    # checked when the policy is prepared (`rl360 serve`) and when the trainer loads it.
    target_modules: tuple[str, ...]

    def __post_init__(self) -> None:
        check_integer(self, "rank")
        check_at_least(self, 1, "rank")
        check_positive(self, "alpha", fix="the adapter's scale is alpha / rank")
        if not self.target_modules or not all(isinstance(m, str) and m.strip() for m in self.target_modules):
            raise ValueError(f"target_modules must name at least one linear layer (got {list(self.target_modules)}); "
                             'for example target_modules = ["q_proj", "v_proj"]')
        if len(set(self.target_modules)) != len(self.target_modules):
            raise ValueError(f"target_modules names a layer twice (got {list(self.target_modules)})")


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainerConfig:
    # `torch`: any Hugging Face causal LM on CPU or one GPU; `megatron`: megatron-core with TP/PP/DP;
    # `simulated`: a stand-in that takes each batch in a set time and only bumps the policy version.
    kind: Literal["torch", "megatron", "simulated"] = "torch"
    lr: float = 1e-3
    # The learning rate over training steps: `lr_warmup_steps` steps rising linearly to `lr` (Adam's
    # first steps move every weight by about lr whatever its gradient, so a fresh optimizer at full
    # lr knocks a policy back before it climbs), then `constant`, or `cosine` down to
    # lr x `lr_min_ratio` at step `lr_decay_steps` (and that after it). A ratio, not a rate, so that
    # `--set trainer.lr=...` moves the whole schedule.
    lr_schedule: Literal["constant", "cosine"] = "constant"
    lr_warmup_steps: int = 0
    lr_decay_steps: int = 0
    lr_min_ratio: float = 0.0
    weight_decay: float = 0.0
    betas: tuple[float, ...] = (0.9, 0.999)
    grad_clip: float = 1.0
    # Micro-batches are cut so that each holds at most this many tokens (padding included).
    micro_batch_tokens: int = 8192
    # Optimizer passes over each batch (PPO epochs).
    num_epochs: int = 1
    # torch only: run each distinct prompt of a micro-batch once and every sample after its keys and
    # values (a group's samples share their prompt; rl360cli/trainer/shared_prompts.py). false: the
    # plain forward pass, for a model whose cache cannot be gathered by rows.
    share_prompts: bool = True
    # torch only: the number format of the forward and backward passes. `fp32`: float32 throughout (what a CPU
    # needs). `bf16`: the forward under `torch.autocast(dtype=torch.bfloat16)` (matrix products in bf16, the
    # backward in the dtypes the forward chose), the weights, gradients and AdamW state kept in float32, and
    # on CUDA what autocast leaves in float32 on TF32 tensor cores. Its logprobs of the engine's tokens
    # differ from float32 ones by bf16 rounding (docs/trainer.md, "Precision").
    precision: Literal["fp32", "bf16"] = "fp32"
    checkpoint_every: int = 10
    # torch only: train a LoRA adapter of these layers, the rest frozen (unset: every weight is trained).
    lora: LoraConfig | None = None
    # megatron only
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    # Weight broadcast to the engines after each step.
    sync_backend: Literal["gloo", "nccl"] = "gloo"
    sync_bucket_mb: int = 64
    simulated: SimulatedTrainerConfig = field(default_factory=SimulatedTrainerConfig)

    def __post_init__(self) -> None:
        check_positive(self, "lr")
        check_non_negative(self, "lr_warmup_steps")
        check_range(self, 0, 1, "lr_min_ratio")
        if self.lr_schedule == "cosine" and self.lr_decay_steps <= self.lr_warmup_steps:
            raise ValueError(f"lr_schedule 'cosine' needs lr_decay_steps > lr_warmup_steps "
                             f"({self.lr_warmup_steps}) (got {self.lr_decay_steps})")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"betas must be two numbers in [0, 1) (got {list(self.betas)})")
        check_non_negative(self, "grad_clip", fix="0 turns clipping off")
        if self.precision != "fp32" and self.kind == "megatron":
            raise ValueError(f"precision {self.precision!r} is the torch trainer's; the megatron trainer runs in "
                             "float32 (set precision = \"fp32\" or kind = \"torch\")")
        if self.lora is not None and self.kind == "megatron":
            raise ValueError("lora is the torch trainer's; the megatron trainer trains every weight "
                             "(remove [trainer.lora] or set kind = \"torch\")")
        check_at_least(self, 1, "micro_batch_tokens", "num_epochs", "checkpoint_every", "tensor_parallel",
                       "pipeline_parallel", "sync_bucket_mb")

    def lr_at(self, step: int) -> float:
        """The learning rate of training step `step` (0 for the first)."""
        if step < self.lr_warmup_steps:
            return self.lr * (step + 1) / (self.lr_warmup_steps + 1)
        if self.lr_schedule == "constant":
            return self.lr
        progress = min(1.0, (step - self.lr_warmup_steps) / (self.lr_decay_steps - self.lr_warmup_steps))
        lowest = self.lr * self.lr_min_ratio
        return lowest + (self.lr - lowest) * 0.5 * (1 + math.cos(math.pi * progress))
