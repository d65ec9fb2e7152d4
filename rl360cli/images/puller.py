"""The wave puller: pull (node, image) pairs in waves that never exceed the registry's capacity.

Tasks are cut into waves of at most `wave_size` pulls, interleaved across
nodes so a wave spreads over the cluster; a wave's pulls run at once (one
thread each) and the next wave starts only when the whole wave has ended, so
at most `wave_size` pulls are ever in flight against the registry. Each pull
is by digest (then tagged), retried with exponential back-off and jitter when
the failure may be transient; a node found unreachable after its retries has
its later pulls failed at once with the same reason instead of timing out
again. A listener sees each wave and pull start and end (the progress bar and
the per-wave state update hang off it).

    results = run_waves(make_waves(tasks, 2), runtimes, retry=RetryPolicy(), listener=listener)

Test: tests/images/test_puller.py.
"""

from __future__ import annotations

import random
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Literal, Protocol

from rl360cli.configload import check_at_least, check_non_negative
from rl360cli.images.config import ImageRef
from rl360cli.nodes.base import NodeError, NodeRuntime
from rl360cli.state.schema import now_iso


@dataclass(frozen=True, kw_only=True, slots=True)
class PullTask:
    node: str
    image: str
    ref: ImageRef
    digest: str

    @property
    def label(self) -> str:
        return f"{self.node}/{self.image}"


@dataclass(frozen=True, kw_only=True, slots=True)
class PullResult:
    task: PullTask
    outcome: Literal["pulled", "failed"]
    wave: int
    started_at: str
    finished_at: str
    seconds: float
    attempts: int
    size: int | None = None
    image_id: str | None = None
    reason: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class RetryPolicy:
    max_attempts: int = 3
    base_delay_s: float = 0.5
    max_delay_s: float = 8.0

    def __post_init__(self) -> None:
        check_at_least(self, 1, "max_attempts")
        check_non_negative(self, "base_delay_s")
        if self.max_delay_s < self.base_delay_s:
            raise ValueError(f"max_delay_s ({self.max_delay_s}) must be >= base_delay_s ({self.base_delay_s})")

    def delay_s(self, attempt: int) -> float:
        """Seconds to wait after failed attempt `attempt` (1-based): doubling, with +-50% jitter."""
        return min(self.max_delay_s, self.base_delay_s * 2 ** (attempt - 1)) * (0.5 + random.random())


class WaveListener(Protocol):
    def wave_started(self, index: int, total: int, tasks: list[PullTask]) -> None: ...
    def task_started(self, task: PullTask) -> None: ...
    def task_done(self, result: PullResult) -> None: ...
    def wave_done(self, index: int, results: list[PullResult]) -> None: ...


class SilentListener:
    def wave_started(self, index: int, total: int, tasks: list[PullTask]) -> None:
        pass

    def task_started(self, task: PullTask) -> None:
        pass

    def task_done(self, result: PullResult) -> None:
        pass

    def wave_done(self, index: int, results: list[PullResult]) -> None:
        pass


def make_waves(tasks: list[PullTask], wave_size: int) -> list[list[PullTask]]:
    """Cut `tasks` into waves of at most `wave_size`, taking one task per node in turn."""
    if wave_size < 1:
        raise ValueError(f"wave_size must be at least 1 (got {wave_size})")
    queues: OrderedDict[str, list[PullTask]] = OrderedDict()
    for t in tasks:
        queues.setdefault(t.node, []).append(t)
    order: list[PullTask] = []
    while any(queues.values()):
        for q in queues.values():
            if q:
                order.append(q.pop(0))
    return [order[i:i + wave_size] for i in range(0, len(order), wave_size)]


def run_waves(waves: list[list[PullTask]], runtimes: dict[str, NodeRuntime], *, retry: RetryPolicy,
              listener: WaveListener | None = None) -> list[PullResult]:
    """Run the waves in order; every task ends as one result, pulled or failed with a reason."""
    listener = listener or SilentListener()
    dead: dict[str, str] = {}
    lock = threading.Lock()
    results: list[PullResult] = []
    for index, wave in enumerate(waves, start=1):
        listener.wave_started(index, len(waves), wave)
        wave_results: list[PullResult] = []
        with ThreadPoolExecutor(max_workers=len(wave), thread_name_prefix=f"pull-w{index}") as pool:
            futures = [pool.submit(_pull_one, runtimes[t.node], t, retry, index, listener, dead, lock) for t in wave]
            for future in as_completed(futures):
                result = future.result()
                wave_results.append(result)
                listener.task_done(result)
        listener.wave_done(index, wave_results)
        results += wave_results
    return results


def _pull_one(runtime: NodeRuntime, task: PullTask, retry: RetryPolicy, wave: int, listener: WaveListener,
              dead: dict[str, str], lock: threading.Lock) -> PullResult:
    started_at, t0 = now_iso(), time.monotonic()
    with lock:
        earlier = dead.get(task.node)
    if earlier:
        return PullResult(task=task, outcome="failed", wave=wave, started_at=started_at, finished_at=now_iso(),
                          seconds=0.0, attempts=0, reason=earlier)
    listener.task_started(task)
    attempt, reason = 0, ""
    while attempt < retry.max_attempts:
        attempt += 1
        try:
            image = runtime.pull(task.ref, task.digest)
            runtime.tag(image.id, task.ref)
            return PullResult(task=task, outcome="pulled", wave=wave, started_at=started_at, finished_at=now_iso(),
                              seconds=round(time.monotonic() - t0, 3), attempts=attempt, size=image.size,
                              image_id=image.id)
        except NodeError as e:
            reason = e.reason
            if not e.transient:
                break
            if attempt < retry.max_attempts:
                time.sleep(retry.delay_s(attempt))
    if reason.startswith("cannot reach"):
        with lock:
            dead.setdefault(task.node, reason)
    return PullResult(task=task, outcome="failed", wave=wave, started_at=started_at, finished_at=now_iso(),
                      seconds=round(time.monotonic() - t0, 3), attempts=attempt, reason=reason)
