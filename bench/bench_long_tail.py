"""Benchmark: the long tail with and without carry-over (`[loop] over_sample`, issue 11 item 4).

    .venv/bin/python bench/bench_long_tail.py [--steps 10] [--no-write]

The real overlapped loop (`train_loop`), the real `Rollouts` (over-sampling, carry-over, cancelling),
the real `build_batch` with `grpo.max_staleness = 2` and the simulated trainer (a set step time, the
version bumped), over two Ray actors that stand in for the session actors: each session lasts a
time drawn from a lognormal with p99 = 10x the median, in four turns, each turn tagged with the policy
version the actor holds when it starts (the weight sync stand-in hands the actors each new version,
as a broadcast does to the engines). 32 groups of 8 samples a step. One run per row, the same draws:

- `over_sample = 0`: today's loop, every step waits for its slowest group;
- `over_sample = 0.5` and `1.0`: a step trains on the first 32 groups (and any others) that finish,
  the others are carried, a carried group that could only be stale is cancelled;
- `over_sample = 0.5` without the cancelling: stale carried groups run on and build_batch drops them.

Per row: mean step wall time (`step_s` of each row of the run), the group and session time p50/p99
(from every drawn time, cancelled ones included), the training step, the groups carried and
cancelled, the samples trained and dropped as stale, and the largest staleness the trainer was
handed (measured by the trainer: its version minus each sample's oldest turn's version). Rewrites
the `## Long tail: carry-over` section of docs/benchmarks.md unless `--no-write`.

What the stand-ins do not do: no engine, sandbox, tokenizer or verifier (tokens are synthetic, the
reward a coin flip); no capacity limit, so the extra sessions of over-sampling do not slow the others
down as they would on engines and nodes that are full; no gradient.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.report import write_section  # noqa: E402
from rl360cli.loop.config import LoopConfig  # noqa: E402
from rl360cli.loop.train_loop import LoopParts, train_loop  # noqa: E402
from rl360cli.outcome import Outcome  # noqa: E402
from rl360cli.rl.config import GRPOConfig  # noqa: E402
from rl360cli.rl.trajectory import Trajectory  # noqa: E402
from rl360cli.rollout.rollouts import Rollouts  # noqa: E402
from rl360cli.trainer.broadcast import SyncStats  # noqa: E402
from rl360cli.trainer.config import SimulatedTrainerConfig  # noqa: E402
from rl360cli.trainer.simulated import SimulatedTrainer  # noqa: E402

NUM_ACTORS = 2
NUM_TASKS = 256
GROUPS_PER_STEP = 32
SAMPLES_PER_GROUP = 8
SESSION_MEDIAN_S = 0.3
P99_RATIO = 10.0
TURNS = 4
TRAIN_STEP_S = 0.6
MAX_STALENESS = 2
# (label, over_sample, cancel stale carried groups)
ROWS = (("no carry-over (today)", 0.0, True), ("carry-over", 0.5, True), ("carry-over", 1.0, True),
        ("carry-over, no cancelling", 0.5, False))


class LognormalSessionActorStandIn:
    """Stands in for `SessionActor`'s `run_group` contract: (end time, serialized trajectories). Each
    session sleeps a lognormal time (median `median_s`, p99 `p99_ratio` x that) in `turns` equal
    turns, each tagged with the version the actor holds as it starts; the reward is a coin flip. It
    runs no engine or sandbox and has no capacity limit; `take_gauges` counts only sessions."""

    def __init__(self, index: int, median_s: float, p99_ratio: float, turns: int):
        self.index, self.median_s, self.turns = index, median_s, turns
        self.sigma = math.log(p99_ratio) / 2.3263478740408408  # p99 / median = exp(sigma * z99)
        self.reset(0)

    def reset(self, seed: int) -> None:
        self.rng = random.Random(seed * 1000 + self.index)
        self.version, self.done = 0, 0
        self.session_s: list[float] = []
        self.group_s: list[float] = []

    async def run_group(self, task_id: str, group_id: str, num_samples: int) -> tuple[float, list[bytes]]:
        times = [self.median_s * math.exp(self.rng.gauss(0.0, self.sigma)) for _ in range(num_samples)]
        self.session_s += times  # as drawn: a group cancelled later still counts
        self.group_s.append(max(times))
        samples = await asyncio.gather(*(self._session(task_id, group_id, i, t) for i, t in enumerate(times)))
        return time.time(), samples

    async def _session(self, task_id: str, group_id: str, index: int, seconds: float) -> bytes:
        versions = []
        for _ in range(self.turns):
            versions.append(self.version)
            await asyncio.sleep(seconds / self.turns)
        self.done += 1
        mask = np.array([0, 0] + [1, 1, 0] * self.turns, np.uint8)
        return Trajectory(task_id=task_id, group_id=group_id, sample_index=index,
                          token_ids=np.arange(1, len(mask) + 1, dtype=np.int32), loss_mask=mask,
                          logprobs=np.where(mask == 1, -0.5, 0.0).astype(np.float32), versions=tuple(versions),
                          num_prompt_tokens=2, reward=float(self.rng.random() < 0.5), outcome=Outcome.OK,
                          timings={"total": seconds}).to_bytes()

    async def set_version(self, version: int) -> None:
        self.version = version

    async def drawn(self) -> dict:
        return {"session_s": self.session_s, "group_s": self.group_s}

    async def take_gauges(self) -> dict:
        done, self.done = self.done, 0
        return {"sessions": {"max": 0, "mean": 0.0}, "sessions_done": done, "cpu_s": 0.0,
                "generate_requests": 0, "admission": None}


class ActorVersionSyncStandIn:
    """Stands in for the weight broadcast: hands the actors the new version; moves no weights."""

    def __init__(self, actors: list):
        self.actors = actors

    def broadcast(self, named_tensors, version: int) -> SyncStats:
        import ray

        ray.get([actor.set_version.remote(version) for actor in self.actors])
        return SyncStats(version=version, seconds=0.0, bytes=0, buckets=0, num_engines=len(self.actors))


class StalenessRecordingTrainer(SimulatedTrainer):
    """The simulated trainer, recording the largest staleness of each batch it was handed."""

    def __init__(self, step_s: float):
        super().__init__(SimulatedTrainerConfig(step_s=step_s))
        self.max_staleness_seen = 0

    def train_step(self, batch):
        self.max_staleness_seen = max(self.max_staleness_seen, int((self.version - batch.versions).max()))
        return super().train_step(batch)


def run_row(actors: list, *, over_sample: float, cancel_stale: bool, steps: int, seed: int) -> dict:
    import ray

    ray.get([actor.reset.remote(seed) for actor in actors])
    rollouts = Rollouts(actors, [f"t{i:03d}" for i in range(NUM_TASKS)], num_tasks_per_step=GROUPS_PER_STEP,
                        num_samples_per_task=SAMPLES_PER_GROUP, max_generation_rounds=1, seed=seed,
                        over_sample=over_sample, max_staleness=MAX_STALENESS, cancel_stale=cancel_stale)
    trainer = StalenessRecordingTrainer(TRAIN_STEP_S)
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="rl360-long-tail-") as folder:
        train_loop(LoopParts(rollouts=rollouts, trainer=trainer, weight_sync=ActorVersionSyncStandIn(actors),
                             loop=LoopConfig(num_steps=steps, num_tasks_per_step=GROUPS_PER_STEP,
                                             num_samples_per_task=SAMPLES_PER_GROUP, max_generation_rounds=1,
                                             over_sample=over_sample, max_steps_without_signal=0),
                             grpo=GRPOConfig(max_staleness=MAX_STALENESS), checkpoint_every=10_000,
                             checkpoint_dir=Path(folder) / "checkpoints",
                             log=lambda step, values: rows.append(values), on_step=lambda *args: None))
    drawn = ray.get([actor.drawn.remote() for actor in actors])
    sessions = [s for d in drawn for s in d["session_s"]]
    groups = [g for d in drawn for g in d["group_s"]]
    step_s = [r["step_s"] for r in rows]
    return {
        "step_mean": statistics.mean(step_s), "step_max": max(step_s),
        "group_p50": float(np.percentile(groups, 50)), "group_p99": float(np.percentile(groups, 99)),
        "session_p50": float(np.percentile(sessions, 50)), "session_p99": float(np.percentile(sessions, 99)),
        "train_s": statistics.mean(r["train_s"] for r in rows),
        "carried": sum(r["groups_carried_out"] for r in rows[:-1]),
        "cancelled_stale": sum(r["groups_cancelled_stale"] for r in rows),
        "cancelled_at_end": rows[-1].get("groups_cancelled_at_end", 0),
        "kept_per_step": statistics.mean(r["batch"]["kept"] for r in rows),
        "dropped_stale": sum(r["batch"]["dropped_stale"] for r in rows),
        "max_staleness_trained": trainer.max_staleness_seen,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()

    import ray

    began = time.time()
    ray.init(address="local", num_cpus=2, include_dashboard=False, configure_logging=False, log_to_driver=False)
    try:
        actor_class = ray.remote(LognormalSessionActorStandIn)
        actors = [actor_class.remote(i, SESSION_MEDIAN_S, P99_RATIO, TURNS) for i in range(NUM_ACTORS)]
        results = []
        for label, over_sample, cancel_stale in ROWS:
            result = run_row(actors, over_sample=over_sample, cancel_stale=cancel_stale, steps=args.steps,
                             seed=args.seed)
            results.append((label, over_sample, cancel_stale, result))
            print(f"{label} over_sample={over_sample} cancel={cancel_stale}: "
                  + ", ".join(f"{k}={v:.3g}" for k, v in result.items()), flush=True)
    finally:
        ray.shutdown()
    load = os.getloadavg()[0]

    header = ("| loop | over_sample | step wall time, mean (max) | group p50 / p99 | session p50 / p99 | training step "
              "| step / (group p50 + train) | step / (session p50 + train) "
              "| groups carried / cancelled stale / at the end "
              "| samples trained per step | dropped stale | staleness trained, max |")
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    for label, over_sample, cancel_stale, r in results:
        lines.append(
            f"| {label} | {over_sample:g} | {r['step_mean']:.2f} s ({r['step_max']:.2f} s) "
            f"| {r['group_p50']:.2f} / {r['group_p99']:.2f} s | {r['session_p50']:.2f} / {r['session_p99']:.2f} s "
            f"| {r['train_s']:.2f} s | {r['step_mean'] / (r['group_p50'] + r['train_s']):.2f} "
            f"| {r['step_mean'] / (r['session_p50'] + r['train_s']):.2f} "
            f"| {r['carried']} / {r['cancelled_stale']} / {r['cancelled_at_end']} "
            f"| {r['kept_per_step']:.0f} | {r['dropped_stale']} | {r['max_staleness_trained']} |")
    body = "\n".join([
        f"`bench/bench_long_tail.py` on this machine ({os.cpu_count()} cores, {platform.machine()}), "
        f"{time.strftime('%Y-%m-%d')}; {args.steps} steps a row, {time.time() - began:.0f} s in all, "
        f"load average {load:.1f} when it ended. The real overlapped loop, `Rollouts` and `build_batch` "
        f"(`max_staleness = {MAX_STALENESS}`), the simulated trainer ({TRAIN_STEP_S} s a step) and two stand-in "
        f"session actors: {GROUPS_PER_STEP} groups of {SAMPLES_PER_GROUP} a step, each session lognormal "
        f"(median {SESSION_MEDIAN_S} s, p99 = {P99_RATIO:g}x) in {TURNS} turns tagged with the version they ran on. "
        "A group ends with its slowest sample, so the group times are the ones a step waits for; the "
        "session times are per sample. Times are as drawn, cancelled groups included.",
        "",
        *lines,
    ])
    print(body)
    if not args.no_write:
        write_section("Long tail: carry-over", body + "\n\n" + READING)


READING = """\
How to read it (the design is in docs/architecture.md "The long tail"):
- Without carry-over a step waits for the slowest of its 32 groups: the group p99 or beyond.
- With carry-over the step trains on the first 32 groups that finish; the acceptance bound of
  issue 11 (mean step <= 1.5x (p50 + training step)) is read with the group p50 in the column
  `step / (group p50 + train)`, and with the per-sample p50 in the next column, which only a larger
  over-sample meets: a group is 8 sessions, and its median is the median of their maximum.
- Cancelling: a carried group that began more than `max_staleness` versions before the version
  the next step is to be trained at can only be dropped by build_batch; cancelling it frees its
  place in flight for a fresh group (the row without cancelling runs it to the end, and build_batch
  drops its samples as stale). The stand-ins have no capacity limit, so the freed place shows here
  as samples trained, not as step time; on full engines and nodes it is also the cancelled
  sessions' compute.
- `staleness trained, max` is measured by the trainer on the batches it was handed: never above the
  bound."""


if __name__ == "__main__":
    main()
