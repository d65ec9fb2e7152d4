"""Builders of small, valid trajectories for the RL core tests."""

import numpy as np

from rl360cli.outcome import InfraCause, Outcome
from rl360cli.rl.trajectory import Trajectory


def make_trajectory(
    *,
    group_id: str = "g0",
    sample_index: int = 0,
    reward: float | None = 1.0,
    cause: InfraCause | None = None,
    outcome: Outcome | None = None,
    num_prompt_tokens: int = 3,
    turns: tuple[tuple[int, int], ...] = ((4, 2), (3, 0)),
    versions: tuple[int, ...] | None = None,
    seed: int = 0,
    metadata: dict | None = None,
) -> Trajectory:
    """A trajectory of a prompt then `turns` of (generated tokens, observation tokens after them)."""
    rng = np.random.default_rng(seed)
    mask = [0] * num_prompt_tokens
    for generated, observed in turns:
        mask += [1] * generated + [0] * observed
    mask = np.array(mask, dtype=np.uint8)
    token_ids = rng.integers(1, 50_000, size=len(mask)).astype(np.int32)
    logprobs = np.where(mask == 1, -rng.random(len(mask)) * 3, 0.0).astype(np.float32)
    if outcome is None:
        outcome = Outcome.INFRA_FAILURE if cause is not None else Outcome.OK
    return Trajectory(
        task_id=f"task-{group_id}",
        group_id=group_id,
        sample_index=sample_index,
        token_ids=token_ids,
        loss_mask=mask,
        logprobs=logprobs,
        versions=versions if versions is not None else tuple(0 for _ in turns),
        num_prompt_tokens=num_prompt_tokens,
        reward=reward,
        outcome=outcome,
        cause=cause,
        timings={"generate": 1.5, "verify": 0.25},
        metadata=metadata or {},
    )


def text_trajectory(tokenizer, pieces, *, group_id: str = "g0", sample_index: int = 0, reward: float | None = 1.0,
                    versions: tuple[int, ...] = (3, 4), segment: int = 0, task_id: str | None = None,
                    **fields) -> Trajectory:
    """A trajectory whose tokens are `pieces`, (loss mask bit, text) each, tokenized one by one with `tokenizer`:
    a conversation written by hand (prompt, the model's turns, what was appended between them)."""
    ids, mask = [], []
    for bit, text in pieces:
        piece = tokenizer.encode(text, add_special_tokens=False)
        ids += piece
        mask += [bit] * len(piece)
    outcome = fields.pop("outcome", Outcome.INFRA_FAILURE if reward is None else Outcome.OK)
    return Trajectory(task_id=task_id or f"task-{group_id}", group_id=group_id, sample_index=sample_index,
                      token_ids=ids, loss_mask=mask, logprobs=[-0.5 * bit for bit in mask], versions=versions,
                      num_prompt_tokens=mask.index(1) if 1 in mask else len(mask), reward=reward, segment=segment,
                      outcome=outcome, **fields)
