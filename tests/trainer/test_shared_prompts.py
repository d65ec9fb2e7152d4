"""Each distinct prompt run once (rl360cli/trainer/shared_prompts.py): the same logprobs and the same
gradient as the plain forward pass, on local-smoke's policy v0 and groups of multi-turn samples."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from rl360cli.rl.batch import build_batch
from rl360cli.rl.config import GRPOConfig
from rl360cli.trainer.shared_prompts import logprobs_sharing_prompts, prompt_rows
from tests.rl.factories import make_trajectory

POLICY_V0 = Path(__file__).resolve().parents[2] / "recipes" / "models" / "local-smoke-v0"


@pytest.fixture(scope="module")
def model():
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(POLICY_V0, dtype=torch.float32).train()


def groups_with_shared_prompts(vocab: int):
    """Three groups of four samples; a group's samples share its prompt (5, 11 and 8 tokens), then take
    turns of their own lengths: generated tokens, a tool's observation, generated tokens again."""
    rng = np.random.default_rng(3)
    trajectories = []
    for group, prompt_length in (("a", 5), ("b", 11), ("c", 8)):
        prompt = rng.integers(2, vocab, size=prompt_length)
        for i in range(4):
            t = make_trajectory(group_id=group, sample_index=i, reward=float(i % 2), num_prompt_tokens=prompt_length,
                                turns=((3 + 2 * i, 2 + i), (1 + i % 3, 0)))
            ids = np.concatenate([prompt, rng.integers(2, vocab, size=len(t.token_ids) - prompt_length)])
            trajectories.append(dataclasses.replace(t, token_ids=ids.astype(np.int32)))
    batch, _ = build_batch(trajectories, **GRPOConfig().batch_kwargs())
    return batch


def plain_logprobs(model, micro) -> torch.Tensor:
    logits = model(input_ids=micro.input_ids, attention_mask=micro.attention_mask).logits
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1).gather(-1, micro.input_ids[:, 1:, None])[..., 0]
    return logp * micro.attention_mask[:, 1:]


def loss_and_grads(model, logprobs, micro):
    model.zero_grad(set_to_none=True)
    loss = (logprobs * micro.loss_mask * micro.advantages[:, None]).sum()
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


def test_the_prompts_are_found_from_the_loss_mask(model):
    micro = groups_with_shared_prompts(model.config.vocab_size).split(1 << 20, keep_groups=True)[0]
    lengths, rows, prompts = prompt_rows(micro)
    assert sorted(len(p) for p in prompts) == [5, 8, 11]
    assert len(set(rows.tolist())) == 3 and torch.bincount(rows).tolist() == [4, 4, 4]
    for row, length in enumerate(lengths.tolist()):
        assert tuple(micro.input_ids[row, :length].tolist()) == prompts[int(rows[row])]
        assert micro.loss_mask[row, length - 1] == 1 and micro.loss_mask[row, : length - 1].sum() == 0


@pytest.mark.parametrize("max_tokens", [1 << 20, 60])  # one micro-batch; groups cut over several
def test_logprobs_and_gradients_match_the_plain_forward_pass(model, max_tokens):
    batch = groups_with_shared_prompts(model.config.vocab_size)
    micro_batches = batch.split(max_tokens, keep_groups=True)
    assert (len(micro_batches) == 1) == (max_tokens > 1000)
    for micro in micro_batches:
        shared, plain = logprobs_sharing_prompts(model, micro), plain_logprobs(model, micro)
        assert shared.shape == plain.shape
        torch.testing.assert_close(shared, plain, atol=2e-5, rtol=1e-5)
        shared_loss, shared_grads = loss_and_grads(model, logprobs_sharing_prompts(model, micro), micro)
        plain_loss, plain_grads = loss_and_grads(model, plain_logprobs(model, micro), micro)
        torch.testing.assert_close(shared_loss, plain_loss, atol=1e-4, rtol=1e-5)
        assert any(g.abs().sum() > 0 for g in plain_grads)
        for shared_grad, plain_grad in zip(shared_grads, plain_grads):
            # Float sums in another order: ~1e-7 of the gradient's size; a wrong mask or position is ~1.
            assert (shared_grad - plain_grad).norm() <= 1e-5 * plain_grad.norm() + 1e-8


def test_keep_groups_puts_a_groups_samples_side_by_side():
    batch = groups_with_shared_prompts(429)
    for micro in batch.split(1 << 20, keep_groups=True):
        ids = list(micro.group_ids)
        assert ids == sorted(ids, key=ids.index)  # each group's rows are contiguous
    assert sum(m.input_ids.shape[0] for m in batch.split(60, keep_groups=True)) == batch.num_sequences
    for micro in batch.split(60, keep_groups=True):
        assert micro.num_tokens <= 60 or micro.input_ids.shape[0] == 1
