"""Per-step metrics: a JSON line each in the run folder's `metrics.jsonl`, and W&B.

W&B runs offline unless `WANDB_API_KEY` is set; its offline files stay in the
run folder (`wandb sync` uploads them later). The JSONL copy is what `rl360
status`, the live view and the tests read.

`Level` and `Histogram` are the running counters the processes that see events happen keep for
those rows (rl360cli/sandbox/waves.py, rl360cli/rollout/session_actor.py); rl360cli/rollout/gauges.py
collects them once a step. Test: tests/rollout/test_gauges.py.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# The step of the row that holds policy v0's held-out evaluation, before the first step (rl360cli/loop/eval.py):
# one before the 0-based step 0, so "after step k" reads the same for every row (the report and the live view
# show it as step 0, "before training"). W&B's steps start at 0: there it goes to the run's summary instead,
# under `before_training/` (`eval/pass@1` -> `before_training/eval/pass@1`).
BEFORE_TRAINING_STEP = -1

class MetricsLogger:
    def __init__(self, run_dir: Path, *, run_name: str, project: str, config: dict, use_wandb: bool = True):
        self.path = run_dir / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._wandb = None
        if use_wandb:
            self._wandb = _start_wandb(run_dir, run_name=run_name, project=project, config=config)

    def log(self, step: int, values: dict[str, Any]) -> None:
        row = {"step": step, "time": time.time(), **values}
        with open(self.path, "a") as f:
            f.write(json.dumps(row, default=float) + "\n")
        if self._wandb is not None:
            numbers = {k: v for k, v in _flatten(values).items() if isinstance(v, (int, float))}
            if step < 0:  # W&B drops a step below its first (0), with a warning
                self._wandb.summary.update({f"before_training/{k}": v for k, v in numbers.items()})
            else:
                self._wandb.log(numbers, step=step)

    def close(self) -> None:
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None


def drop_steps_from(path: Path, first_step: int) -> int:
    """Remove the rows of steps `first_step` and later from a JSON-lines file keyed by "step"
    (metrics.jsonl, samples.jsonl, trajectories.jsonl): a resumed run trains those steps again and logs them anew, so
    each step keeps one row. A line a crash cut short is dropped too. Returns how many rows went."""
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return 0
    kept = []
    for line in lines:
        try:
            if json.loads(line)["step"] < first_step:
                kept.append(line)
        except (ValueError, KeyError, TypeError):
            pass
    if len(kept) < len(lines):
        staging = path.with_name(path.name + ".tmp")
        staging.write_text("".join(f"{line}\n" for line in kept))
        os.replace(staging, path)
    return len(lines) - len(kept)


def read_metrics(path: Path) -> list[dict]:
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


def _start_wandb(run_dir: Path, *, run_name: str, project: str, config: dict):
    try:
        import wandb
    except ImportError:
        return None
    mode = "online" if os.environ.get("WANDB_API_KEY") else "offline"
    return wandb.init(project=project, name=run_name, id=run_name, dir=str(run_dir), mode=mode, config=config,
                      resume="allow", settings=wandb.Settings(silent=True, console="off"))


def _flatten(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flatten(value, f"{name}/"))
        else:
            out[name] = value
    return out


# ----------------------------------------------------------------------------- running counters
#
# The figures a step's row gets from the processes that see them happen (the admission controller, the
# session actors): each keeps these counters as events happen, O(1) each, and hands over a small dict
# once a step (`take`), so collecting them costs O(processes), never O(sessions).


class Level:
    """A count that goes up and down (sessions in flight, starts waiting for admission): its value now, and
    its peak and time-weighted mean since the last `take()`."""

    __slots__ = ("now", "peak", "_area", "_since", "_last", "_clock")

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self.now = 0
        self.peak = 0
        self._area = 0.0
        self._since = self._last = clock()

    def add(self, delta: int) -> None:
        at = self._clock()
        self._area += self.now * (at - self._last)
        self._last = at
        self.now += delta
        if self.now > self.peak:
            self.peak = self.now

    def take(self) -> dict[str, float]:
        """{"now", "max", "mean", "seconds"} since the last take, and start the next interval."""
        at = self._clock()
        area = self._area + self.now * (at - self._last)
        span = at - self._since
        figures = {"now": self.now, "max": self.peak, "mean": area / span if span > 0 else float(self.now),
                   "seconds": span}
        self._area, self._since, self._last, self.peak = 0.0, at, at, self.now
        return figures


class Histogram:
    """Non-negative values (seconds) counted in buckets 5% wide above 1 ms: count, sum, max and any quantile
    to within 5%, in memory that does not grow with the count. Two processes' `take()`s merge by adding their
    buckets (`merged_quantile`)."""

    FLOOR = 1e-3
    RATIO = 1.05

    __slots__ = ("count", "total", "peak", "buckets")

    def __init__(self) -> None:
        self.count, self.total, self.peak = 0, 0.0, 0.0
        self.buckets: dict[int, int] = {}

    def add(self, value: float) -> None:
        index = 0 if value <= self.FLOOR else math.ceil(math.log(value / self.FLOOR) / math.log(self.RATIO))
        self.buckets[index] = self.buckets.get(index, 0) + 1
        self.count += 1
        self.total += value
        self.peak = max(self.peak, value)

    def take(self) -> dict[str, Any]:
        """{"count", "sum", "max", "buckets"} since the last take, and start again empty."""
        figures = {"count": self.count, "sum": self.total, "max": self.peak, "buckets": self.buckets}
        self.__init__()
        return figures


def merged_quantile(takes: list[dict[str, Any]], q: float) -> float | None:
    """The `q` quantile of the values of several `Histogram.take()`s together: the upper edge of the bucket
    it falls in (never above the largest value seen); None when they hold no value."""
    buckets: dict[int, int] = {}
    for take in takes:
        for index, n in take["buckets"].items():
            buckets[int(index)] = buckets.get(int(index), 0) + n
    count = sum(buckets.values())
    if not count:
        return None
    peak = max(take["max"] for take in takes)
    rank = max(1, math.ceil(q * count))
    seen = 0
    for index in sorted(buckets):
        seen += buckets[index]
        if seen >= rank:
            return min(peak, Histogram.FLOOR * Histogram.RATIO ** index)
    return peak
