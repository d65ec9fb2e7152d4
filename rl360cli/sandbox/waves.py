"""Admission waves: when and where sandboxes start, so that a thousand attempts do not start at once.

The `AdmissionController` wraps a provider and is itself a `SandboxProvider`:

- at most `max_concurrent` sandboxes live at once;
- starts are admitted in waves: no window of `wave_interval_s` seconds sees more
  than `wave_size` starts (a sliding window, so it holds for every window, not
  only aligned ones); with `adaptive_waves` the wave grows by half while the
  median start latency stays under `target_start_latency_s` and nothing fails,
  and halves when a start fails or the median exceeds twice the target;
- per-node caps from the CPU and memory reservations: a node is never
  over-committed (the sum of its sandboxes' reservations stays within its
  `cpus` and `memory_mb`);
- placement prefers a node whose image cache holds the task's image (by digest
  when the expected digest is known), among those one whose warm pool holds a
  sandbox of the task (`pooled_nodes`), least loaded first, else the least-loaded
  node; a node whose daemon stopped answering gets nothing for `node_down_s`;
- a start that fails for an infrastructure reason is retried on another node,
  up to `max_infra_retries` times, after `retry_backoff_s * 2**k` seconds.

Every admission is recorded (`records`: when, where, queue time, start latency,
warm or cold, outcome; the last `RECORDS_KEPT` of them, so that a session actor
of a week-long run does not grow with every sandbox it ever started), and
`warm_start_ratio()` says how many starts of the whole run found their image
on the node. For each step's figures it also keeps running counters
(`take_gauges()`: the queue's length, the waits, sandboxes live, starts warm and
cold since the last call), O(1) per event, so a step's row never walks `records`.
`run_attempt(...)` also retries whole attempts that ended in a retriable infra
failure, for agents that can be run again.

Test: tests/sandbox/test_waves.py (with the process provider and with 3 dev Docker nodes).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from rl360cli.errors import Rl360Error
from rl360cli.metrics import Histogram, Level
from rl360cli.sandbox.attempt import run_attempt
from rl360cli.sandbox.config import SandboxConfig
from rl360cli.sandbox.provider import NodeCapacity, Sandbox, SandboxProvider, WrappedProvider, WrappedSandbox
from rl360cli.sandbox.taxonomy import Event, InfraError, SandboxError

# The start records a controller keeps (the latest): `summary()` and the wave size's adaptation read them.
RECORDS_KEPT = 10_000


@dataclass(kw_only=True)
class StartRecord:
    """One admitted start."""

    attempt_id: str
    task_id: str
    node: str
    # time.monotonic() when the start was admitted (the provider's start began), and the wall clock then.
    admitted_at: float
    admitted_wall: float
    # Seconds between asking for a sandbox and being admitted.
    queued_s: float
    # Seconds the provider's start took (None while it runs).
    start_latency_s: float | None = None
    ok: bool | None = None
    cause: str | None = None
    # The node's cache held the image when the sandbox was placed.
    warm: bool = False
    wave_size: int = 0
    retry: int = 0


@dataclass
class _Node:
    capacity: NodeCapacity
    reserved_cpus: float = 0.0
    reserved_mb: int = 0
    reserved_gpus: int = 0
    live: int = 0
    down_until: float = 0.0
    images: dict[str, str | None] = field(default_factory=dict)
    peak_cpus: float = 0.0
    peak_mb: int = 0

    def fits(self, cpus: float, memory_mb: int, gpus: int = 0) -> bool:
        return (self.reserved_cpus + cpus <= self.capacity.cpus + 1e-9
                and self.reserved_mb + memory_mb <= self.capacity.memory_mb
                and self.reserved_gpus + gpus <= self.capacity.gpus)

    @property
    def load(self) -> float:
        return max(self.reserved_cpus / self.capacity.cpus, self.reserved_mb / self.capacity.memory_mb)


class AdmissionController(WrappedProvider):
    """See the module docstring. `node_images` is what each node's cache holds, `{node: {image_ref: digest}}`
    (a digest of None: the image is there, its digest unknown), as `rl360cli.state.queries.image_digests` reads it."""

    def __init__(self, provider: SandboxProvider, *, config: SandboxConfig,
                 node_images: Mapping[str, Mapping[str, str | None]] | None = None,
                 image_digests: Mapping[str, str] | None = None,
                 clock: Callable[[], float] = time.monotonic):
        super().__init__(provider)
        self.config = config
        self.clock = clock
        self.nodes_state = {c.name: _Node(capacity=c) for c in provider.nodes()}
        for name, images in (node_images or {}).items():
            if name in self.nodes_state:
                self.nodes_state[name].images = dict(images)
        # The digest each image ref should have (from the image list); a cached image with another digest is cold.
        self.image_digests = dict(image_digests or {})
        self.wave_size = config.wave_size
        self.wave_history: list[tuple[float, int]] = [(clock(), self.wave_size)]
        self.records: list[StartRecord] = []
        # Starts that succeeded, warm or cold, over the whole run (the records keep only the last ones).
        self._started: collections.Counter[str] = collections.Counter()
        self._recent_starts: collections.deque[float] = collections.deque()
        self._live = 0
        self._queue: collections.deque[asyncio.Future] = collections.deque()
        self._changed: asyncio.Condition | None = None
        self._changed_loop: asyncio.AbstractEventLoop | None = None
        # Running counters for each step's figures (`take_gauges`, read by rl360cli/rollout/gauges.py).
        self.waiting = Level(clock)  # starts in the admission queue
        self.queue_wait = Histogram()  # seconds each admitted start waited
        self.live_level = Level(clock)  # sandboxes admitted and not yet released
        self._outcomes: collections.Counter[str] = collections.Counter()

    # ------------------------------------------------------------------ the SandboxProvider interface

    async def start(self, task, *, attempt_id: str, labels: Mapping[str, str], node: str | None = None) -> Sandbox:
        """Wait for admission, place, start; infra failures of the start are retried on another node."""
        cpus, memory_mb = self.footprint(task)  # with its sidecars: they run beside it on the node
        gpus = getattr(task, "gpus", 0)  # never over a node's GPUs, as never over its CPUs and memory
        self._check_fits_somewhere(task, cpus, memory_mb, gpus)
        excluded: set[str] = set()
        retry = 0
        while True:
            record, chosen = await self._admit(task, attempt_id, cpus, memory_mb, gpus, node, excluded, retry)
            began = self.clock()
            try:
                sandbox = await self.inner.start(task, attempt_id=attempt_id, labels=labels, node=chosen)
            except BaseException as e:
                record.start_latency_s = self.clock() - began
                record.ok = False
                record.cause = e.cause.value if isinstance(e, InfraError) else type(e).__name__
                self._outcomes["failed"] += 1
                await self._release(chosen, cpus, memory_mb, gpus)
                self._adapt()
                if not isinstance(e, SandboxError) or not e.retriable or retry >= self.config.max_infra_retries:
                    raise
                if e.event == Event.NODE_UNREACHABLE:
                    self.nodes_state[chosen].down_until = self.clock() + self.config.node_down_s
                if node is None:
                    excluded.add(chosen)
                await asyncio.sleep(self.config.retry_backoff_s * 2**retry)
                retry += 1
                continue
            record.start_latency_s = self.clock() - began
            record.ok = True
            self._outcomes["warm" if record.warm else "cold"] += 1
            self._started["warm" if record.warm else "cold"] += 1
            self.nodes_state[chosen].images.setdefault(self.image_ref(task), None)
            self._adapt()
            return _Admitted(sandbox, self, cpus, memory_mb, gpus, record)

    async def detach(self, sandbox: Sandbox) -> dict[str, Any]:
        inner = sandbox.inner if isinstance(sandbox, _Admitted) else sandbox
        return await self.inner.detach(inner)

    # ------------------------------------------------------------------ whole attempts

    async def run_attempt(self, task, agent, *, attempt_id: str, labels: Mapping[str, str] | None = None,
                          rerun_agent: bool = False, **kwargs):
        """`attempt.run_attempt` through this controller. A start failure is retried inside `start`; with
        `rerun_agent`, an attempt that failed later for a retriable infra reason (its node was lost
        mid-attempt) is run again on another node — only for agents that can start over."""


        nodes_tried: list[str] = []
        causes: list[str] = []
        retries = 0
        while True:
            result = await run_attempt(self, task, agent, attempt_id=attempt_id, labels=labels, **kwargs)
            if result.node:
                nodes_tried.append(result.node)
            again = (rerun_agent and result.retriable and "start" in result.timings and "agent" in result.timings
                     and retries < self.config.max_infra_retries)
            if not again:
                return replace(result, retries=retries, nodes_tried=tuple(nodes_tried), retried_causes=tuple(causes))
            causes.append(f"{result.node}: {result.cause.value if result.cause else '?'}")
            if result.node and result.cause and result.cause.value == "node_lost":
                self.nodes_state[result.node].down_until = self.clock() + self.config.node_down_s
            await asyncio.sleep(self.config.retry_backoff_s * 2**retries)
            retries += 1

    # ------------------------------------------------------------------ accounting

    def warm_start_ratio(self) -> float | None:
        done = self._started["warm"] + self._started["cold"]
        return self._started["warm"] / done if done else None

    def take_gauges(self) -> dict[str, Any]:
        """The figures since the last call, and start the next interval: the admission queue's length
        (`Level.take`), the admitted starts' waits (`Histogram.take`), sandboxes live, starts that found
        their image on the node (warm), that did not (cold) and that failed."""
        outcomes, self._outcomes = self._outcomes, collections.Counter()
        return {"queue": self.waiting.take(), "queue_wait_s": self.queue_wait.take(),
                "sandboxes": self.live_level.take(), "warm_starts": outcomes["warm"],
                "cold_starts": outcomes["cold"], "failed_starts": outcomes["failed"]}

    def summary(self) -> dict[str, Any]:
        done = [r.start_latency_s for r in self.records if r.ok and r.start_latency_s is not None]
        failed = [r for r in self.records if r.ok is False]
        return {
            "starts": len(self.records), "failed": len(failed),
            "start_latency_p50_s": _quantile(done, 0.5), "start_latency_p95_s": _quantile(done, 0.95),
            "queued_p50_s": _quantile([r.queued_s for r in self.records], 0.5),
            "warm_start_ratio": self.warm_start_ratio(), "wave_size": self.wave_size,
            "peak_reserved": {n: {"cpus": s.peak_cpus, "memory_mb": s.peak_mb} for n, s in self.nodes_state.items()},
        }

    def _check_fits_somewhere(self, task, cpus: float, memory_mb: int, gpus: int = 0) -> None:
        if any(_Node(capacity=s.capacity).fits(cpus, memory_mb, gpus) for s in self.nodes_state.values()):
            return
        if gpus and any(_Node(capacity=s.capacity).fits(cpus, memory_mb) for s in self.nodes_state.values()):
            most = max(s.capacity.gpus for s in self.nodes_state.values())
            raise Rl360Error(f"task {task.id} reserves {gpus} GPU(s) and no node offers {'any' if most == 0 else most}",
                             "run it on nodes with GPUs (`gpus` of the profile's [[nodes]])")
        biggest = max(self.nodes_state.values(), key=lambda s: (s.capacity.cpus, s.capacity.memory_mb))
        sidecars = len(getattr(task, "sidecars", ()))
        with_sidecars = f" with its {sidecars} sidecar(s), each under the sandbox's limits," if sidecars else ""
        raise Rl360Error(
            f"task {task.id} reserves {cpus:g} CPUs and {memory_mb} MB{with_sidecars} more than any node offers "
            f"(the largest: {biggest.capacity.name}, {biggest.capacity.cpus:g} CPUs, {biggest.capacity.memory_mb} MB)",
            "lower [sandbox] cpus / memory_mb in the recipe, or use bigger nodes")

    # ------------------------------------------------------------------ admission

    async def _admit(self, task, attempt_id: str, cpus: float, memory_mb: int, gpus: int, pinned: str | None,
                     excluded: set[str], retry: int) -> tuple[StartRecord, str]:
        asked = self.clock()
        # First come, first served: each start waits for its own turn (a future the one before it
        # resolves), and only the head of the queue waits on the condition that admissions, releases
        # and the wave window change. With thousands of starts queued, a release wakes one waiter, not
        # all of them.
        turn = asyncio.get_running_loop().create_future()
        self._queue.append(turn)
        self.waiting.add(1)
        if self._queue[0] is turn:
            turn.set_result(None)
        try:
            await turn
            changed = self._condition()
            async with changed:
                while True:
                    wait = self._blocked_for()
                    node = None
                    if wait is None:
                        node = self._place(task, cpus, memory_mb, gpus, pinned, excluded)
                        if node is None and excluded and not self._any_could_free(cpus, memory_mb, gpus, excluded):
                            excluded.clear()  # no other node can ever take it: the failed ones may again
                            node = self._place(task, cpus, memory_mb, gpus, pinned, excluded)
                    if node is not None:
                        break
                    try:
                        await asyncio.wait_for(changed.wait(), timeout=wait)
                    except TimeoutError:
                        pass
                now = self.clock()
                state = self.nodes_state[node]
                state.reserved_cpus += cpus
                state.reserved_mb += memory_mb
                state.reserved_gpus += gpus
                state.live += 1
                state.peak_cpus = max(state.peak_cpus, state.reserved_cpus)
                state.peak_mb = max(state.peak_mb, state.reserved_mb)
                self._live += 1
                self._recent_starts.append(now)
                self.queue_wait.add(now - asked)
                self.live_level.add(1)
                record = StartRecord(attempt_id=attempt_id, task_id=task.id, node=node, admitted_at=now,
                                     admitted_wall=time.time(), queued_s=now - asked,
                                     warm=self._warm(state, self.image_ref(task)), wave_size=self.wave_size,
                                     retry=retry)
                self.records.append(record)
                if len(self.records) > 2 * RECORDS_KEPT:  # trimmed in halves: amortized O(1) a start
                    del self.records[:-RECORDS_KEPT]
                return record, node
        finally:
            self._leave_queue(turn)

    def _leave_queue(self, turn: asyncio.Future) -> None:
        """Out of the queue (admitted, or cancelled while waiting); the next start's turn comes."""
        self.waiting.add(-1)
        if self._queue and self._queue[0] is turn:
            self._queue.popleft()
        else:
            with contextlib.suppress(ValueError):
                self._queue.remove(turn)  # cancelled before its turn: rare, so O(n) is fine
        if self._queue and not self._queue[0].done():
            self._queue[0].set_result(None)

    def _blocked_for(self) -> float | None:
        """None when the head of the queue may start now; else how long to wait at most before looking again."""
        if self._live >= self.config.max_concurrent:
            return 1.0
        now = self.clock()
        interval = self.config.wave_interval_s
        while self._recent_starts and self._recent_starts[0] <= now - interval:
            self._recent_starts.popleft()
        if len(self._recent_starts) >= self.wave_size:
            # The window opens again when the oldest start in it leaves it.
            return max(0.0, self._recent_starts[-self.wave_size] + interval - now) + 1e-4
        return None

    def _place(self, task, cpus: float, memory_mb: int, gpus: int, pinned: str | None,
               excluded: set[str]) -> str | None:
        now = self.clock()
        if pinned is not None:
            state = self.nodes_state.get(pinned)
            if state is None:
                raise Rl360Error(f"node '{pinned}' is not one of the provider's nodes "
                                 f"({', '.join(self.nodes_state)})")
            return pinned if state.fits(cpus, memory_mb, gpus) else None
        candidates = [s for name, s in self.nodes_state.items()
                      if name not in excluded and s.down_until <= now and s.fits(cpus, memory_mb, gpus)]
        if not candidates:
            return None
        ref = self.image_ref(task)
        warm = [s for s in candidates if self._warm(s, ref)] or candidates
        # Among those, a node whose warm pool holds a sandbox of the task: the start is a lookup there.
        pooled = self.inner.pooled_nodes(task)
        best = min([s for s in warm if s.capacity.name in pooled] or warm,
                   key=lambda s: (s.load, s.live, s.capacity.name))
        return best.capacity.name

    def _any_could_free(self, cpus: float, memory_mb: int, gpus: int, excluded: set[str]) -> bool:
        """Some non-excluded, healthy node could take the sandbox once others end (so keep waiting)."""
        now = self.clock()
        return any(_Node(capacity=s.capacity).fits(cpus, memory_mb, gpus) for name, s in self.nodes_state.items()
                   if name not in excluded and s.down_until <= now)

    def _warm(self, state: _Node, ref: str) -> bool:
        if ref not in state.images:
            return False
        want = self.image_digests.get(ref)
        have = state.images[ref]
        return want is None or have is None or have == want

    def _condition(self) -> asyncio.Condition:
        """The condition admissions wait on, for the running event loop (a CLI may run several in turn)."""
        loop = asyncio.get_running_loop()
        if self._changed is None or self._changed_loop is not loop:
            self._changed = asyncio.Condition()
            self._changed_loop = loop
        return self._changed

    async def _release(self, node: str, cpus: float, memory_mb: int, gpus: int = 0) -> None:
        changed = self._condition()
        async with changed:
            state = self.nodes_state[node]
            state.reserved_cpus = max(0.0, state.reserved_cpus - cpus)
            state.reserved_mb = max(0, state.reserved_mb - memory_mb)
            state.reserved_gpus = max(0, state.reserved_gpus - gpus)
            state.live -= 1
            self._live -= 1
            self.live_level.add(-1)
            changed.notify_all()

    def _adapt(self) -> None:
        """Adaptive waves: grow while starts are fast and clean, halve when they slow down or fail."""
        if not self.config.adaptive_waves:
            return
        recent = [r for r in self.records[-max(4, self.wave_size):] if r.ok is not None]
        if len(recent) < min(4, self.wave_size):
            return
        failures = sum(1 for r in recent if not r.ok)
        latency = statistics.median(r.start_latency_s or 0.0 for r in recent)
        target = self.config.target_start_latency_s
        ceiling = max(self.config.max_wave_size, self.config.wave_size)
        size = self.wave_size
        if failures or latency > 2 * target:
            size = max(1, size // 2)
        elif latency <= target:
            size = min(ceiling, size + max(1, size // 2))
        if size != self.wave_size:
            self.wave_size = size
            self.wave_history.append((self.clock(), size))


class _Admitted(WrappedSandbox):
    """A sandbox the controller admitted: stopping it gives its reservation back."""

    def __init__(self, inner: Sandbox, controller: AdmissionController, cpus: float, memory_mb: int, gpus: int,
                 record: StartRecord):
        super().__init__(inner)
        self.controller = controller
        self.cpus, self.memory_mb, self.gpus = cpus, memory_mb, gpus
        self.record = record
        self._released = False

    async def stop(self) -> None:
        try:
            await self.inner.stop()
        finally:
            if not self._released:
                self._released = True
                await self.controller._release(self.node, self.cpus, self.memory_mb, self.gpus)


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
