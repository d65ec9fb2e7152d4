"""The local engine's prefix cache: what it finds and evicts, and that an engine using it answers as
one that computes every prompt afresh (logprobs equal a plain forward pass, before and after a
weight load)."""

from __future__ import annotations

import time

import pytest
import torch

from rl360cli.inference.engine import Engine
from rl360cli.inference.prefix_cache import PrefixCache
from rl360cli.inference.protocol import parse_generate
from tests.inference.test_engine import item, one_thread, reference, reference_logprobs  # noqa: F401 - fixtures


def layers_of(tokens: list[int], *, num_layers: int = 2, heads: int = 2, head_dim: int = 4):
    """Keys and values whose every column holds its token id, so a cut can be checked by value."""
    column = torch.tensor(tokens, dtype=torch.float32)[None, :, None].expand(heads, len(tokens), head_dim)
    return [(column.clone(), -column.clone()) for _ in range(num_layers)]


def test_the_longest_cached_prefix_is_found_and_cut_to_its_length():
    cache = PrefixCache(max_bytes=1 << 20)
    cache.insert([1, 2, 3], layers_of([1, 2, 3]))
    cache.insert([1, 2, 3, 4, 5, 6], layers_of([1, 2, 3, 4, 5, 6]))

    n, layers = cache.longest_prefix([1, 2, 3, 4, 9], at_most=4)
    assert n == 4  # a prefix of a longer entry counts
    assert layers[0][0][0, :, 0].tolist() == [1, 2, 3, 4] and layers[1][1][0, :, 0].tolist() == [-1, -2, -3, -4]
    assert cache.longest_prefix([1, 2, 3, 4, 5, 6], at_most=5)[0] == 5  # never the whole prompt when capped
    assert cache.longest_prefix([7, 1, 2], at_most=2) == (0, [])
    assert cache.longest_prefix([1, 2, 3, 4, 5, 6], at_most=0) == (0, [])
    assert cache.hits == 2 and cache.hit_tokens == 9


def test_the_least_recently_used_entries_go_first_when_the_budget_is_passed():
    entry_bytes = sum(k.numel() * 4 + v.numel() * 4 for k, v in layers_of([1, 2, 3, 4]))
    cache = PrefixCache(max_bytes=2 * entry_bytes)
    cache.insert([1, 1, 1, 1], layers_of([1, 1, 1, 1]))
    cache.insert([2, 2, 2, 2], layers_of([2, 2, 2, 2]))
    assert cache.longest_prefix([1, 1, 1, 1, 0], at_most=4)[0] == 4  # [1...] is now the most recent
    cache.insert([3, 3, 3, 3], layers_of([3, 3, 3, 3]))

    assert len(cache) == 2 and cache.nbytes == 2 * entry_bytes
    assert cache.longest_prefix([2, 2, 0], at_most=2) == (0, [])
    assert cache.longest_prefix([1, 1, 0], at_most=2)[0] == 2 and cache.longest_prefix([3, 0], at_most=1)[0] == 1
    cache.insert([4] * 100, layers_of([4] * 100))  # larger than the whole budget: not kept, nothing evicted
    assert len(cache) == 2
    cache.clear()
    assert len(cache) == 0 and cache.nbytes == 0 and cache.longest_prefix([1, 1], at_most=1) == (0, [])


@pytest.fixture
def engine(tiny_model, one_thread):  # noqa: F811 - the fixture imported above
    eng = Engine.load(tiny_model, max_batch_size=8, max_wait_ms=20)
    eng.start()
    yield eng
    eng.stop()


def answered(engine, prompts, **params):
    futures = [engine.submit(item(p, max_new_tokens=8, ignore_eos=True, temperature=1.0, **params)) for p in prompts]
    return [f.result(timeout=60) for f in futures]


def assert_exact(reference, prompts, answers):  # noqa: F811
    for prompt, answer in zip(prompts, answers, strict=True):
        output = answer["output_ids"]
        mine = torch.tensor([e[0] for e in answer["meta_info"]["output_token_logprobs"]])
        assert torch.allclose(mine, reference_logprobs(reference, prompt, output), atol=1e-4, rtol=0)


