"""Batched ancestral sampling from a Hugging Face causal LM, with each sampled token's logprob.

For tuning and tests (`rl360cli.demo.arith_rollout`, `bench/tune_local_smoke.py`), where
an engine would be overkill; the real loop samples through the inference engine. Prompts of
different lengths are left-padded and decoded together with a KV cache; a row stops at EOS
(which is kept, as an engine returns it) or after `max_new_tokens`.

    outs = sample(model, [[3, 17, 4], [3, 9, 9, 4]], max_new_tokens=32, eos_token_id=1, generator=g)
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Sampled:
    token_ids: list[int]
    # log p(token) under the distribution it was drawn from (softmax of logits / temperature).
    logprobs: list[float]
    # Whether the row ended with EOS (else it ran out of max_new_tokens).
    finished: bool


def sample(
    model: Any,
    prompts: list[list[int]],
    *,
    max_new_tokens: int,
    eos_token_id: int,
    temperature: float = 1.0,
    pad_token_id: int = 0,
    generator: Any = None,
) -> list[Sampled]:
    """Sample a continuation of every prompt; temperature 0 is greedy."""
    import torch

    if not prompts:
        return []
    device = next(model.parameters()).device
    lengths = torch.tensor([len(p) for p in prompts])
    width = int(lengths.max())
    input_ids = torch.full((len(prompts), width), pad_token_id, dtype=torch.long)
    for row, prompt in enumerate(prompts):
        input_ids[row, width - len(prompt):] = torch.tensor(prompt, dtype=torch.long)
    attention_mask = (torch.arange(width)[None, :] >= (width - lengths)[:, None]).long()
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    input_ids, attention_mask, position_ids = input_ids.to(device), attention_mask.to(device), position_ids.to(device)

    # transformers 5 calls the KV cache `cache`; 4.x called it `past_key_values`.
    cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    rows = len(prompts)
    out_ids = torch.zeros((rows, max_new_tokens), dtype=torch.long)
    out_logprobs = torch.zeros((rows, max_new_tokens))
    num_tokens = torch.zeros(rows, dtype=torch.long)
    finished = torch.zeros(rows, dtype=torch.bool)
    with torch.no_grad():
        result = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=True)
        past = getattr(result, cache_arg)
        logits = result.logits[:, -1].float()
        next_position = position_ids[:, -1:] + 1
        for step in range(max_new_tokens):
            if temperature > 0:
                logp = torch.log_softmax(logits / temperature, dim=-1)
                token = torch.multinomial(logp.exp(), 1, generator=generator)[:, 0]
            else:
                logp = torch.log_softmax(logits, dim=-1)
                token = logp.argmax(-1)
            active = ~finished
            out_ids[active, step] = token[active].cpu()
            out_logprobs[active, step] = logp.gather(-1, token[:, None])[:, 0][active].cpu()
            num_tokens += active.long()
            finished |= active & (token.cpu() == eos_token_id)
            if bool(finished.all()) or step + 1 == max_new_tokens:
                break
            # Finished rows keep decoding padding; their tokens are not recorded.
            feed = torch.where(finished.to(device), torch.full_like(token, pad_token_id), token)
            attention_mask = torch.cat([attention_mask, torch.ones((rows, 1), dtype=torch.long, device=device)], -1)
            result = model(input_ids=feed[:, None], attention_mask=attention_mask, position_ids=next_position,
                           use_cache=True, **{cache_arg: past})  # fmt: skip
            past = getattr(result, cache_arg)
            logits = result.logits[:, -1].float()
            next_position = next_position + 1
    return [
        Sampled(out_ids[r, : num_tokens[r]].tolist(), out_logprobs[r, : num_tokens[r]].tolist(), bool(finished[r]))
        for r in range(rows)
    ]
