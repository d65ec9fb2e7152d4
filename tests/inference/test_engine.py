"""The engine itself, in this process: continuous batching, exact logprobs, stops, pauses, seeds."""

from __future__ import annotations

import concurrent.futures
import time

import pytest
import torch

from rl360cli.inference.engine import Engine
from rl360cli.inference.protocol import parse_generate


@pytest.fixture(scope="module")
def one_thread():
    # Two torch thread pools (this thread's and the engine's) spinning on 2 cores slow both ~10x.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def reference(tiny_model, one_thread):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()


@pytest.fixture
def engine(tiny_model, one_thread):
    eng = Engine.load(tiny_model, max_batch_size=8, max_wait_ms=20)
    eng.start()
    yield eng
    eng.stop()


def item(prompt, **params):
    body = {"input_ids": prompt, "sampling_params": params, "return_logprob": True}
    return parse_generate(body)[0][0]


def reference_logprobs(model, prompt, output, temperature: float = 1.0):
    """log_softmax at `temperature` of a plain, unbatched, uncached forward over prompt + output, at the output
    tokens."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + output])).logits[0].float()
    lp = torch.log_softmax(logits / temperature, dim=-1)[len(prompt) - 1:-1]
    return lp.gather(1, torch.tensor(output).unsqueeze(1)).squeeze(1)


def test_batched_logprobs_equal_a_plain_forward_pass(engine, reference):
    """Requests of different lengths, some joining a running batch, sampled at temperature 1: the
    reported logprobs are those the trainer recomputes from the same weights (to 1e-4 in float32)."""
    prompts = [[5, 6, 7][:k] for k in (1, 2, 3)] + [[20] * 30, [9, 10, 11, 12, 13]]
    futures = []
    for i, prompt in enumerate(prompts):
        futures.append(engine.submit(item(prompt, max_new_tokens=24, ignore_eos=True, temperature=1.0)))
        if i == 2:
            time.sleep(0.1)  # the rest join a batch that is already decoding
    answers = [f.result(timeout=60) for f in futures]
    for prompt, answer in zip(prompts, answers):
        output = answer["output_ids"]
        assert len(output) == 24 and answer["meta_info"]["finish_reason"] == {"type": "length", "length": 24}
        mine = torch.tensor([e[0] for e in answer["meta_info"]["output_token_logprobs"]])
        assert [e[1] for e in answer["meta_info"]["output_token_logprobs"]] == output
        assert torch.allclose(mine, reference_logprobs(reference, prompt, output), atol=1e-4, rtol=0)


def test_logprobs_are_at_the_sampling_temperature_before_the_cuts(engine, reference):
    """SGLang's convention: the drawn token's log-probability under log_softmax(logits / temperature), the
    distribution before top-k / top-p (which only choose what is drawn); a greedy request's at temperature 1."""
    prompt = [4, 5, 6]
    answer = engine.submit(item(prompt, max_new_tokens=12, ignore_eos=True, temperature=0.3, top_k=5,
                                top_p=0.8)).result(timeout=60)
    mine = torch.tensor([e[0] for e in answer["meta_info"]["output_token_logprobs"]])
    expected = reference_logprobs(reference, prompt, answer["output_ids"], temperature=0.3)
    assert torch.allclose(mine, expected, atol=1e-4, rtol=0)
    greedy = engine.submit(item(prompt, max_new_tokens=6, ignore_eos=True, temperature=0)).result(timeout=60)
    mine = torch.tensor([e[0] for e in greedy["meta_info"]["output_token_logprobs"]])
    assert torch.allclose(mine, reference_logprobs(reference, prompt, greedy["output_ids"]), atol=1e-4, rtol=0)


def test_greedy_matches_hugging_face_generate(engine, reference):
    prompt = [7, 8, 9, 10]
    answer = engine.submit(item(prompt, temperature=0, max_new_tokens=16, ignore_eos=True)).result(timeout=60)
    expected = reference.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False, eos_token_id=None,
                                  pad_token_id=0)
    assert answer["output_ids"] == expected[0, len(prompt):].tolist()


def test_concurrent_requests_are_decoded_together(engine):
    items = [item([3 + i, 4], max_new_tokens=16, ignore_eos=True) for i in range(8)]
    futures = [engine.submit(i) for i in items]
    for f in futures:
        assert len(f.result(timeout=60)["output_ids"]) == 16
    # One at a time would take 8 x 16 forward passes; batched, a prefill and 15 decode steps or so.
    assert engine.num_forward_steps < 8 * 16 / 2
    assert engine.num_generated_tokens == 8 * 16


