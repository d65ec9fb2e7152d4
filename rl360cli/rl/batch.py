"""`build_batch`: from a step's trajectories to a training batch and an account of every sample.

The learning signal must never punish the policy for an infrastructure failure, so each sample
goes to exactly one bucket, decided in this order:
1. masked (by cause): an infra failure enters neither the group statistics nor the loss;
2. dropped_stale: generated more than `max_staleness` versions before `current_version`
   (measured from its oldest turn); it leaves its group before the group is looked at;
3. dropped_too_few_valid: its group has fewer than `min_valid` samples left;
4. filtered_zero_std: with `filter_zero_std`, its group's remaining rewards are all equal
   (dynamic filtering: such a group has no signal);
5. kept: trained on, with the GRPO advantage computed over its group's remaining samples only.
Masking one sample therefore never changes another group, and the kept samples of a group with
failures get exactly the advantages of the group without them.

A session whose harness rewrote its history comes as several trajectories, one per segment (same group
and sample index, `segment` 0, 1, ...). They share the session's reward and count once: the group's
size, its reward spread and its advantages are the sessions', and each segment is trained with its
session's advantage.

Example, as the loop uses it:

    batch, report = build_batch(trajectories, current_version=step, **config.batch_kwargs())
    metrics.log(report.to_dict())
    if batch is not None:
        for micro in batch.split(max_tokens=16384): ...
"""

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from rl360cli.rl.grpo import group_advantages
from rl360cli.rl.train_batch import MicroBatch, MicroBatches, TrainBatch, pack_sequences
from rl360cli.rl.trajectory import Trajectory

__all__ = ["BatchReport", "MicroBatch", "MicroBatches", "TrainBatch", "build_batch"]


