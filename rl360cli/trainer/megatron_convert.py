"""Weights between a Hugging Face Llama/Qwen2 model and a megatron-core `GPTModel`, both ways.

    spec = ModelSpec.from_hf_config(json.loads((model_dir / "config.json").read_text()))
    full = to_megatron(spec, "decoder.layers.0.self_attention.linear_qkv.weight", hf_tensor, tp=2)
    mine = shard(full, dim=0, rank=tp_rank, tp=2)                   # what this TP rank holds
    for hf_name, tensor in to_hf(spec, megatron_name, gathered, tp=2): ...

A Megatron parameter's *full* tensor is its TP shards concatenated along its partition dimension
(rows of column-parallel layers and of the vocabulary, columns of row-parallel layers). Where a
fused Megatron tensor holds several Hugging Face tensors, the layout follows megatron-core 0.16:
- `linear_qkv` (weight and Qwen2's bias): per query group g, the group's query heads, then its key
  head, then its value head, [ng * (nq / ng + 2) * head_dim, hidden]. Group-major, so TP rank r's
  shard is groups r * ng / tp ... and the full tensor does not depend on tp.
- `linear_fc1` (SwiGLU): each TP rank's shard is [its gate rows; its up rows] (Megatron's GLU
  chunks the local output in two), so the full tensor interleaves per rank and depends on tp.
- The vocabulary is padded to a multiple of tp with zero rows (Megatron's vocab-parallel
  embedding needs equal shards); the trainer masks the padded logits to -inf and `to_hf` strips them.

Pure tensor code, no megatron import: tested directly by tests/trainer/test_megatron_convert.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from rl360cli.errors import Rl360Error

SUPPORTED = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2"}


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelSpec:
    """The shape of a Llama-style causal LM, read from its Hugging Face config."""

    arch: str
    # "llama" or "qwen2".
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_hidden_size: int
    vocab_size: int
    tie_embeddings: bool
    qkv_bias: bool
    # Qwen2 (and Llama with attention_bias) has biases on q/k/v.
    rope_theta: float
    norm_eps: float
    max_position_embeddings: int

    @classmethod
    def from_hf_config(cls, config: dict[str, Any]) -> ModelSpec:
        archs = config.get("architectures") or [None]
        arch = SUPPORTED.get(archs[0]) or {"llama": "llama", "qwen2": "qwen2"}.get(config.get("model_type"))
        if arch is None:
            what = archs[0] or config.get("model_type")
            raise Rl360Error(f"the megatron trainer converts Llama and Qwen2 models, not {what}",
                             fix="use [trainer] kind = 'torch' for this model")  # fmt: skip
        if config.get("mlp_bias") or config.get("hidden_act", "silu") != "silu":
            raise Rl360Error("the megatron trainer supports SwiGLU MLPs without bias only",
                             fix="use [trainer] kind = 'torch' for this model")  # fmt: skip
        if config.get("use_sliding_window"):
            raise Rl360Error("the megatron trainer does not implement sliding-window attention",
                             fix="use [trainer] kind = 'torch' for this model")  # fmt: skip
        rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise Rl360Error(f"the megatron trainer supports plain RoPE only (this model uses {rope_type!r} scaling)",
                             fix="use [trainer] kind = 'torch' for this model")  # fmt: skip
        num_heads = config["num_attention_heads"]
        return cls(
            arch=arch,
            num_layers=config["num_hidden_layers"],
            hidden_size=config["hidden_size"],
            num_heads=num_heads,
            num_kv_heads=config.get("num_key_value_heads") or num_heads,
            head_dim=config.get("head_dim") or config["hidden_size"] // num_heads,
            ffn_hidden_size=config["intermediate_size"],
            vocab_size=config["vocab_size"],
            tie_embeddings=bool(config.get("tie_word_embeddings", False)),
            qkv_bias=arch == "qwen2" or bool(config.get("attention_bias")),
            rope_theta=float(rope.get("rope_theta", config.get("rope_theta", 10000.0))),
            norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=config.get("max_position_embeddings", 4096),
        )

    def check_tp(self, tp: int) -> None:
        """A one-line error unless heads, KV heads and the MLP split evenly over `tp` ranks."""
        for what, count in (("attention heads", self.num_heads), ("key/value heads", self.num_kv_heads),
                            ("MLP width", self.ffn_hidden_size)):  # fmt: skip
            if count % tp:
                raise Rl360Error(f"tensor_parallel = {tp} does not divide the model's {count} {what}",
                                 fix="set [trainer] tensor_parallel to a divisor of it")  # fmt: skip

    def padded_vocab(self, tp: int) -> int:
        return -(-self.vocab_size // tp) * tp

    def hf_names(self) -> list[str]:
        """The names Hugging Face's `named_parameters()` gives, in its order."""
        names = ["model.embed_tokens.weight"]
        for i in range(self.num_layers):
            p = f"model.layers.{i}."
            for x in "qkv":
                names += [f"{p}self_attn.{x}_proj.weight", *([f"{p}self_attn.{x}_proj.bias"] if self.qkv_bias else [])]
            names += [f"{p}self_attn.o_proj.weight", *(f"{p}mlp.{x}_proj.weight" for x in ("gate", "up", "down")),
                      f"{p}input_layernorm.weight", f"{p}post_attention_layernorm.weight"]  # fmt: skip
        names.append("model.norm.weight")
        if not self.tie_embeddings:
            names.append("lm_head.weight")
        return names

    def megatron_names(self) -> list[str]:
        """The parameter names of the matching `GPTModel` (pipeline_parallel = 1)."""
        names = ["embedding.word_embeddings.weight"]
        for i in range(self.num_layers):
            p = f"decoder.layers.{i}."
            names += [f"{p}input_layernorm.weight", f"{p}self_attention.linear_qkv.weight"]
            if self.qkv_bias:
                names.append(f"{p}self_attention.linear_qkv.bias")
            names += [f"{p}self_attention.linear_proj.weight", f"{p}pre_mlp_layernorm.weight",
                      f"{p}mlp.linear_fc1.weight", f"{p}mlp.linear_fc2.weight"]  # fmt: skip
        names.append("decoder.final_layernorm.weight")
        if not self.tie_embeddings:
            names.append("output_layer.weight")
        return names


