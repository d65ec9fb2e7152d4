"""Next-token sampling for a batch whose rows each carry their own sampling parameters.

The logprob reported for a sampled token is `log_softmax(logits)[token]` of the
model's raw logits, i.e. at temperature 1 and before any top-k / top-p / min-p
cut: the policy's own log-probability, which is what the RL trainer recomputes
from the same weights (they agree to float32 rounding). Temperature and the cuts
shape only which token is drawn. This matches SGLang run with
`SGLANG_RETURN_ORIGINAL_LOGPROB=1`, which rl360's SGLang launch command sets.

Rows with a `sampling_seed` draw from their own generator, so a request's
tokens do not depend on what else is in the batch. Tested by tests/inference/test_engine.py.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rl360cli.inference.protocol import SamplingParams


def sample_next(logits: torch.Tensor, params: Sequence[SamplingParams],
                generators: Sequence[torch.Generator | None], default_generator: torch.Generator,
                banned: Sequence[Sequence[int]] = ()) -> tuple[list[int], list[float]]:
    """Draw one token per row of `logits` [B, V]; return (token ids, their temperature-1 logprobs).

    `banned[i]` lists token ids row i may not draw this step (stop tokens before `min_new_tokens`).
    """
    logits = logits.float()
    device = logits.device
    logprobs = torch.log_softmax(logits, dim=-1)
    # Each row's token stays on the device until all are drawn: one copy to the host per step, not per row.
    drawn: list[torch.Tensor | None] = [None] * logits.shape[0]
    sampled_rows = []
    for i, p in enumerate(params):
        row_banned = banned[i] if i < len(banned) else ()
        if p.greedy:
            row = logits[i]
            if row_banned:
                row = row.clone()
                row[list(row_banned)] = float("-inf")
            drawn[i] = torch.argmax(row).reshape(1)
        else:
            sampled_rows.append(i)
    if sampled_rows:
        idx = torch.tensor(sampled_rows, device=device)
        probs = _filtered_probs(logits[idx], [params[i] for i in sampled_rows],
                                [banned[i] if i < len(banned) else () for i in sampled_rows])
        for j, i in enumerate(sampled_rows):
            gen = generators[i] if generators[i] is not None else default_generator
            drawn[i] = torch.multinomial(probs[j], 1, generator=gen)
    tokens = torch.cat(drawn)
    chosen = logprobs.gather(1, tokens.unsqueeze(1)).squeeze(1)
    return tokens.tolist(), chosen.tolist()


def _filtered_probs(logits: torch.Tensor, params: Sequence[SamplingParams],
                    banned: Sequence[Sequence[int]]) -> torch.Tensor:
    device = logits.device
    temps = torch.tensor([p.temperature for p in params], dtype=logits.dtype, device=device).unsqueeze(1)
    scaled = logits / temps
    for j, row_banned in enumerate(banned):
        if row_banned:
            scaled[j, list(row_banned)] = float("-inf")
    probs = torch.softmax(scaled, dim=-1)
    if any(p.top_k > 0 or p.top_p < 1 or p.min_p > 0 for p in params):
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        vocab = probs.shape[-1]
        keep = torch.ones_like(sorted_probs, dtype=torch.bool)
        ranks = torch.arange(vocab, device=device).unsqueeze(0)
        top_k = torch.tensor([p.top_k if p.top_k > 0 else vocab for p in params], device=device).unsqueeze(1)
        keep &= ranks < top_k
        top_p = torch.tensor([p.top_p for p in params], dtype=probs.dtype, device=device).unsqueeze(1)
        # Keep a token while the mass before it is below top_p (the first token always stays).
        keep &= (sorted_probs.cumsum(-1) - sorted_probs) < top_p
        min_p = torch.tensor([p.min_p for p in params], dtype=probs.dtype, device=device).unsqueeze(1)
        keep &= sorted_probs >= min_p * sorted_probs[:, :1]
        keep[:, 0] = True
        sorted_probs = sorted_probs * keep
        probs = torch.zeros_like(probs).scatter_(1, order, sorted_probs)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs
