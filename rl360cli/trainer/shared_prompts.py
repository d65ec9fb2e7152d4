"""A micro-batch's logprobs with each distinct prompt run once: the GRPO group's samples share it.

A group's samples all start from the same prompt (the task's first messages), and on short agent
turns that prompt is most of each sequence: local-smoke's are ~55 of ~81 tokens, 8 samples a group.
So the forward pass runs the micro-batch's distinct prompts once each, keeps their keys and values,
and runs every sequence's own tokens after its prompt's cache. Gradients reach the prompt's keys
and values from every sample that attended to them (the cache rows are gathered, so backward adds
them up): the logprobs, and so the loss and its gradient, are those of the plain forward pass up to
float rounding (tests/trainer/test_shared_prompts.py checks both).

A sequence's prompt is every token before its first loss token. Prompts are right-padded to the
longest; a sequence's own tokens continue at its prompt's length (position ids), and the padding
between is masked, so no query row is ever fully masked (no NaN from the attention).
"""

from __future__ import annotations

import functools
import inspect

import torch

from rl360cli.rl.train_batch import MicroBatch


def prompt_rows(micro: MicroBatch) -> tuple[torch.Tensor, torch.Tensor, list[tuple[int, ...]]]:
    """Each row's prompt length (tokens before its first loss token) [B], the index of its prompt
    among the distinct ones [B], and the distinct prompts' token ids (first seen first)."""
    has_loss = micro.loss_mask > 0
    # Position t predicts token t + 1: the first loss position t is a prompt of t + 1 tokens.
    first = torch.where(has_loss.any(dim=1), has_loss.float().argmax(dim=1) + 1, micro.lengths)
    index: dict[tuple[int, ...], int] = {}
    rows = []
    for ids, length in zip(micro.input_ids.tolist(), first.tolist()):
        rows.append(index.setdefault(tuple(ids[:length]), len(index)))
    return first, torch.tensor(rows, dtype=torch.long), list(index)


def logprobs_sharing_prompts(model: torch.nn.Module, micro: MicroBatch, *, temperature: float = 1.0) -> torch.Tensor:
    """log pi(token t+1 | tokens <= t) at every position t of `micro`, [B, T-1], as
    `model(micro.input_ids, attention_mask=micro.attention_mask)` gives it (its logits divided by
    `temperature`), with each distinct prompt run once. Positions past a sequence's end are 0."""
    input_ids, lengths = micro.input_ids, micro.lengths
    width = input_ids.shape[1]
    prompt_lengths, prompt_of_row, prompts = prompt_rows(micro)
    device = next(model.parameters()).device

    # The distinct prompts, right-padded: their logits, and their keys and values for the rest.
    prompt_width = max(len(p) for p in prompts)
    prompt_ids = torch.zeros(len(prompts), prompt_width, dtype=torch.long)
    prompt_mask = torch.zeros(len(prompts), prompt_width, dtype=torch.long)
    for i, prompt in enumerate(prompts):
        prompt_ids[i, : len(prompt)] = torch.tensor(prompt, dtype=torch.long)
        prompt_mask[i, : len(prompt)] = 1
    out = model(input_ids=prompt_ids.to(device), attention_mask=prompt_mask.to(device), use_cache=True)
    cache = getattr(out, "cache", None) or out.past_key_values
    cache.reorder_cache(prompt_of_row.to(device))  # each row's copy of its prompt's keys and values

    # Each row's own tokens after its prompt, right-padded, at positions from its prompt's length.
    rest_width = max(int((lengths - prompt_lengths).max()), 1)
    offsets = torch.arange(rest_width)
    take = prompt_lengths[:, None] + offsets[None, :]
    rest_mask = (take < lengths[:, None]).long()
    rest_ids = torch.where(rest_mask.bool(), input_ids.gather(1, take.clamp(max=width - 1)), 0)
    attention_mask = torch.cat([prompt_mask[prompt_of_row], rest_mask], dim=1)
    rest_logits = model(input_ids=rest_ids.to(device), attention_mask=attention_mask.to(device),
                        position_ids=take.to(device), use_cache=False, **{_cache_argument(type(model)): cache}).logits

    # Position t's prediction: from the prompt's logits while t is inside the prompt (its last position
    # predicts the row's first own token), else from the row's own logits at t - its prompt's length.
    targets = input_ids[:, 1:].to(device)
    in_prompt = min(prompt_width, width - 1)
    # Picked per row from the distinct prompts' logprobs, without a copy of them for every row.
    prompt_logp = torch.log_softmax(out.logits[:, :in_prompt].float() / temperature, dim=-1)
    from_prompt = prompt_logp[prompt_of_row.to(device)[:, None], torch.arange(in_prompt, device=device)[None, :],
                              targets[:, :in_prompt]]
    from_prompt = torch.nn.functional.pad(from_prompt, (0, width - 1 - in_prompt))
    next_ids = input_ids.gather(1, (take + 1).clamp(max=width - 1)).to(device)  # own position j predicts these
    own = torch.log_softmax(rest_logits.float() / temperature, dim=-1).gather(-1, next_ids[..., None])[..., 0]
    positions = torch.arange(width - 1)[None, :]
    from_own = own.gather(1, (positions - prompt_lengths[:, None]).clamp(0, rest_width - 1).to(device))
    logprobs = torch.where((positions < prompt_lengths[:, None]).to(device), from_prompt, from_own)
    return logprobs * (positions < (lengths - 1)[:, None]).to(device)


@functools.cache
def _cache_argument(model_type: type) -> str:
    # transformers 5.2x names it `cache` (and warns at each `past_key_values`); 4.x `past_key_values`.
    return "cache" if "cache" in inspect.signature(model_type.forward).parameters else "past_key_values"
