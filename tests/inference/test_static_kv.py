"""The engine's static KV cache (`static_kv=True`, `--static-kv`): the decode step a CUDA graph captures on a
GPU, run uncaptured on the CPU, gives the dynamic cache's tokens, token for token under greedy sampling,
and its logprobs to float32 rounding, across batch buckets, joins, the prefix cache and weight loads.
A stand-in for the graphs (each step bound to the buffers it was captured on, as a CUDA graph is) checks
that captured steps are replayed on the right buffers and captured again when the buffers grow; another
traces each step whole (torch.compile, fullgraph), so a step that would do host work on a tensor's value,
which a CUDA graph capture refuses, fails here without a GPU."""

from __future__ import annotations

import inspect
import json
import time
import urllib.request

import pytest
import torch
from transformers import DynamicCache

from rl360cli.inference.engine import Engine
from rl360cli.inference.kv import BatchKV
from rl360cli.inference.protocol import parse_generate
from rl360cli.inference.static_kv import StaticKV, decode_buckets
from rl360cli.inference.weights import read_model_folder

LOGPROB_TOLERANCE = 1e-4  # float32: the same arithmetic over a padded, masked attention window


@pytest.fixture(scope="module")
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # this thread's and the engine's pools on 2 cores
    yield
    torch.set_num_threads(before)


def item(prompt, **params):
    return parse_generate({"input_ids": prompt, "sampling_params": params, "return_logprob": True})[0][0]


def _logprobs(answer) -> torch.Tensor:
    return torch.tensor([entry[0] for entry in answer["meta_info"]["output_token_logprobs"]])


def _waves(engine: Engine, perturbed: list) -> list[dict]:
    """Every answer of a fixed script: 6 prompts of 1-30 tokens with lengths that make the batch shrink
    through the buckets (8 -> 4 -> 2 -> 1), 3 more joining while it runs, prompts continuing earlier
    answers (prefix cache hits, so rows with padding inside) beside fresh ones, a weight load, again."""
    greedy = {"temperature": 0, "ignore_eos": True}
    prompts = [[5 + i, 6, 7 + i, 8, 9, 10][: 1 + i] for i in range(5)] + [[20 + i % 7 for i in range(30)]]
    first = [engine.submit(item(p, max_new_tokens=6 + 9 * i, **greedy)) for i, p in enumerate(prompts)]
    time.sleep(0.05)  # these join a batch that is decoding
    joining = [engine.submit(item([40 + i, 41], max_new_tokens=20, **greedy)) for i in range(3)]
    answers = [f.result(timeout=120) for f in first + joining]
    follow = [prompts[i] + answers[i]["output_ids"] + [60, 61] for i in (1, 4)] + [[70, 71, 72]]
    answers += [f.result(timeout=120) for f in [engine.submit(item(p, max_new_tokens=12, **greedy))
                                                  for p in follow]]
    engine.call(lambda: engine.load_weights(perturbed)).result(timeout=60)
    answers += [f.result(timeout=120) for f in [engine.submit(item(p, max_new_tokens=10 + 4 * i, **greedy))
                                                  for i, p in enumerate(prompts[:4] + follow[:1])]]
    return answers


@pytest.fixture(scope="module")
def perturbed(tiny_model):
    generator = torch.Generator().manual_seed(1)
    return [(name, t + 0.05 * torch.randn(t.shape, generator=generator)) for name, t in read_model_folder(tiny_model)]


def test_static_decode_equals_the_dynamic_cache_token_for_token(tiny_model, perturbed, one_thread):
    results = {}
    for static in (False, True):
        engine = Engine.load(tiny_model, max_batch_size=8, max_wait_ms=20, static_kv=static)
        engine.start()
        try:
            results[static] = (_waves(engine, perturbed), engine.decode_info(), engine.prefix_cache.hits)
        finally:
            engine.stop()
    (dynamic, _, dynamic_hits), (static, info, static_hits) = results[False], results[True]
    assert len(static) == len(dynamic) == 17
    for a, b in zip(dynamic, static):
        assert b["output_ids"] == a["output_ids"]
        assert torch.allclose(_logprobs(b), _logprobs(a), atol=LOGPROB_TOLERANCE, rtol=0)
    assert static_hits == dynamic_hits >= 2  # the follow-up prompts continued from cached prefixes
    assert info["static_kv"] and not info["cuda_graphs"] and info["slots"] == 8 and info["capacity"] == 128


