"""Benchmark of the RL core: build_batch over a realistic step, serialisation, compaction.

Run: `.venv/bin/python bench/bench_rl_core.py` (about 15 s; 1.5 GB of memory). It pins itself to
one core, prints the figures and writes them into the `## RL core` section of docs/benchmarks.md,
leaving the other sections alone. Targets (issue 3): build_batch of 8,192 trajectories (1,024
groups of 8, 2k-8k tokens each) under 2 s on one core; compaction of a trajectory that carries the
routing ids of a 48-layer top-8 MoE over 32k tokens at least 50x smaller.
"""

import os

# One core: set before numpy and torch start their thread pools.
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import base64  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.report import BENCHMARKS, write_section  # noqa: E402
from rl360cli.rl.batch import build_batch  # noqa: E402
from rl360cli.outcome import InfraCause, Outcome  # noqa: E402
from rl360cli.rl.trajectory import Trajectory  # noqa: E402

TITLE = "RL core"

NUM_GROUPS = 1024
GROUP_SIZE = 8
CURRENT_VERSION = 10
INFRA_RATE = 0.05
MICRO_BATCH_TOKENS = 16_384


def conversation_mask(rng: np.random.Generator, length: int, num_prompt: int) -> np.ndarray:
    """A multi-turn loss mask: prompt, then generated turns separated by tool observations."""
    mask = np.zeros(length, dtype=np.uint8)
    position = num_prompt
    while position < length:
        generated = int(rng.integers(100, 800))
        mask[position : position + generated] = 1
        position += generated + int(rng.integers(50, 600))
    return mask


def make_step(seed: int = 0) -> list[Trajectory]:
    """1,024 groups of 8 agentic trajectories of 2k-8k tokens, with failures and stale samples."""
    rng = np.random.default_rng(seed)
    num = NUM_GROUPS * GROUP_SIZE
    lengths = rng.integers(2048, 8193, size=num)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    token_pool = rng.integers(0, 151_936, size=int(offsets[-1]), dtype=np.int32)
    logprob_pool = -rng.exponential(0.5, size=int(offsets[-1])).astype(np.float32)
    causes = list(InfraCause)
    trajectories = []
    for i in range(num):
        group, start, stop = i // GROUP_SIZE, offsets[i], offsets[i + 1]
        if i % GROUP_SIZE == 0:
            pass_probability = rng.random()
        num_prompt = int(rng.integers(512, 1536))
        mask = conversation_mask(rng, int(lengths[i]), num_prompt)
        infra = rng.random() < INFRA_RATE
        num_turns = max(1, int(np.count_nonzero(np.diff(mask.astype(np.int8)) == 1)))
        oldest = CURRENT_VERSION - int(rng.choice([0, 0, 0, 1, 1, 2]))  # some samples two steps old
        trajectories.append(
            Trajectory(
                task_id=f"task-{group}",
                group_id=f"group-{group}",
                sample_index=i % GROUP_SIZE,
                token_ids=token_pool[start:stop],
                loss_mask=mask,
                logprobs=np.where(mask == 1, logprob_pool[start:stop], np.float32(0.0)),
                versions=[oldest] + [CURRENT_VERSION] * (num_turns - 1),
                num_prompt_tokens=num_prompt,
                reward=None if infra else float(rng.random() < pass_probability),
                outcome=Outcome.INFRA_FAILURE if infra else Outcome.OK,
                cause=causes[int(rng.integers(len(causes)))] if infra else None,
                timings={"sandbox_start": 2.0, "generate": 40.0, "verify": 5.0},
                metadata={"turns": [{"finish_reason": "tool_call"}] * num_turns},
            )
        )
    return trajectories


def timed(function, repeats: int) -> tuple[float, list[float], object]:
    """First call's seconds (cold: fresh memory), the following calls' seconds, the last result."""
    times = []
    result = None
    for _ in range(repeats + 1):
        result = None  # free the previous result, so the next call can reuse its memory
        start = time.perf_counter()
        result = function()
        times.append(time.perf_counter() - start)
    return times[0], times[1:], result


