"""Benchmark of the torch trainer's update: each distinct prompt once (`trainer.share_prompts`) against
the plain forward pass, and one math thread against every core.

Run: `.venv/bin/python bench/bench_trainer.py` (about three minutes on 2 cores). Batches as GRPO makes
them, groups of 8 samples kept, each group's samples after the same prompt, on policy v0 of
recipes/local-smoke.toml. `local-smoke`: 30 groups, prompts of 50-60 tokens and two turns of 16-24
tokens with a 6-token observation between (a step of that recipe); `long prompts`: 8 groups, prompts
of 1,000-1,100 tokens and 100-320 tokens of their own (an agent's task statement and tool schema
before short turns). Writes the `## Torch trainer: shared prompts` section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.report import write_section  # noqa: E402
from rl360cli.outcome import Outcome  # noqa: E402
from rl360cli.rl.batch import build_batch  # noqa: E402
from rl360cli.rl.config import GRPOConfig  # noqa: E402
from rl360cli.rl.trajectory import Trajectory  # noqa: E402
from rl360cli.trainer.config import TrainerConfig  # noqa: E402
from rl360cli.trainer.torch_trainer import TorchTrainer  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
POLICY_V0 = REPO / "recipes" / "models" / "local-smoke-v0"
SAMPLES = 8
# name: (groups, then as ranges: prompt tokens, own generated tokens, observation tokens, final generated tokens)
SHAPES = {"local-smoke": (30, (50, 60), (14, 22), (6, 6), (2, 2)),
          "long prompts": (8, (1000, 1100), (60, 200), (20, 80), (20, 40))}


def step_batch(shape, vocab: int, seed: int = 0):
    """GRPO's batch of groups x SAMPLES two-turn samples, a group's samples after one prompt."""
    rng = np.random.default_rng(seed)
    groups, (p_lo, p_hi), (g_lo, g_hi), (o_lo, o_hi), (f_lo, f_hi) = shape
    trajectories = []
    for group in range(groups):
        prompt = rng.integers(2, vocab, size=int(rng.integers(p_lo, p_hi + 1)))
        for sample in range(SAMPLES):
            turns = [int(rng.integers(g_lo, g_hi + 1)), int(rng.integers(o_lo, o_hi + 1)),
                     int(rng.integers(f_lo, f_hi + 1))]
            mask = np.concatenate([np.zeros(len(prompt)), np.ones(turns[0]), np.zeros(turns[1]),
                                   np.ones(turns[2])]).astype(np.uint8)
            ids = np.concatenate([prompt, rng.integers(2, vocab, size=len(mask) - len(prompt))]).astype(np.int32)
            trajectories.append(Trajectory(
                task_id=f"t{group}", group_id=f"g{group}", sample_index=sample, token_ids=ids, loss_mask=mask,
                logprobs=np.where(mask == 1, -rng.random(len(mask)), 0.0).astype(np.float32), versions=(0, 0),
                num_prompt_tokens=len(prompt), reward=float(sample % 2), outcome=Outcome.OK))
    batch, _ = build_batch(trajectories, **GRPOConfig().batch_kwargs())
    return batch


def seconds_per_update(batch, *, share: bool, repeats: int) -> float:
    trainer = TorchTrainer(POLICY_V0, TrainerConfig(num_epochs=2, share_prompts=share), GRPOConfig())
    trainer.train_step(batch)  # the first update allocates the optimizer's state
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        trainer.train_step(batch)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    vocab = int(json.loads((POLICY_V0 / "config.json").read_text())["vocab_size"])
    cores = os.cpu_count() or 1
    rows = []
    for name, shape in SHAPES.items():
        batch = step_batch(shape, vocab)
        tokens = int(batch.lengths.sum())
        for threads in sorted({1, cores}):
            torch.set_num_threads(threads)
            plain = seconds_per_update(batch, share=False, repeats=args.repeats)
            shared = seconds_per_update(batch, share=True, repeats=args.repeats)
            rows.append(f"| {name} | {batch.num_sequences} x {tokens / batch.num_sequences:.0f} | {threads} | "
                        f"{plain:.2f} s | {shared:.2f} s | {plain / shared:.1f}x |")
            print(rows[-1], flush=True)
    body = "\n".join([
        "`bench/bench_trainer.py`: one update of the torch trainer (2 passes, AdamW) on policy v0 of local-smoke "
        f"(2 layers, 128 wide), groups of {SAMPLES} samples that share their group's prompt; the median of "
        f"{args.repeats} updates after a first one. Plain: the whole of every sequence through the model; shared "
        "(`trainer.share_prompts`, the default): each distinct prompt once, every sample after its keys and values "
        "(the same logprobs and gradient: tests/trainer/test_shared_prompts.py).",
        "",
        "| batch | sequences x mean tokens | threads | plain | shared | faster |",
        "|---|---|---|---|---|---|",
        *rows,
        "",
        f"Measured {time.strftime('%Y-%m-%d')} on {cores} cores ({platform.processor() or platform.machine()}), "
        f"torch {torch.__version__}.",
    ])
    if not args.no_write:
        write_section("Torch trainer: shared prompts", body)


if __name__ == "__main__":
    main()
