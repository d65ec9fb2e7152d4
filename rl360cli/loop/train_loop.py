"""The overlapped RL loop: generate step k+1 while training on step k, then broadcast the weights.

    generation = rollouts.submit(first step)
    for each step:
        trajectories = rollouts.collect(generation)            # wait for this step's groups
        generation = rollouts.submit(next step)                # overlap: engines keep generating
        batch, report = build_batch(trajectories)              # mask infra failures, filter, GRPO
        trainer.train_step(batch)
        weight_sync.broadcast(trainer weights, new version)    # engines pause, load, continue
        log metrics, checkpoint

With `overlap = false` the next step is submitted only after the broadcast:
the same loop, synchronous, for comparison. Samples more than
`grpo.max_staleness` versions behind the trainer are dropped by build_batch.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rl360cli.loop.config import LoopConfig
from rl360cli.rl.batch import build_batch
from rl360cli.rl.config import GRPOConfig
from rl360cli.rl.trajectory import Trajectory
from rl360cli.rollout.rollouts import Generation, GenerationReport, Rollouts
from rl360cli.trainer.protocol import Trainer, WeightSync

if TYPE_CHECKING:
    from rl360cli.trainer.broadcast import SyncStats


@dataclass(frozen=True, kw_only=True)
class LoopParts:
    """What the loop runs on, built by the driver."""

    rollouts: Rollouts
    trainer: Trainer
    weight_sync: WeightSync
    loop: LoopConfig
    grpo: GRPOConfig
    checkpoint_every: int
    checkpoint_dir: Path
    # Each step's figures (metrics.jsonl, W&B), and (step done, policy version, figures) for the run record.
    log: Callable[[int, dict], None]
    on_step: Callable[[int, int, dict], None]
    # Keeps a few decoded samples of each step for people to read (samples.jsonl).
    keep_samples: Callable[[int, list[Trajectory]], None] = lambda step, trajectories: None


def train_loop(parts: LoopParts, *, start_step: int = 0) -> dict:
    """Steps `start_step` to `loop.num_steps`; returns the last step's figures."""
    rollouts, trainer = parts.rollouts, parts.trainer
    num_steps, overlap = parts.loop.num_steps, parts.loop.overlap
    generation: Generation | None = rollouts.submit(start_step) if start_step < num_steps else None
    last: dict = {}
    for step in range(start_step, num_steps):
        step_started = time.time()
        trajectories, gen_report = rollouts.collect(generation)
        waited_s = time.time() - step_started
        parts.keep_samples(step, trajectories)
        generation = None
        if overlap and step + 1 < num_steps:
            generation = rollouts.submit(step + 1)

        batch, report = build_batch(trajectories, current_version=trainer.version, **parts.grpo.batch_kwargs())
        train_started = time.time()
        train_stats = trainer.train_step(batch) if batch is not None else {}
        train_s = time.time() - train_started
        sync = parts.weight_sync.broadcast(trainer.named_tensors(), trainer.version) if batch is not None else None
        train_done = time.time()

        hidden_s = _hidden_seconds(generation, train_started, train_done)
        if not overlap and step + 1 < num_steps:
            generation = rollouts.submit(step + 1)

        last = step_metrics(
            trajectories, report.to_dict(), gen_report, train_stats, sync,
            waited_s=waited_s, train_s=train_s, busy_s=train_done - train_started, hidden_s=hidden_s,
            step_s=time.time() - step_started, version=trainer.version,
        )
        parts.log(step, last)
        if (step + 1) % parts.checkpoint_every == 0 or step + 1 == num_steps:
            trainer.save_checkpoint(parts.checkpoint_dir / f"step_{step + 1:06d}", {"next_step": step + 1})
        parts.on_step(step + 1, trainer.version, last)
    return last


def latest_checkpoint(checkpoint_dir: Path) -> Path | None:
    """The newest complete checkpoint the loop wrote there (`step_000012`), if any."""
    found = sorted(p for p in checkpoint_dir.glob("step_*") if (p / "loop_state.json").exists())
    return found[-1] if found else None


def _hidden_seconds(generation: Generation | None, start: float, end: float) -> float | None:
    """How much of [start, end] (training and weight sync) ran while the next step was generating
    (None when no next step was generating: the last step, or the loop without overlap)."""
    if generation is None:
        return None
    finished = generation.finished_at()
    if finished is None:
        return end - start
    return min(max(finished - start, 0.0), end - start)


def step_metrics(trajectories: list[Trajectory], batch: dict, gen: GenerationReport, train: dict,
                 sync: SyncStats | None, *, waited_s: float, train_s: float, busy_s: float, hidden_s: float | None,
                 step_s: float, version: int) -> dict:
    """One step's figures, as `metrics.jsonl`, W&B and the live view show them."""
    infra = Counter(t.cause.value for t in trajectories if t.cause is not None)
    injected = sum(1 for t in trajectories if t.metadata.get("injected"))
    first = gen.first_round_rewards
    generated_tokens = sum(t.num_generated_tokens for t in trajectories)
    start_latency = [t.timings["sandbox_start"] for t in trajectories if "sandbox_start" in t.timings]
    return {
        "policy_version": version,
        "reward_mean": sum(first) / len(first) if first else None,
        "pass_rate": sum(r >= 1.0 for r in first) / len(first) if first else None,
        "samples": len(trajectories),
        "infra_failures": sum(infra.values()),
        "infra_failures_by_cause": dict(infra),
        "injected_failures": injected,
        "batch": batch,
        "train": train,
        "generation_rounds": gen.rounds,
        "generation_s": gen.seconds,
        "wait_for_generation_s": waited_s,
        "train_s": train_s,
        "weight_sync_s": sync.seconds if sync is not None else None,
        "weight_sync_failed_engines": list(sync.failed) if sync is not None else [],
        "overlap_ratio": hidden_s / busy_s if hidden_s is not None and busy_s > 0 else None,
        "step_s": step_s,
        "tokens_per_s": generated_tokens / step_s if step_s > 0 else None,
        "samples_per_s": len(trajectories) / step_s if step_s > 0 else None,
        "sandbox_start_s_mean": sum(start_latency) / len(start_latency) if start_latency else None,
    }