def test_stop_token_stop_string_and_lengths(engine, reference):
    prompt = [11, 12, 13]
    free = engine.submit(item(prompt, temperature=0, max_new_tokens=12, ignore_eos=True)).result(timeout=60)
    out = free["output_ids"]
    # A stop token ends the completion and stays in output_ids (the trainer learns to emit it).
    stopped = engine.submit(item(prompt, temperature=0, max_new_tokens=12, ignore_eos=True,
                                 stop_token_ids=[out[3]])).result(timeout=60)
    first = out.index(out[3])
    assert stopped["output_ids"] == out[:first + 1]
    assert stopped["meta_info"]["finish_reason"] == {"type": "stop", "matched": out[3]}
    # A stop string ends it too; the text is cut before it.
    text = engine.tokenizer.decode(out)
    needle = next(text[i:i + 2] for i in range(len(text) - 2)
                  if text[i:i + 2].strip() and "\ufffd" not in text[i:i + 2])
    by_string = engine.submit(item(prompt, temperature=0, max_new_tokens=12, ignore_eos=True,
                                   stop=[needle])).result(timeout=60)
    assert by_string["meta_info"]["finish_reason"] == {"type": "stop", "matched": needle}
    assert needle not in by_string["text"] and text.startswith(by_string["text"])
    zero = engine.submit(item(prompt, max_new_tokens=0)).result(timeout=60)
    assert zero["output_ids"] == [] and zero["meta_info"]["finish_reason"] == {"type": "length", "length": 0}


def test_min_new_tokens_holds_back_eos(engine):
    eos = min(engine.eos_ids)
    # Make EOS the only token that stops; with min_new_tokens it cannot come before token 5.
    answers = [engine.submit(item([1, 2], max_new_tokens=6, min_new_tokens=5, temperature=1.0,
                                  stop_token_ids=[t for t in range(engine.config.vocab_size) if t != eos][:200],
                                  sampling_seed=s)).result(timeout=60) for s in range(3)]
    for a in answers:
        assert len(a["output_ids"]) >= 5


def test_a_sampling_seed_makes_a_request_reproducible_whatever_it_is_batched_with(engine):
    alone = engine.submit(item([5, 6], max_new_tokens=10, ignore_eos=True, sampling_seed=42)).result(timeout=60)
    crowd = [engine.submit(item([5, 6], max_new_tokens=10, ignore_eos=True, sampling_seed=s)) for s in (1, 42, 2)]
    results = [f.result(timeout=60)["output_ids"] for f in crowd]
    assert results[1] == alone["output_ids"]
    assert results[0] != results[1] or results[2] != results[1]


def test_retract_pause_recomputes_and_ends_as_if_uninterrupted(engine):
    straight = engine.submit(item([2, 3, 4], temperature=0, max_new_tokens=40, ignore_eos=True)).result(timeout=60)
    future = engine.submit(item([2, 3, 4], temperature=0, max_new_tokens=40, ignore_eos=True))
    while engine.num_generated_tokens < 40 + 5:
        time.sleep(0.005)
    assert engine.call(lambda: engine.pause("retract")).result(timeout=10) == 1
    assert engine.call(engine.flush_cache).result(timeout=10)  # nothing holds KV once retracted
    with pytest.raises(concurrent.futures.TimeoutError):
        future.result(timeout=0.3)  # paused: no progress
    engine.call(engine.resume).result(timeout=10)
    assert future.result(timeout=60)["output_ids"] == straight["output_ids"]


def test_abort_pause_ends_requests_with_an_abort_reason(engine):
    future = engine.submit(item([2, 3], max_new_tokens=500, ignore_eos=True))
    while engine.num_generated_tokens < 3:
        time.sleep(0.005)
    engine.call(lambda: engine.pause("abort")).result(timeout=10)
    answer = future.result(timeout=10)
    assert answer["meta_info"]["finish_reason"]["type"] == "abort"
    assert 0 < len(answer["output_ids"]) < 500
    engine.call(engine.resume).result(timeout=10)
    assert len(engine.submit(item([1], max_new_tokens=3)).result(timeout=60)["output_ids"]) <= 3