# Megatron name (per layer) -> Hugging Face names it holds.
_LAYER_MAP = {
    "input_layernorm.weight": ("input_layernorm.weight",),
    "self_attention.linear_qkv.weight": tuple(f"self_attn.{x}_proj.weight" for x in "qkv"),
    "self_attention.linear_qkv.bias": tuple(f"self_attn.{x}_proj.bias" for x in "qkv"),
    "self_attention.linear_proj.weight": ("self_attn.o_proj.weight",),
    "pre_mlp_layernorm.weight": ("post_attention_layernorm.weight",),
    "mlp.linear_fc1.weight": ("mlp.gate_proj.weight", "mlp.up_proj.weight"),
    "mlp.linear_fc2.weight": ("mlp.down_proj.weight",),
}
_TOP_MAP = {
    "embedding.word_embeddings.weight": ("model.embed_tokens.weight",),
    "decoder.final_layernorm.weight": ("model.norm.weight",),
    "output_layer.weight": ("lm_head.weight",),
}


def hf_sources(name: str) -> tuple[str, ...]:
    """The Hugging Face tensors that Megatron parameter `name` is made of."""
    if name in _TOP_MAP:
        return _TOP_MAP[name]
    if name.startswith("decoder.layers."):
        layer, _, rest = name.removeprefix("decoder.layers.").partition(".")
        if rest in _LAYER_MAP:
            return tuple(f"model.layers.{layer}.{x}" for x in _LAYER_MAP[rest])
    raise KeyError(f"no Hugging Face counterpart for Megatron parameter {name!r}")


def to_megatron(spec: ModelSpec, name: str, hf: dict[str, Any], *, tp: int) -> Any:
    """The full (unsharded, TP-concatenated) Megatron tensor `name` from its Hugging Face tensors `hf`."""
    import torch

    parts = [hf[source] for source in hf_sources(name)]
    if name.endswith("linear_qkv.weight") or name.endswith("linear_qkv.bias"):
        return _fuse_qkv(spec, *parts)
    if name.endswith("linear_fc1.weight"):
        gate, up = (p.chunk(tp, dim=0) for p in parts)
        return torch.cat([torch.cat([g, u]) for g, u in zip(gate, up)])
    (tensor,) = parts
    if name in ("embedding.word_embeddings.weight", "output_layer.weight"):
        pad = spec.padded_vocab(tp) - spec.vocab_size
        if pad:
            tensor = torch.cat([tensor, tensor.new_zeros(pad, *tensor.shape[1:])])
    return tensor


def to_hf(spec: ModelSpec, name: str, full: Any, *, tp: int) -> Iterator[tuple[str, Any]]:
    """The Hugging Face (name, tensor) pairs held in the full Megatron tensor `name`."""
    sources = hf_sources(name)
    if name.endswith("linear_qkv.weight") or name.endswith("linear_qkv.bias"):
        yield from zip(sources, _split_qkv(spec, full))
    elif name.endswith("linear_fc1.weight"):
        halves = [rank.chunk(2, dim=0) for rank in full.chunk(tp, dim=0)]
        import torch

        yield sources[0], torch.cat([g for g, _ in halves])
        yield sources[1], torch.cat([u for _, u in halves])
    elif name in ("embedding.word_embeddings.weight", "output_layer.weight"):
        yield sources[0], full[: spec.vocab_size]
    else:
        yield sources[0], full


def shard(full: Any, *, dim: int, rank: int, tp: int) -> Any:
    """TP rank `rank`'s part of `full` along `dim` (a copy, contiguous)."""
    return full.chunk(tp, dim=dim)[rank].clone().contiguous()


def _fuse_qkv(spec: ModelSpec, q: Any, k: Any, v: Any) -> Any:
    import torch

    groups, per_group, d = spec.num_kv_heads, spec.num_heads // spec.num_kv_heads, spec.head_dim
    rest = q.shape[1:]
    q = q.reshape(groups, per_group * d, *rest)
    k = k.reshape(groups, d, *rest)
    v = v.reshape(groups, d, *rest)
    return torch.cat([q, k, v], dim=1).reshape(groups * (per_group + 2) * d, *rest)


def _split_qkv(spec: ModelSpec, fused: Any) -> tuple[Any, Any, Any]:
    groups, per_group, d = spec.num_kv_heads, spec.num_heads // spec.num_kv_heads, spec.head_dim
    rest = fused.shape[1:]
    grouped = fused.reshape(groups, (per_group + 2) * d, *rest)
    q, k, v = grouped.split([per_group * d, d, d], dim=1)
    return (q.reshape(groups * per_group * d, *rest).contiguous(), k.reshape(groups * d, *rest).contiguous(),
            v.reshape(groups * d, *rest).contiguous())  # fmt: skip
