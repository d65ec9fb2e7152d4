"""A Ray actor that stands in for the session actors in the carry-over tests (tests/loop/test_carry_over.py).

Kept apart from the tests so that the actor's worker process imports only this module, numpy and
the trajectory type (not torch): an actor starts in a second instead of ten on a loaded machine.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np

from rl360cli.outcome import Outcome
from rl360cli.rl.trajectory import Trajectory


class GatedSessionActorStandIn:
    """Stands in for `SessionActor` (rl360cli/rollout/session_actor.py) with its `run_group` contract:
    (end time, serialized trajectories). Each sample is a synthetic two-turn trajectory whose first
    turn is tagged with the policy version the actor holds when the group starts and whose second
    with the one it holds when the group ends; rewards alternate 0/1 (every group has signal) except
    for tasks in `flat` (all 0). A group named in `holds` ends only once the version has moved
    `holds[group_id]` past its start; the others end at once. It runs no engine, sandbox or session:
    `set_version` is what a weight broadcast does to the engines; `take_gauges` reports only the
    groups' sessions (no admission, pulls, CPU or requests)."""

    def __init__(self):
        self.configure({})

    def configure(self, holds: dict[str, int], flat: frozenset[str] = frozenset()) -> None:
        """Start over (a test of its own): these holds and flat tasks, version 0, nothing recorded."""
        self.holds, self.flat = dict(holds), frozenset(flat)
        self.version = 0
        self.changed = asyncio.Condition()
        self.running: set[str] = set()
        self.cancelled: list[str] = []
        self.sessions_done = 0

    async def run_group(self, task_id: str, group_id: str, num_samples: int) -> tuple[float, list[bytes]]:
        start = self.version
        self.running.add(group_id)
        try:
            if group_id in self.holds:
                async with self.changed:
                    await self.changed.wait_for(lambda: self.version >= start + self.holds[group_id])
            blobs = [synthetic_sample(task_id, group_id, i, (start, self.version), flat=task_id in self.flat).to_bytes()
                     for i in range(num_samples)]
            self.sessions_done += num_samples
            return time.time(), blobs
        except asyncio.CancelledError:
            self.cancelled.append(group_id)
            raise
        finally:
            self.running.discard(group_id)

    async def set_version(self, version: int) -> None:
        async with self.changed:
            self.version = version
            self.changed.notify_all()

    async def report(self) -> dict:
        return {"running": sorted(self.running), "cancelled": list(self.cancelled)}

    async def take_gauges(self) -> dict:
        done, self.sessions_done = self.sessions_done, 0
        return {"sessions": {"max": len(self.running), "mean": 0.0}, "sessions_done": done, "cpu_s": 0.0,
                "generate_requests": 0, "admission": None}


def synthetic_sample(task_id: str, group_id: str, index: int, versions: tuple[int, int], *, flat: bool) -> Trajectory:
    """Two generated turns of two tokens each after a three-token prompt, tagged with `versions`."""
    mask = np.array([0, 0, 0, 1, 1, 0, 1, 1], np.uint8)
    return Trajectory(task_id=task_id, group_id=group_id, sample_index=index,
                      token_ids=np.arange(1, 9, dtype=np.int32), loss_mask=mask,
                      logprobs=np.where(mask == 1, -0.5, 0.0).astype(np.float32), versions=versions,
                      num_prompt_tokens=3, reward=0.0 if flat else float(index % 2), outcome=Outcome.OK,
                      timings={"total": 0.01})