def bench_build_batch(trajectories: list[Trajectory]) -> dict:
    def build():
        return build_batch(trajectories, max_staleness=1, current_version=CURRENT_VERSION)

    cold, warm, (batch, report) = timed(build, repeats=3)
    # The heaviest case: no dynamic filtering, no staleness bound, every valid sample kept.
    _, keep_all_warm, (all_batch, all_report) = timed(lambda: build_batch(trajectories, filter_zero_std=False), 2)
    keep_all_tokens = int(all_batch.packed_input_ids.shape[0])
    del all_batch

    def split():
        # What a training loop does: take each padded micro-batch in turn, use it, let it go.
        padded_tokens = 0
        parts = batch.split(MICRO_BATCH_TOKENS)
        for micro in parts:
            padded_tokens += micro.num_tokens
        return len(parts), padded_tokens

    split_cold, split_warm, (num_parts, padded_tokens) = timed(split, repeats=2)
    return {
        "num_trajectories": len(trajectories),
        "num_tokens": sum(t.num_tokens for t in trajectories),
        "cold_s": cold,
        "warm_s": statistics.median(warm),
        "kept": report.kept,
        "kept_tokens": int(batch.packed_input_ids.shape[0]),
        "report": report,
        "keep_all_s": statistics.median(keep_all_warm),
        "keep_all_kept": all_report.kept,
        "keep_all_tokens": keep_all_tokens,
        "split_cold_s": split_cold,
        "split_warm_s": statistics.median(split_warm),
        "num_micro_batches": num_parts,
        "padding_fraction": 1 - batch.packed_input_ids.shape[0] / padded_tokens,
    }


def bench_serialisation(trajectories: list[Trajectory], count: int = 1024) -> dict:
    sample = trajectories[:count]
    start = time.perf_counter()
    blobs = [t.to_bytes() for t in sample]
    write = time.perf_counter() - start
    start = time.perf_counter()
    back = [Trajectory.from_bytes(blob) for blob in blobs]
    read = time.perf_counter() - start
    assert back == sample
    return {
        "count": count,
        "mean_kib": sum(map(len, blobs)) / count / 1024,
        "write_ms": write / count * 1e3,
        "read_ms": read / count * 1e3,
        "tokens_per_traj": sum(t.num_tokens for t in sample) / count,
    }


def routed_trajectory(encoding: str, *, num_tokens=32_768, num_layers=48, top_k=8, num_turns=16) -> Trajectory:
    """A 32k-token agentic trajectory whose turns carry MoE routing ids, raw responses and logs.

    `encoding` "base64" is SGLang's `routed_experts` (int32 bytes, base64); "list" keeps the ids as
    msgpack lists of ints (one byte each for ids < 128), the most compact a decoded copy gets.
    """
    rng = np.random.default_rng(1)
    num_prompt = 2048
    mask = conversation_mask(rng, num_tokens, num_prompt)
    per_turn = num_tokens // num_turns
    turns = []
    for turn in range(num_turns):
        ids = rng.integers(0, 128, size=(per_turn, num_layers, top_k), dtype=np.int32)
        routed = base64.b64encode(ids.tobytes()).decode() if encoding == "base64" else ids.reshape(-1).tolist()
        turns.append({
            "finish_reason": "tool_call", "prompt_tokens": num_prompt + turn * per_turn, "cached_tokens": turn * per_turn,
            "routed_experts": routed,
            "raw_response": {"text": "x" * 4000, "meta_info": {"id": f"req-{turn}", "e2e_latency": 1.5}},
            "logs": {"stdout": "log line\n" * 2000},
        })  # fmt: skip
    return Trajectory(
        task_id="swe-task", group_id="group-0", sample_index=0,
        token_ids=rng.integers(0, 151_936, size=num_tokens, dtype=np.int32), loss_mask=mask,
        logprobs=np.where(mask == 1, -rng.exponential(0.5, size=num_tokens), 0.0).astype(np.float32),
        versions=[3] * num_turns, num_prompt_tokens=num_prompt, reward=1.0, outcome=Outcome.OK,
        timings={"generate": 300.0}, metadata={"turns": turns, "node": "node-07"},
    )  # fmt: skip


