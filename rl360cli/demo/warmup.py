"""Supervised warm-up of a tiny policy on synthetic arith conversations, before RL.

A model from scratch has never seen the agent format, so RL would find no reward at all. The
warm-up shows it a stream of *random* arith programs (never the task set's own instructions,
which are passed in `exclude`) as the whole two-turn conversation the real loop produces:

    <|user|>instruction<|end|><|assistant|>```bash\\necho 'expr' > answer.py\\n```<|end|>
    <|tool|>[exit code 0]<|end|><|assistant|>done<|end|>

built with `ConversationTokens` (the prompt through the chat template, the replies as the
tokens a sampler would emit, the observation through `observation_ids`), with the loss on the
assistant tokens only. A short warm-up teaches the format and part of the mapping from words to
expressions; the recipe's `warmup_steps` stops it where the pass rate on the fixed tasks is
low (about 0.2-0.45), leaving RL something to do. Deterministic for a seed (CPU, same thread count).
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from rl360cli.agent.conversation import ConversationTokens, format_observation
from rl360cli.demo import arith

RAMP_STEPS = 20
# Random programs in the tokenizer's training corpus.
CORPUS_PROGRAMS = 2000


@dataclass(frozen=True, kw_only=True, slots=True)
class WarmupReport:
    num_steps: int
    seconds: float
    # Mean loss over each block of `log_every` steps.
    losses: list[float] = field(default_factory=list)
    log_every: int = 25


def conversation(tokenizer: Any, instruction: str, expr: str) -> tuple[list[int], list[int]]:
    """Token ids and loss mask of the ideal two-turn conversation for one task."""
    eos = tokenizer.eos_token_id
    conv = ConversationTokens(tokenizer, [{"role": "user", "content": instruction}])
    for reply, observation in ((arith.action(expr), format_observation(0, "")), (arith.SUBMIT, None)):
        ids = list(tokenizer.encode(reply, add_special_tokens=False)) + [eos]
        conv.add_generated(ids, [0.0] * len(ids), 0)
        if observation is not None:
            conv.add_observation(observation)
    return conv.token_ids, conv.loss_mask


def corpus_programs(seed: int, num_programs: int = CORPUS_PROGRAMS) -> Iterator[arith.Program]:
    """The random programs whose texts `synthetic_corpus` writes, in order."""
    rng = random.Random(f"corpus-{seed}")
    for _ in range(num_programs):
        yield arith.random_program(rng)


def synthetic_corpus(seed: int, num_programs: int = CORPUS_PROGRAMS) -> Iterator[str]:
    """Texts of random arith conversations (instruction, replies, observation) for tokenizer training."""
    for program in corpus_programs(seed, num_programs):
        yield arith.instruction(program)
        yield arith.action(arith.expression(program))
        yield arith.SUBMIT
        yield format_observation(0, "")


def example_programs(seed: int, exclude: Iterable[str] = ()) -> Iterator[tuple[arith.Program, str]]:
    """The endless stream `examples` trains on: (random program, its instruction as shown), skipping
    `exclude`d instructions. A warm-up of N steps of B conversations reads its first N x B; the
    held-out set of recipes/tasks/generate_arith.py is chosen outside them.

    The instruction comes with and without its final newline, so the model does not depend on
    whether the loop strips instruction.md.
    """
    rng = random.Random(f"warmup-{seed}")
    skip = {text.strip() for text in exclude}
    while True:
        program = arith.random_program(rng)
        text = arith.instruction(program)
        if text.strip() in skip:
            continue
        if rng.random() < 0.5:
            text = text.rstrip("\n")
        yield program, text


def examples(tokenizer: Any, seed: int, exclude: Iterable[str] = ()) -> Iterator[tuple[list[int], list[int]]]:
    """An endless stream of training conversations of `example_programs`: token ids and loss mask."""
    for program, text in example_programs(seed, exclude):
        yield conversation(tokenizer, text, arith.expression(program))


def supervised_warmup(
    model: Any,
    tokenizer: Any,
    *,
    num_steps: int,
    lr: float,
    batch_size: int,
    seed: int,
    exclude: Iterable[str] = (),
    log_every: int = 25,
    on_step: Any = None,
) -> WarmupReport:
    """Train `model` in place for `num_steps` AdamW steps of `batch_size` synthetic conversations.

    `on_step(step, model)` is called after every step (for tuning).
    """
    import torch

    start = time.perf_counter()
    if num_steps == 0:
        return WarmupReport(num_steps=0, seconds=0.0, log_every=log_every)
    torch.manual_seed(seed)
    stream = examples(tokenizer, seed, exclude)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    # A short linear ramp (the first steps of a model from scratch have large gradients), fixed in
    # length so that a warm-up of N steps is the first N steps of any longer one.
    ramp = RAMP_STEPS
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / ramp))
    model.train()
    losses, block = [], []
    for _ in range(num_steps):
        batch = [next(stream) for _ in range(batch_size)]
        width = max(len(ids) for ids, _ in batch)
        input_ids = torch.full((batch_size, width), tokenizer.pad_token_id, dtype=torch.long)
        target_mask = torch.zeros((batch_size, width), dtype=torch.bool)
        attention = torch.zeros((batch_size, width), dtype=torch.long)
        for row, (ids, mask) in enumerate(batch):
            input_ids[row, : len(ids)] = torch.tensor(ids)
            target_mask[row, : len(ids)] = torch.tensor(mask, dtype=torch.bool)
            attention[row, : len(ids)] = 1
        logits = model(input_ids=input_ids, attention_mask=attention).logits[:, :-1].float()
        targets = input_ids[:, 1:]
        token_loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                                                       reduction="none").view_as(targets)  # fmt: skip
        weights = target_mask[:, 1:].float()
        loss = (token_loss * weights).sum() / weights.sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        block.append(loss.item())
        if on_step is not None:
            on_step(len(losses) * log_every + len(block), model)
        if len(block) == log_every:
            losses.append(sum(block) / len(block))
            block = []
    if block:
        losses.append(sum(block) / len(block))
    model.eval()
    return WarmupReport(num_steps=num_steps, seconds=time.perf_counter() - start, losses=losses, log_every=log_every)
