"""Benchmark: the same recipe with the loop overlapped and synchronous.

With `overlap = true` generation of step k+1 runs while the trainer updates on
step k; with `overlap = false` it waits for the update and the weight sync. On
a cluster the two run on different nodes. Here the profile pins the tiers to
different cores (rollout and service on CPU 0, training on CPU 1), the nearest
a 2-core machine comes to separate allocations, and the recipe gives the
trainer about as much work as generation (several passes over each batch), the
case overlap is for. Every step trains on all 256 samples (no filtering, one
generation round), so steps are comparable.

    .venv/bin/python bench/bench_overlap.py [--steps 6]     # writes the "Overlap" section of docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.report import write_section  # noqa: E402

REPO = Path(__file__).resolve().parents[1]

PROFILE = """
name = "overlap-bench"
backend = "local"
base_port = {base}
sync_port = {sync}
[tiers.service]
share = 0.25
cpu_list = [0]
[tiers.rollout]
share = 0.25
cpu_list = [0]
[tiers.training]
share = 0.5
cpu_list = [1]
"""

RECIPE = """
[run]
name = "overlap-{mode}"
seed = 3
profile = "profile.toml"
[tasks]
path = "{tasks}"
[model]
kind = "tiny"
warmup_steps = 172
[rollout]
max_new_tokens = 48
max_total_tokens = 512
num_session_actors = 2
[engine]
num_threads = 1
max_batch_size = 64
[sandbox]
cpus = 0.05
memory_mb = 256
[trainer]
lr = 1e-4
num_epochs = {epochs}
[grpo]
filter_zero_std = false
[loop]
num_steps = {steps}
num_tasks_per_step = 32
num_samples_per_task = 8
max_generation_rounds = 1
overlap = {overlap}
[metrics]
wandb = false
"""


def run(mode: str, *, steps: int, epochs: int, base: int) -> list[dict]:
    folder = Path(tempfile.mkdtemp(prefix=f"rl360-overlap-{mode}-"))
    (folder / "profile.toml").write_text(PROFILE.format(base=base, sync=base + 50))
    (folder / "recipe.toml").write_text(RECIPE.format(
        mode=mode, tasks=REPO / "recipes/tasks/arith-32", epochs=epochs, steps=steps,
        overlap="true" if mode == "on" else "false"))
    state = folder / "state.json"
    env = {**os.environ, "RL360_STATE": str(state)}
    proc = subprocess.run([sys.executable, "-m", "rl360cli", "up", "--recipe", "recipe.toml"], cwd=folder, env=env,
                          capture_output=True, text=True)
    subprocess.run([sys.executable, "-m", "rl360cli", "down"], cwd=folder, env=env, capture_output=True)
    if proc.returncode != 0:
        raise SystemExit(f"overlap {mode}: rl360 up failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    doc = json.loads(state.read_text())
    metrics = Path(doc["runs"][doc["current_run"]]["metrics_path"])
    return [json.loads(line) for line in metrics.read_text().splitlines()]


def summarise(rows: list[dict]) -> dict:
    # The first step includes start-up (Ray, the first batch); the last has no next batch to overlap.
    steady = rows[1:-1]
    return {
        "samples_per_s": sum(r["samples"] for r in steady) / sum(r["step_s"] for r in steady),
        "step_s": statistics.median(r["step_s"] for r in steady),
        "generation_s": statistics.median(r["generation_s"] for r in steady),
        "train_s": statistics.median(r["train_s"] for r in steady),
        "sync_s": statistics.median(r["weight_sync_s"] for r in steady),
        "overlap_ratio": statistics.median(r["overlap_ratio"] for r in steady)
        if all(r["overlap_ratio"] is not None for r in steady) else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--epochs", type=int, default=8, help="passes over each batch: the trainer's work")
    args = parser.parse_args()
    started = time.time()
    figures = {mode: summarise(run(mode, steps=args.steps, epochs=args.epochs, base=base))
               for mode, base in (("on", 34000), ("off", 34200))}
    on, off = figures["on"], figures["off"]
    ratio = on["samples_per_s"] / off["samples_per_s"]
    lines = [
        f"local-smoke's tasks and policy, {args.steps} steps of 256 samples, {args.epochs} passes over each batch; "
        "tiers pinned: rollout and service on CPU 0, training on CPU 1 (`bench/bench_overlap.py`).",
        "",
        "| loop | samples/s | step s (median) | generation s | train s | weight sync s | overlap ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    for mode in ("on", "off"):
        f = figures[mode]
        ratio_text = f"{f['overlap_ratio']:.2f}" if f["overlap_ratio"] is not None else "-"
        lines.append(f"| overlap {mode} | {f['samples_per_s']:.1f} | {f['step_s']:.1f} | {f['generation_s']:.1f} | "
                     f"{f['train_s']:.1f} | {f['sync_s']:.3f} | {ratio_text} |")
    lines += [
        "",
        f"Throughput with overlap: **{ratio:.2f}×** the synchronous loop. The overlap ratio is the share of "
        "training and weight-sync time during which the next batch was generating. Steps 2 to "
        f"{args.steps - 1} counted (the first holds start-up, the last has nothing to overlap with). "
        f"Measured {time.strftime('%Y-%m-%d')} in {time.time() - started:.0f} s.",
    ]
    write_section("Overlap", "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