def bench_compaction() -> dict:
    out = {}
    for encoding in ("base64", "list"):
        trajectory = routed_trajectory(encoding)
        start = time.perf_counter()
        compacted, report = trajectory.compact()
        seconds = time.perf_counter() - start
        out[encoding] = {"before": report.bytes_before, "after": report.bytes_after, "ratio": report.ratio, "s": seconds}
    return out


def render(build: dict, serial: dict, compaction: dict) -> str:
    report = build["report"]
    lines = [
        f"`bench/bench_rl_core.py`, one core pinned ({platform.processor() or platform.machine()}, "
        f"torch {torch.__version__.split('+')[0]}, numpy {np.__version__}), {time.strftime('%Y-%m-%d')}; "
        f"load average {os.getloadavg()[0]:.1f} while it ran (other work on the machine slows the figures).",
        "",
        f"**build_batch**: {build['num_trajectories']:,} trajectories ({NUM_GROUPS:,} groups of {GROUP_SIZE}, "
        f"2,048-8,192 tokens each, {build['num_tokens'] / 1e6:.1f}M tokens, multi-turn masks, "
        f"{INFRA_RATE:.0%} infra failures, staleness 0-2 with max_staleness 1).",
        "",
        "| measure | seconds |",
        "|---|---|",
        f"| build_batch, first call (fresh memory) | {build['cold_s']:.2f} |",
        f"| build_batch, steady state (median of 3) | {build['warm_s']:.2f} |",
        f"| build_batch keeping every valid sample ({build['keep_all_kept']:,}, {build['keep_all_tokens'] / 1e6:.1f}M tokens), steady state | {build['keep_all_s']:.2f} |",
        f"| split and pad, one after the other, {build['num_micro_batches']} micro-batches of <= "
        f"{MICRO_BATCH_TOKENS:,} tokens, first call | {build['split_cold_s']:.2f} |",
        f"| the same, steady state (median of 2) | {build['split_warm_s']:.2f} |",
        "",
        f"Kept {report.kept:,} samples ({build['kept_tokens'] / 1e6:.1f}M tokens); masked {report.masked}, "
        f"filtered (zero std) {report.filtered_zero_std}, stale {report.dropped_stale}, too few valid "
        f"{report.dropped_too_few_valid}. Padding in the micro-batches: {build['padding_fraction']:.2%} of tokens. "
        "A first call pays the kernel's page faults on its fresh memory; in the training loop every "
        "later step reuses it. The padded micro-batches are what the forward passes take.",
        "",
        f"**Serialisation** ({serial['count']} trajectories of {serial['tokens_per_traj']:,.0f} tokens on average): "
        f"{serial['mean_kib']:.0f} KiB each, to_bytes {serial['write_ms']:.2f} ms, from_bytes {serial['read_ms']:.2f} ms "
        "(from_bytes validates the trajectory).",
        "",
        "**Compaction** of a 32,768-token, 16-turn trajectory carrying the routing ids of a 48-layer top-8 MoE "
        "(12.6M ids), a raw response and 18 KB of logs per turn, with the default log budget (32,768 chars):",
        "",
        "| routing ids stored as | before | after | smaller by | seconds |",
        "|---|---|---|---|---|",
    ]
    names = {"base64": "SGLang's base64 int32", "list": "msgpack list of ints (1 byte each)"}
    for encoding, figures in compaction.items():
        lines.append(
            f"| {names[encoding]} | {figures['before'] / 1e6:.1f} MB | {figures['after'] / 1e3:.0f} KB | "
            f"{figures['ratio']:.0f}x | {figures['s']:.2f} |"
        )
    return "\n".join(lines) + "\n"



def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-write", action="store_true", help="print the figures, leave docs/benchmarks.md alone")
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    torch.set_num_threads(1)

    print("generating the step ...", flush=True)
    trajectories = make_step()
    build = bench_build_batch(trajectories)
    serial = bench_serialisation(trajectories)
    del trajectories
    compaction = bench_compaction()
    text = render(build, serial, compaction)
    print(f"## {TITLE}\n\n{text}")
    if not args.no_write:
        write_section(TITLE, text)
        print(f"wrote the '{TITLE}' section of {BENCHMARKS.relative_to(REPO)}")


if __name__ == "__main__":
    main()