def test_release_and_flush_keep_the_static_engine_serving(tiny_model, one_thread):
    engine = Engine.load(tiny_model, max_batch_size=4, max_wait_ms=5, static_kv=True)
    engine.start()
    try:
        def ask():
            return engine.submit(item([9, 8, 7], max_new_tokens=16, temperature=0, ignore_eos=True))

        before = ask().result(timeout=60)
        assert engine.decode_info()["slots"] == 1
        engine.call(lambda: engine.release_memory(("kv_cache", "weights"))).result(timeout=30)
        assert engine.decode_info()["slots"] == 0  # the buffers went with the release
        engine.call(lambda: engine.resume_memory(("kv_cache", "weights"))).result(timeout=30)
        assert ask().result(timeout=60)["output_ids"] == before["output_ids"]
        assert engine.call(engine.flush_cache).result(timeout=30)
        assert ask().result(timeout=60)["output_ids"] == before["output_ids"]
    finally:
        engine.stop()


def test_cuda_graphs_need_a_cuda_device(tiny_model):
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device"):
        Engine.load(tiny_model, static_kv=True, cuda_graphs=True)


class BoundGraphs:
    """A stand-in for `CudaGraphs` on the CPU: a captured step is the closure bound at capture time, and a
    replay recomputes it into the captured output tensor, as a CUDA graph rewrites its output's memory.
    A step replayed after its buffers were replaced would compute on the old ones, as a real graph would."""

    def __init__(self):
        self.captured = 0
        self.resets = 0

    def capture(self, step):
        self.captured += 1
        return BoundStep(step)

    def reset(self):
        self.resets += 1


class BoundStep:
    def __init__(self, step):
        self.step = step
        self.output = step()

    def replay(self):
        self.output.copy_(self.step())


def _cache_kw(model) -> str:
    # transformers 5.2x names it `cache`; earlier 5.x `past_key_values`
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _prefilled(model, prompts: list[list[int]]) -> tuple[BatchKV, torch.Tensor]:
    """A left-padded prefill of `prompts` as the engine makes it: its BatchKV and last logits."""
    from rl360cli.inference.kv import left_padded

    ids, mask, positions = left_padded(prompts, 0)
    cache = DynamicCache(config=model.config)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
                   **{_cache_kw(model): cache}).logits
    return BatchKV(cache=cache, mask=mask), logits[:, -1]


def test_captured_steps_replay_on_their_buffers_and_are_captured_again_when_they_grow(tiny_model, one_thread):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()

    def forward(ids, positions, mask, cache):
        return model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
                     **{_cache_kw(model): cache}).logits

    graphs = BoundGraphs()
    captured = StaticKV(forward, buckets=decode_buckets(4), max_length=1024, pad_id=0, graphs=graphs)
    eager = StaticKV(forward, buckets=decode_buckets(4), max_length=1024, pad_id=0)
    with torch.no_grad():
        kv, logits = _prefilled(model, [[3, 4, 5], [6]])
        captured.adopt(kv)
        kv, _ = _prefilled(model, [[3, 4, 5], [6]])
        eager.adopt(kv)
        tokens = logits.argmax(-1).tolist()
        for step in range(70):  # past the first capacity (64 columns): the buffers grow once
            if step == 10:  # a third row joins: bucket 2 -> 4
                for static in (captured, eager):
                    static.join(_prefilled(model, [[7, 8, 9, 10]])[0])
                tokens.append(3)
            if step == 30:  # the first row leaves: bucket 4 -> 2, the others move to the front
                for static in (captured, eager):
                    static.select([1, 2])
                tokens = tokens[1:]
            a, b = captured.decode(tokens), eager.decode(tokens)
            assert torch.allclose(a, b, atol=1e-5, rtol=0), step
            tokens = a.argmax(-1).tolist()
    # Bucket 2 captured; the join grows the slots (2 -> 4: the graphs go) and bucket 4 is captured; the
    # leave goes back to bucket 2, captured again on the new buffers; the growth to 128 columns drops
    # them once more and bucket 2 is captured a third time.
    assert captured.lengths == eager.lengths == [71, 64]
    assert (graphs.captured, graphs.resets, captured.captures) == (4, 2, 4)
    assert captured.capacity == 128 and captured.slots == 4


class TracedGraphs:
    """A stand-in for `CudaGraphs` that traces each step whole (`torch.compile(fullgraph=True)` with the
    eager backend): it fails where the step does host work on a tensor's value (`.item()`, a branch on
    data), which a CUDA graph capture would refuse too."""

    def capture(self, step):
        return BoundStep(torch.compile(step, backend="eager", fullgraph=True))

    def reset(self):
        pass


def test_the_decode_step_of_a_qwen3_model_traces_as_one_graph(one_thread):
    """The GPU check's architecture (QK-norm, GQA, tied embeddings), tiny: every bucket's step traces in
    one piece and computes what the uncaptured step does."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=2, head_dim=16, intermediate_size=128,
                                         vocab_size=512, max_position_embeddings=1024)).eval()

    def forward(ids, positions, mask, cache):
        return model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
                     **{_cache_kw(model): cache}).logits

    traced = StaticKV(forward, buckets=decode_buckets(4), max_length=1024, pad_id=0, graphs=TracedGraphs())
    eager = StaticKV(forward, buckets=decode_buckets(4), max_length=1024, pad_id=0)
    with torch.no_grad():
        for static in (traced, eager):
            static.adopt(_prefilled(model, [[1, 2, 3], [4]])[0])
        tokens = [5, 6]
        for step in range(4):
            if step == 2:
                for static in (traced, eager):
                    static.join(_prefilled(model, [[7, 8]])[0])
                tokens.append(9)
            a, b = traced.decode(tokens), eager.decode(tokens)
            assert torch.allclose(a, b, atol=1e-5, rtol=0)
            tokens = a.argmax(-1).tolist()
    assert traced.capture_error is None and traced.captures == 2  # bucket 2, then 4 (after the buffers grew)


def test_join_select_and_row_layers_keep_each_rows_tokens_as_the_dynamic_cache_does():
    """Rows with left padding and with padding inside (a prefix-cache continuation), joined, reordered
    and read back: each row's keys and values are the dynamic cache's real columns, in order."""
    torch.manual_seed(0)

    def batch(mask_rows):
        mask = torch.tensor(mask_rows)
        cache = DynamicCache()
        for layer in range(2):
            cache.update(torch.randn(len(mask_rows), 2, mask.shape[1], 4),
                         torch.randn(len(mask_rows), 2, mask.shape[1], 4), layer)
        return BatchKV(cache=cache, mask=mask)

    first = batch([[0, 0, 1, 1, 1], [1, 1, 0, 1, 1], [0, 0, 0, 0, 1]])
    second = batch([[1, 1, 1, 1, 1, 1, 1], [0, 1, 0, 0, 1, 1, 1]])
    expected = [first.row_layers(i) for i in range(3)] + [second.row_layers(i) for i in range(2)]
    static = StaticKV(lambda *a: None, buckets=decode_buckets(8), max_length=32, pad_id=0)
    static.adopt(first)
    static.join(second)
    assert static.lengths == [3, 4, 1, 7, 4] and static.slots == 8

    def same(got, want):
        return all(torch.equal(a, c) and torch.equal(b, d) for (a, b), (c, d) in zip(got, want, strict=True))

    assert all(same(static.row_layers(i), expected[i]) for i in range(5))
    static.select([4, 1, 3])
    assert static.lengths == [4, 4, 7]
    assert all(same(static.row_layers(i), expected[j]) for i, j in enumerate([4, 1, 3]))


def test_the_server_decodes_over_the_static_cache_with_the_flag(tiny_model, start_engine):
    (server,) = start_engine(tiny_model, "--static-kv")
    body = {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}}
    request = urllib.request.Request(server.url + "/generate", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as reply:
        assert len(json.load(reply)["output_ids"]) == 8
    with urllib.request.urlopen(server.url + "/server_info", timeout=10) as reply:
        decode = json.load(reply)["decode"]
    assert decode == {"static_kv": True, "cuda_graphs": False, "graphs_captured": 0, "capture_error": None,
                      "slots": 1, "capacity": 64}