@dataclass(frozen=True, kw_only=True, slots=True)
class BatchReport:
    """Where every sample given to `build_batch` went, and the step's reward figures."""

    total: int
    # Samples given; equals kept + masked + filtered_zero_std + dropped_stale + dropped_too_few_valid.
    kept: int
    # Samples in the training batch.
    masked_by_cause: dict[str, int]
    # Infra failures by InfraCause value.
    filtered_zero_std: int
    # Samples of groups whose valid rewards were all equal.
    dropped_stale: int
    # Samples more than max_staleness versions old.
    dropped_too_few_valid: int
    # Samples of groups left with fewer than min_valid valid samples.
    num_groups: int
    # Distinct groups given.
    num_groups_kept: int
    # Groups in the training batch.
    num_loss_tokens: int
    # Generated tokens in the training batch.
    reward_mean: float | None
    # Mean reward over the valid (not infra-failed) samples; None when there are none.
    reward_std: float | None
    # Population std of the same rewards.
    pass_rate: float | None
    # Fraction of the same samples with reward >= pass_threshold.
    staleness_mean: float | None
    # Mean current_version - policy_version over kept samples (None without current_version).
    staleness_max: int | None
    # Largest staleness among kept samples.

    @property
    def masked(self) -> int:
        """Infra failures of all causes."""
        return sum(self.masked_by_cause.values())

    def to_dict(self) -> dict[str, float | int]:
        """Flat metrics: counts, `masked/<cause>` per cause, and the figures that are defined."""
        out: dict[str, float | int] = {
            "total": self.total,
            "kept": self.kept,
            "masked": self.masked,
            "filtered_zero_std": self.filtered_zero_std,
            "dropped_stale": self.dropped_stale,
            "dropped_too_few_valid": self.dropped_too_few_valid,
            "num_groups": self.num_groups,
            "num_groups_kept": self.num_groups_kept,
            "num_loss_tokens": self.num_loss_tokens,
        }
        out.update({f"masked/{cause}": count for cause, count in sorted(self.masked_by_cause.items())})
        for name in ("reward_mean", "reward_std", "pass_rate", "staleness_mean", "staleness_max"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        return out


def build_batch(
    trajectories: Sequence[Trajectory],
    *,
    min_valid: int = 2,
    filter_zero_std: bool = True,
    max_staleness: int | None = None,
    current_version: int | None = None,
    std_normalize: bool = True,
    eps: float = 1e-6,
    pass_threshold: float = 1.0,
) -> tuple[TrainBatch | None, BatchReport]:
    """The training batch of the kept samples (None when nothing is kept) and the report.

    Kept samples appear in input order; `TrainBatch.indices` maps each back to its position in
    `trajectories`. The settings are taken as given: `GRPOConfig` validated them (pass
    `**config.batch_kwargs()`). Raises `ValueError` for a (group_id, sample_index, segment) given twice (a
    retried attempt delivered twice would count double), for a sample newer than `current_version`
    and for `max_staleness` without `current_version`.
    """
    if max_staleness is not None and current_version is None:
        raise ValueError(
            f"max_staleness={max_staleness} needs current_version (got None); pass the trainer's policy version"
        )

    masked_by_cause: Counter[str] = Counter()
    dropped_stale = 0
    seen: set[tuple[str, int, int]] = set()
    groups: dict[str, list[int]] = {}
    valid_rewards: list[float] = []
    for position, trajectory in enumerate(trajectories):
        key = (trajectory.group_id, trajectory.sample_index, trajectory.segment)
        if key in seen:
            raise ValueError(
                f"sample {trajectory.sample_index} of group {trajectory.group_id!r} (segment {trajectory.segment}) "
                "is given twice; deliver each attempt once (a retry replaces the failed attempt, it does not add to it)"
            )
        seen.add(key)
        if not trajectory.is_valid:
            masked_by_cause[trajectory.cause.value] += 1
            continue
        if trajectory.segment == 0:  # a session's reward counts once
            valid_rewards.append(trajectory.reward)
        if current_version is not None and trajectory.policy_version > current_version:
            raise ValueError(
                f"sample {trajectory.sample_index} of group {trajectory.group_id!r} was generated by policy "
                f"version {trajectory.policy_version}, newer than current_version {current_version}; "
                "pass the trainer's current version"
            )
        if max_staleness is not None and current_version - trajectory.policy_version > max_staleness:
            dropped_stale += 1
            continue
        groups.setdefault(trajectory.group_id, []).append(position)
    num_groups = len({trajectory.group_id for trajectory in trajectories})

    kept: list[int] = []
    dropped_too_few_valid = 0
    filtered_zero_std = 0
    num_groups_kept = 0
    for members in groups.values():
        sessions = {trajectories[position].sample_index: trajectories[position].reward for position in members}
        if len(sessions) < min_valid:
            dropped_too_few_valid += len(members)
            continue
        rewards = list(sessions.values())
        if filter_zero_std and max(rewards) == min(rewards):
            filtered_zero_std += len(members)
            continue
        kept.extend(members)
        num_groups_kept += 1
    kept.sort()

    chosen = [trajectories[position] for position in kept]
    batch = None
    if chosen:
        rewards = torch.tensor([trajectory.reward for trajectory in chosen], dtype=torch.float64)
        group_ids = tuple(trajectory.group_id for trajectory in chosen)
        advantages = session_advantages(chosen, std_normalize=std_normalize, eps=eps)
        batch = pack_sequences(
            [trajectory.token_ids for trajectory in chosen],
            [trajectory.loss_mask for trajectory in chosen],
            [trajectory.logprobs for trajectory in chosen],
            advantages=advantages,
            rewards=rewards.to(torch.float32),
            versions=torch.tensor([trajectory.policy_version for trajectory in chosen], dtype=torch.int64),
            indices=torch.tensor(kept, dtype=torch.int64),
            group_ids=group_ids,
        )

    staleness = (
        np.array([current_version - trajectory.policy_version for trajectory in chosen])
        if current_version is not None and chosen
        else None
    )
    reward_array = np.array(valid_rewards, dtype=np.float64)
    report = BatchReport(
        total=len(trajectories),
        kept=len(kept),
        masked_by_cause=dict(masked_by_cause),
        filtered_zero_std=filtered_zero_std,
        dropped_stale=dropped_stale,
        dropped_too_few_valid=dropped_too_few_valid,
        num_groups=num_groups,
        num_groups_kept=num_groups_kept,
        num_loss_tokens=0 if batch is None else batch.num_loss_tokens,
        reward_mean=float(reward_array.mean()) if valid_rewards else None,
        reward_std=float(reward_array.std()) if valid_rewards else None,
        pass_rate=float((reward_array >= pass_threshold).mean()) if valid_rewards else None,
        staleness_mean=None if staleness is None else float(staleness.mean()),
        staleness_max=None if staleness is None else int(staleness.max()),
    )
    return batch, report


def session_advantages(chosen: Sequence[Trajectory], *, std_normalize: bool, eps: float) -> torch.Tensor:
    """The GRPO advantage of each chosen trajectory: its session's, computed over the sessions of its group
    (a session's segments share it), as float32."""
    sessions: dict[tuple[str, int], int] = {}
    for trajectory in chosen:
        sessions.setdefault((trajectory.group_id, trajectory.sample_index), len(sessions))
    rewards = torch.zeros(len(sessions), dtype=torch.float64)
    for trajectory in chosen:
        rewards[sessions[(trajectory.group_id, trajectory.sample_index)]] = trajectory.reward
    per_session = group_advantages(rewards, tuple(group for group, _ in sessions), std_normalize=std_normalize,
                                   eps=eps)
    positions = torch.tensor([sessions[(t.group_id, t.sample_index)] for t in chosen], dtype=torch.int64)
    return per_session[positions].to(torch.float32)
