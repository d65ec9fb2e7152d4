"""Weights between a Hugging Face Llama/Qwen2/Qwen3 model and a megatron-core `GPTModel`, both ways.

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
- Qwen3's QK-norm (`self_attn.q_norm` / `k_norm`, one RMSNorm weight of head_dim shared by every
  head, applied before RoPE) is Megatron's `q_layernorm` / `k_layernorm` (`qk_layernorm=True`), the
  same weight on every TP rank.
- Pipeline parallel: stage s of pp holds layers [s * L / pp, (s + 1) * L / pp) under *local* names
  (`decoder.layers.0...` on every stage); `stage_names` lists a stage's global names and
  `local_name` / `global_name` convert. A tied model's last stage (s > 0) also holds a copy of the
  embedding as `output_layer.weight`, kept equal by the trainer; it has no Hugging Face name of its own.

Pure tensor code, no megatron import: tested directly by tests/trainer/test_megatron_convert.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from rl360cli.errors import Rl360Error

SUPPORTED = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3"}
_MODEL_TYPES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelSpec:
    """The shape of a Llama-style causal LM, read from its Hugging Face config."""

    arch: str
    # "llama", "qwen2" or "qwen3".
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_hidden_size: int
    vocab_size: int
    tie_embeddings: bool
    qkv_bias: bool
    # Qwen2 (and Llama or Qwen3 with attention_bias) has biases on q/k/v.
    qk_norm: bool
    # Qwen3: an RMSNorm over each query and key head (q_norm / k_norm) before RoPE.
    rope_theta: float
    norm_eps: float
    max_position_embeddings: int

    @classmethod
    def from_hf_config(cls, config: dict[str, Any]) -> ModelSpec:
        archs = config.get("architectures") or [None]
        arch = SUPPORTED.get(archs[0]) or _MODEL_TYPES.get(config.get("model_type"))
        if arch is None:
            what = archs[0] or config.get("model_type")
            raise Rl360Error(f"the megatron trainer converts Llama, Qwen2 and Qwen3 models, not {what}",
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
            qk_norm=arch == "qwen3",
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

    def check_pp(self, pp: int) -> None:
        """A one-line error unless the layers split evenly into `pp` pipeline stages."""
        if self.num_layers % pp:
            raise Rl360Error(f"pipeline_parallel = {pp} does not divide the model's {self.num_layers} layers",
                             fix="set [trainer] pipeline_parallel to a divisor of the layer count")  # fmt: skip

    def stage_layers(self, pp_rank: int, pp: int) -> range:
        """The global layer numbers pipeline stage `pp_rank` of `pp` holds (Megatron's even split)."""
        per_stage = self.num_layers // pp
        return range(pp_rank * per_stage, (pp_rank + 1) * per_stage)

    def stage_names(self, pp_rank: int, pp: int) -> list[str]:
        """The global Megatron names (as `megatron_names`) of the weights stage `pp_rank` owns.

        Each name is owned by exactly one stage; a tied model's copy of the embedding on the last
        stage is not in this list (see the module docstring).
        """
        layers = self.stage_layers(pp_rank, pp)
        owned = []
        for name in self.megatron_names():
            layer = _layer_of(name)
            if layer is not None:
                if layer in layers:
                    owned.append(name)
            elif name.startswith("embedding."):
                if pp_rank == 0:
                    owned.append(name)
            elif pp_rank == pp - 1:  # final norm, untied output layer
                owned.append(name)
        return owned

    def padded_vocab(self, tp: int) -> int:
        return -(-self.vocab_size // tp) * tp

    def hf_names(self) -> list[str]:
        """The names Hugging Face's `named_parameters()` gives, in its order."""
        names = ["model.embed_tokens.weight"]
        for i in range(self.num_layers):
            p = f"model.layers.{i}."
            for x in "qkv":
                names += [f"{p}self_attn.{x}_proj.weight", *([f"{p}self_attn.{x}_proj.bias"] if self.qkv_bias else [])]
            names.append(f"{p}self_attn.o_proj.weight")
            if self.qk_norm:
                names += [f"{p}self_attn.q_norm.weight", f"{p}self_attn.k_norm.weight"]
            names += [*(f"{p}mlp.{x}_proj.weight" for x in ("gate", "up", "down")),
                      f"{p}input_layernorm.weight", f"{p}post_attention_layernorm.weight"]  # fmt: skip
        names.append("model.norm.weight")
        if not self.tie_embeddings:
            names.append("lm_head.weight")
        return names

    def megatron_names(self) -> list[str]:
        """The parameter names of the matching `GPTModel` at pipeline_parallel = 1: the global names."""
        names = ["embedding.word_embeddings.weight"]
        for i in range(self.num_layers):
            p = f"decoder.layers.{i}."
            names += [f"{p}input_layernorm.weight", f"{p}self_attention.linear_qkv.weight"]
            if self.qkv_bias:
                names.append(f"{p}self_attention.linear_qkv.bias")
            if self.qk_norm:
                names += [f"{p}self_attention.q_layernorm.weight", f"{p}self_attention.k_layernorm.weight"]
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
    "self_attention.q_layernorm.weight": ("self_attn.q_norm.weight",),
    "self_attention.k_layernorm.weight": ("self_attn.k_norm.weight",),
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


def global_name(local: str, *, first_layer: int) -> str:
    """A stage's local Megatron name (`decoder.layers.0...` counts from the stage's first layer) made global."""
    layer = _layer_of(local)
    if layer is None:
        return local
    return f"decoder.layers.{layer + first_layer}.{local.removeprefix('decoder.layers.').partition('.')[2]}"


def local_name(name: str, *, first_layer: int) -> str:
    """The inverse of `global_name`: how the stage whose first layer is `first_layer` names `name`."""
    layer = _layer_of(name)
    if layer is None:
        return name
    return f"decoder.layers.{layer - first_layer}.{name.removeprefix('decoder.layers.').partition('.')[2]}"


def _layer_of(name: str) -> int | None:
    if not name.startswith("decoder.layers."):
        return None
    return int(name.removeprefix("decoder.layers.").partition(".")[0])


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
