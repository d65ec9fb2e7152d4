"""`sample_next` draws a batch in as few launches as its generators allow (one argmax for the greedy rows,
one multinomial for the rows on the engine's generator), and that changes no token: each row gets what
it would get drawn alone, in order, from the same generators."""

from __future__ import annotations

import torch

from rl360cli.inference.protocol import SamplingParams
from rl360cli.inference.sampling import sample_next


def _one_by_one(logits, params, generators, default, banned):
    tokens, logprobs = [], []
    for i in range(len(params)):
        t, lp = sample_next(logits[i:i + 1], params[i:i + 1], generators[i:i + 1], default, banned[i:i + 1])
        tokens += t
        logprobs += lp
    return tokens, logprobs


def test_a_mixed_batch_draws_what_each_row_draws_alone():
    torch.manual_seed(0)
    logits = torch.randn(6, 50)
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=1.0),
              SamplingParams(temperature=0.7, top_k=5), SamplingParams(temperature=1.0, sampling_seed=7),
              SamplingParams(temperature=0.0), SamplingParams(temperature=1.3, top_p=0.9)]
    banned = [(int(logits[0].argmax()),), (), (), (), (), (3, 4)]

    def generators():
        return [None, None, None, torch.Generator().manual_seed(7), None, None]

    batched = sample_next(logits, params, generators(), torch.Generator().manual_seed(1), banned)
    alone = _one_by_one(logits, params, generators(), torch.Generator().manual_seed(1), banned)
    assert batched[0] == alone[0]
    assert torch.allclose(torch.tensor(batched[1]), torch.tensor(alone[1]))
    assert batched[0][0] != int(logits[0].argmax())  # a banned id is never drawn, greedy rows too
    assert batched[0][4] == int(logits[4].argmax())
    assert batched[0][5] not in (3, 4)
    # Each row's logprob is at its own temperature (a greedy row's at 1), before the top-k / top-p cut.
    temps = torch.tensor([1.0, 1.0, 0.7, 1.0, 1.0, 1.3]).unsqueeze(1)
    expected = torch.log_softmax(logits / temps, dim=-1)[torch.arange(6), torch.tensor(batched[0])]
    assert torch.allclose(torch.tensor(batched[1]), expected)