def test_a_next_turn_continues_from_its_previous_turn_and_answers_as_if_computed_afresh(engine, reference):  # noqa: F811
    """Four samples of one prompt (prefilled once), then each one's next turn (its own answer and an
    observation after it) and a late fifth sample: the cached tokens are reported as SGLang does, and
    every logprob is the plain forward pass's."""
    prompt = [5, 6, 7, 8, 9, 10]
    first = answered(engine, [prompt] * 4)
    assert_exact(reference, [prompt] * 4, first)
    assert engine.num_forward_steps == 1 + 7  # one prefill for the four, then 7 decode steps

    turns = [prompt + a["output_ids"] + [30, 31] for a in first] + [prompt]
    second = []
    for p in turns:  # one at a time, each after the previous turns were cached
        second += answered(engine, [p])
        time.sleep(0.01)
    # A finished turn's keys cover every token but its last sampled one (never fed forward).
    assert [a["meta_info"]["cached_tokens"] for a in second] == [len(prompt) + 7] * 4 + [len(prompt) - 1]
    assert_exact(reference, turns, second)

    # Third turns prefilled together, with observations of different lengths and one prompt never
    # seen: the rows' cached parts and new tokens have padding between them, in the prefill and in
    # the keys and values cached when they finish (a fourth turn continues from those).
    third = [t + a["output_ids"] + [40] * k for t, a, k in zip(turns[:3], second, (1, 4, 2))] + [[50, 51, 52]]
    answers = answered(engine, third)
    assert [a["meta_info"]["cached_tokens"] for a in answers] == [len(t) + 7 for t in turns[:3]] + [0]
    assert_exact(reference, third, answers)
    fourth = [t + a["output_ids"] + [41] for t, a in zip(third, answers)]
    again = answered(engine, fourth)
    assert [a["meta_info"]["cached_tokens"] for a in again] == [len(t) + 7 for t in third]
    assert_exact(reference, fourth, again)


def test_a_weight_load_clears_the_cache_so_no_prompt_continues_from_the_old_weights(engine, tiny_model):
    from transformers import AutoModelForCausalLM

    prompt = [3, 4, 5, 6, 7]
    answered(engine, [prompt])
    assert len(engine.prefix_cache) > 0
    changed = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    with torch.no_grad():
        for param in changed.parameters():
            param.add_(0.05 * torch.randn_like(param))
    named = [(name, param.detach().clone()) for name, param in changed.named_parameters()]
    engine.call(lambda: engine.load_weights(named)).result(timeout=30)
    assert len(engine.prefix_cache) == 0

    again = answered(engine, [prompt + [9]])
    assert again[0]["meta_info"]["cached_tokens"] == 0
    assert_exact(changed, [prompt + [9]], again)


def test_prompt_logprobs_and_a_zero_budget_compute_every_prompt_token(tiny_model, one_thread, reference):  # noqa: F811
    eng = Engine.load(tiny_model, max_batch_size=8, max_wait_ms=20, prefix_cache_mb=0)
    eng.start()
    try:
        assert eng.prefix_cache is None
        answers = answered(eng, [[5, 6, 7]] * 2)
        assert [a["meta_info"]["cached_tokens"] for a in answers] == [0, 0]
        assert_exact(reference, [[5, 6, 7]] * 2, answers)
    finally:
        eng.stop()


def test_a_request_for_prompt_logprobs_is_prefilled_in_full(engine, reference):  # noqa: F811
    prompt = [5, 6, 7, 8]
    answered(engine, [prompt])
    request = parse_generate({"input_ids": prompt + [9], "sampling_params": {"max_new_tokens": 2, "ignore_eos": True},
                              "return_logprob": True, "logprob_start_len": 0})[0][0]
    answer = engine.submit(request).result(timeout=60)
    assert answer["meta_info"]["cached_tokens"] == 0
    prompt_lps = [e[0] for e in answer["meta_info"]["input_token_logprobs"]]
    assert prompt_lps[0] is None and len(prompt_lps) == 5
    expected = reference_logprobs(reference, [5], [6, 7, 8, 9])
    assert torch.allclose(torch.tensor(prompt_lps[1:]), expected, atol=1e-4, rtol=0)


def test_a_row_that_ran_on_through_a_weight_load_is_not_cached(engine, tiny_model):
    """An in-place update: the running row keeps its keys and values from the old weights, and its
    next turn must not continue from them."""
    from transformers import AutoModelForCausalLM

    changed = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    with torch.no_grad():
        for param in changed.parameters():
            param.add_(0.05 * torch.randn_like(param))
    named = [(name, param.detach().clone()) for name, param in changed.named_parameters()]
    prompt = [7, 8, 9]
    future = engine.submit(item(prompt, max_new_tokens=200, ignore_eos=True))
    while engine.num_generated_tokens < 5:
        time.sleep(0.005)
    engine.call(lambda: engine.load_weights(named)).result(timeout=30)
    first = future.result(timeout=60)
    assert len(first["output_ids"]) == 200 and len(engine.prefix_cache) == 0

    turn = prompt + first["output_ids"] + [30]
    again = answered(engine, [turn])
    assert again[0]["meta_info"]["cached_tokens"] == 0
    assert_exact(changed, [turn], again)
