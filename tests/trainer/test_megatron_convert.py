"""Hugging Face <-> megatron-core weight mapping (megatron_convert): layouts, round trips, refusals.

Pure tensor tests (no megatron import, no processes); the real GPTModel is checked against the
same mapping in test_megatron_trainer.py.
"""

from __future__ import annotations

import pytest

from rl360cli.errors import Rl360Error
from rl360cli.trainer.megatron_convert import (
    ModelSpec,
    global_name,
    hf_sources,
    local_name,
    shard,
    to_hf,
    to_megatron,
)

import torch

LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 301, "hidden_size": 32,
         "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 4,
         "head_dim": 4, "tie_word_embeddings": True, "rms_norm_eps": 1e-5, "hidden_act": "silu",
         "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}}  # fmt: skip
QWEN2 = {**LLAMA, "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "tie_word_embeddings": False,
         "rope_parameters": None, "rope_theta": 1000000.0, "use_sliding_window": False}  # fmt: skip
# Qwen3: QK-norm, no q/k/v bias, head_dim given (not hidden / heads); Qwen3-8B is untied, 0.6B tied.
QWEN3 = {**LLAMA, "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "tie_word_embeddings": False,
         "head_dim": 8, "attention_bias": False, "use_sliding_window": False,
         "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}}  # fmt: skip
QWEN3_TIED = {**QWEN3, "tie_word_embeddings": True}
FAMILIES = {"llama": LLAMA, "qwen2": QWEN2, "qwen3": QWEN3, "qwen3-tied": QWEN3_TIED}


def _hf_state(spec: ModelSpec) -> dict:
    """Random tensors with Hugging Face's names and shapes for `spec`."""
    h, d, ffn = spec.hidden_size, spec.head_dim, spec.ffn_hidden_size
    shapes = {"model.embed_tokens.weight": (spec.vocab_size, h), "model.norm.weight": (h,),
              "lm_head.weight": (spec.vocab_size, h)}  # fmt: skip
    for i in range(spec.num_layers):
        p = f"model.layers.{i}."
        shapes.update({
            f"{p}self_attn.q_proj.weight": (spec.num_heads * d, h), f"{p}self_attn.q_proj.bias": (spec.num_heads * d,),
            f"{p}self_attn.k_proj.weight": (spec.num_kv_heads * d, h), f"{p}self_attn.k_proj.bias": (spec.num_kv_heads * d,),
            f"{p}self_attn.v_proj.weight": (spec.num_kv_heads * d, h), f"{p}self_attn.v_proj.bias": (spec.num_kv_heads * d,),
            f"{p}self_attn.o_proj.weight": (h, spec.num_heads * d), f"{p}mlp.gate_proj.weight": (ffn, h),
            f"{p}mlp.up_proj.weight": (ffn, h), f"{p}mlp.down_proj.weight": (h, ffn),
            f"{p}input_layernorm.weight": (h,), f"{p}post_attention_layernorm.weight": (h,),
            f"{p}self_attn.q_norm.weight": (d,), f"{p}self_attn.k_norm.weight": (d,),
        })  # fmt: skip
    generator = torch.Generator().manual_seed(0)
    return {name: torch.randn(*shapes[name], generator=generator) for name in spec.hf_names()}


def _partition_dim(name: str) -> int | None:
    if name.endswith(("linear_proj.weight", "linear_fc2.weight")):
        return 1
    if name.endswith(("linear_qkv.weight", "linear_qkv.bias", "linear_fc1.weight", "word_embeddings.weight",
                      "output_layer.weight")):  # fmt: skip
        return 0
    return None


def test_specs_from_hugging_face_configs():
    llama = ModelSpec.from_hf_config(LLAMA)
    assert (llama.arch, llama.num_kv_heads, llama.head_dim) == ("llama", 4, 4)
    assert llama.tie_embeddings and not llama.qkv_bias
    assert llama.rope_theta == 500000.0 and llama.norm_eps == 1e-5
    qwen = ModelSpec.from_hf_config(QWEN2)
    assert (qwen.arch, qwen.qkv_bias, qwen.tie_embeddings, qwen.rope_theta) == ("qwen2", True, False, 1000000.0)
    assert "lm_head.weight" in qwen.hf_names() and "lm_head.weight" not in llama.hf_names()
    assert qwen.hf_names()[1:3] == ["model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.q_proj.bias"]
    qwen3 = ModelSpec.from_hf_config(QWEN3)
    assert (qwen3.arch, qwen3.qk_norm, qwen3.qkv_bias, qwen3.head_dim, qwen3.tie_embeddings) == ("qwen3", True, False,
                                                                                                  8, False)  # fmt: skip
    assert "model.layers.1.self_attn.k_norm.weight" in qwen3.hf_names()
    assert "decoder.layers.1.self_attention.k_layernorm.weight" in qwen3.megatron_names()
    assert not llama.qk_norm and not qwen.qk_norm
    assert ModelSpec.from_hf_config({**QWEN3, "attention_bias": True}).qkv_bias


@pytest.mark.parametrize("config,problem", [
    ({**LLAMA, "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}, "not GPT2LMHeadModel"),
    ({**LLAMA, "rope_parameters": {"rope_type": "llama3", "rope_theta": 1.0}}, "'llama3' scaling"),
    ({**LLAMA, "hidden_act": "gelu"}, "SwiGLU"),
    ({**QWEN2, "use_sliding_window": True}, "sliding-window"),
])  # fmt: skip
def test_unsupported_models_are_refused_with_the_fix(config, problem):
    with pytest.raises(Rl360Error, match=problem) as info:
        ModelSpec.from_hf_config(config)
    assert "kind = 'torch'" in info.value.fix


def test_tensor_parallel_must_divide_the_heads():
    spec = ModelSpec.from_hf_config(LLAMA)
    spec.check_tp(4)
    with pytest.raises(Rl360Error, match="does not divide the model's 4 key/value heads"):
        spec.check_tp(8)
    assert spec.padded_vocab(1) == 301 and spec.padded_vocab(2) == 302 and spec.padded_vocab(4) == 304


def test_every_hugging_face_tensor_has_exactly_one_megatron_home():
    for config in FAMILIES.values():
        spec = ModelSpec.from_hf_config(config)
        sources = [s for name in spec.megatron_names() for s in hf_sources(name)]
        assert sorted(sources) == sorted(spec.hf_names())


@pytest.mark.parametrize("config", FAMILIES.values(), ids=FAMILIES.keys())
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_shard_and_gather_round_trip_exactly(config, tp):
    spec = ModelSpec.from_hf_config(config)
    hf = _hf_state(spec)
    back = {}
    for name in spec.megatron_names():
        full = to_megatron(spec, name, {s: hf[s] for s in hf_sources(name)}, tp=tp)
        dim = _partition_dim(name)
        if dim is not None:  # what each TP rank holds, then what all_gather + cat gives back
            parts = [shard(full, dim=dim, rank=r, tp=tp) for r in range(tp)]
            assert len({p.shape for p in parts}) == 1
            full = torch.cat(parts, dim=dim)
        back.update(to_hf(spec, name, full, tp=tp))
    assert sorted(back) == sorted(hf)
    for name in hf:
        assert torch.equal(back[name], hf[name]), name


def test_qkv_is_grouped_query_major_as_megatron_splits_it():
    spec = ModelSpec.from_hf_config(QWEN2)  # 8 query heads in 4 groups of 2, head_dim 4
    d = spec.head_dim
    q = torch.arange(8 * d, dtype=torch.float32)
    k = 1000 + torch.arange(4 * d, dtype=torch.float32)
    v = 2000 + torch.arange(4 * d, dtype=torch.float32)
    hf = {"model.layers.0.self_attn.q_proj.bias": q, "model.layers.0.self_attn.k_proj.bias": k,
          "model.layers.0.self_attn.v_proj.bias": v}  # fmt: skip
    fused = to_megatron(spec, "decoder.layers.0.self_attention.linear_qkv.bias", hf, tp=2)
    # Megatron views the local output as [groups, (q per group + 2) * d] and splits [2d, d, d].
    grouped = fused.view(4, 4 * d)
    for g in range(4):
        assert torch.equal(grouped[g, : 2 * d], q[2 * g * d : (2 * g + 2) * d])
        assert torch.equal(grouped[g, 2 * d : 3 * d], k[g * d : (g + 1) * d])
        assert torch.equal(grouped[g, 3 * d :], v[g * d : (g + 1) * d])
    # TP rank 1 of 2 holds groups 2 and 3, whole.
    assert torch.equal(shard(fused, dim=0, rank=1, tp=2), grouped[2:].reshape(-1))


def test_fc1_holds_each_ranks_gate_then_up():
    spec = ModelSpec.from_hf_config(LLAMA)
    gate = torch.arange(48, dtype=torch.float32)[:, None].expand(48, 32)
    up = -gate
    full = to_megatron(spec, "decoder.layers.1.mlp.linear_fc1.weight",
                       {"model.layers.1.mlp.gate_proj.weight": gate, "model.layers.1.mlp.up_proj.weight": up}, tp=2)
    mine = shard(full, dim=0, rank=1, tp=2)
    # Megatron's GLU chunks the local output in two: first half gate, second half up.
    assert torch.equal(mine[:24], gate[24:]) and torch.equal(mine[24:], up[24:])


def test_the_vocabulary_is_padded_with_zero_rows_and_stripped_back():
    spec = ModelSpec.from_hf_config(LLAMA)
    embed = torch.randn(301, 32)
    full = to_megatron(spec, "embedding.word_embeddings.weight", {"model.embed_tokens.weight": embed}, tp=4)
    assert full.shape == (304, 32) and torch.equal(full[301:], torch.zeros(3, 32))
    ((name, back),) = to_hf(spec, "embedding.word_embeddings.weight", full, tp=4)
    assert name == "model.embed_tokens.weight" and torch.equal(back, embed)


@pytest.mark.parametrize("config", FAMILIES.values(), ids=FAMILIES.keys())
@pytest.mark.parametrize("pp", [1, 2])
def test_pipeline_stages_own_every_weight_exactly_once(config, pp):
    spec = ModelSpec.from_hf_config(config)
    stages = [spec.stage_names(rank, pp) for rank in range(pp)]
    owned = [name for stage in stages for name in stage]
    assert sorted(owned) == sorted(spec.megatron_names())  # once each: no repeats, none missing
    assert "embedding.word_embeddings.weight" in stages[0] and "decoder.final_layernorm.weight" in stages[-1]
    assert ("output_layer.weight" in stages[-1]) == (not spec.tie_embeddings)
    assert [list(spec.stage_layers(rank, pp)) for rank in range(pp)] == ([[0, 1]] if pp == 1 else [[0], [1]])


def test_stage_names_are_local_on_each_stage():
    # Stage 1 of 2 holds layer 1, which Megatron names decoder.layers.0 there.
    assert local_name("decoder.layers.1.mlp.linear_fc1.weight", first_layer=1) == "decoder.layers.0.mlp.linear_fc1.weight"
    assert global_name("decoder.layers.0.mlp.linear_fc1.weight", first_layer=1) == "decoder.layers.1.mlp.linear_fc1.weight"
    assert global_name("decoder.final_layernorm.weight", first_layer=1) == "decoder.final_layernorm.weight"
    assert local_name("embedding.word_embeddings.weight", first_layer=3) == "embedding.word_embeddings.weight"


def test_pipeline_parallel_must_divide_the_layers():
    spec = ModelSpec.from_hf_config(QWEN3)
    spec.check_pp(2)
    with pytest.raises(Rl360Error, match="does not divide the model's 2 layers") as info:
        spec.check_pp(4)
    assert "pipeline_parallel" in info.value.fix


def test_qk_norm_weights_are_copied_as_they_are():
    spec = ModelSpec.from_hf_config(QWEN3)
    weight = torch.randn(8)
    name = "decoder.layers.0.self_attention.q_layernorm.weight"
    full = to_megatron(spec, name, {"model.layers.0.self_attn.q_norm.weight": weight}, tp=2)
    assert torch.equal(full, weight)  # one head_dim weight for every head: the same on each TP rank
    assert [n for n, _ in to_hf(spec, name, full, tp=2)] == ["model.layers.0.self_attn.q_norm.weight"]


def test_the_qwen3_8b_swap_recipes_model_fits_its_layout():
    # Qwen/Qwen3-8B's config.json (the fields that matter), as recipes/qwen3-8b-swap.toml trains it.
    config = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "attention_bias": False, "head_dim": 128,
              "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 12288, "max_position_embeddings": 40960,
              "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
              "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None, "tie_word_embeddings": False,
              "use_sliding_window": False, "vocab_size": 151936}  # fmt: skip
    spec = ModelSpec.from_hf_config(config)
    assert (spec.arch, spec.qk_norm, spec.qkv_bias, spec.tie_embeddings, spec.head_dim) == ("qwen3", True, False,
                                                                                             False, 128)  # fmt: skip
    spec.check_tp(4)  # the recipe's tensor_parallel
    spec.check_pp(2)
    spec.check_pp(4)
    with pytest.raises(Rl360Error, match="pipeline_parallel = 8 does not divide the model's 36 layers"):
        spec.check_pp(8)
    assert spec.padded_vocab(4) == 151936
    assert len(spec.hf_names()) == 3 + 36 * 11  # embed, norm, lm_head; per layer q/k/v/o, q/k norm, 3 MLP, 2 norms
