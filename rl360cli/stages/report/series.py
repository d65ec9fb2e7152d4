"""Readings of a run's `metrics.jsonl` rows and its record, shared by `rl360 report` and the live view.

A row is what `loop/train_loop.py:step_metrics` returns, with `step` (0-based) and `time` (Unix
seconds) added by `metrics.MetricsLogger`; nested figures (`batch`, `train`) are read by dotted path
(`batch.masked`). Held-out evaluation figures are `eval/pass@1`, `eval/pass@k` (or `eval/pass@4`)
as flat keys, or the same names in a nested `eval` table (W&B flattens it to the same keys); a
step's row may carry them, or a row of their own (without a reward) may: policy v0's, before the first
step, is step -1 (`BEFORE_TRAINING_STEP`), the 1-based step 0, "before training". Nothing here draws or
prints; `duration` and `eval_words` word figures for both.
"""

from __future__ import annotations

import json
import re
import statistics
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from rl360cli.errors import Rl360Error
from rl360cli.metrics import BEFORE_TRAINING_STEP
from rl360cli.state.schema import RUN_ACTIVE, RunStatus

EVAL_KEY = re.compile(r"^eval/(pass@\w+)$")
# Step times from the last this many steps estimate the time left.
ETA_WINDOW = 5


def read_rows(path: Path) -> list[dict]:
    """The rows of `metrics.jsonl`; a torn last line (the trainer mid-write, or killed mid-write) is left out."""
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    rows = []
    for number, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if number + 1 < len(lines):
                raise Rl360Error(f"{path} line {number + 1} is not JSON",
                                 "the trainer alone writes metrics.jsonl: restore it or remove that line") from None
    return rows


def value(row: dict, path: str) -> float | None:
    """The number at dotted `path` in `row` (None when absent or not a number)."""
    node: Any = row
    for name in path.split("."):
        if not isinstance(node, dict) or name not in node:
            return None
        node = node[name]
    return float(node) if isinstance(node, (int, float)) and not isinstance(node, bool) else None


def step_rows(rows: list[dict]) -> list[dict]:
    """The rows of training steps (an evaluation may write rows of its own, without a reward)."""
    return [r for r in rows if "reward_mean" in r or "samples" in r]


def eval_values(row: dict) -> dict[str, float]:
    """`{"pass@1": 0.62, "pass@4": 0.81}` from one row (empty when it holds no evaluation)."""
    found: dict[str, float] = {}
    for key, number in row.items():
        match = EVAL_KEY.match(key)
        if match and value(row, key) is not None:
            found[match.group(1)] = float(number)
    nested = row.get("eval")
    if isinstance(nested, dict):
        found.update({k: float(v) for k, v in nested.items()
                      if k.startswith("pass@") and value(nested, k) is not None})
    return dict(sorted(found.items(), key=lambda kv: _pass_order(kv[0])))


def eval_points(rows: list[dict]) -> list[tuple[int, dict[str, float]]]:
    """(1-based step, values) of every row with an evaluation, in order."""
    return [(row["step"] + 1, found) for row in rows if "step" in row and (found := eval_values(row))]


def eval_when(step: int) -> str:
    """Where a 1-based point of `eval_points` stands: "before training" (policy v0), else "after step N"."""
    return "before training" if step == BEFORE_TRAINING_STEP + 1 else f"after step {step}"


def eval_words(progress: RunProgress) -> str | None:
    """The run's held-out figures in a line: policy v0's and the latest, "before training: pass@1 0.172,
    pass@4 0.375; after step 30: pass@1 0.594, pass@4 0.812"; None when none is recorded."""
    points = [(0, progress.before_eval)] if progress.before_eval is not None else []
    if progress.latest_eval is not None and progress.latest_eval[0] != 0:
        points.append(progress.latest_eval)
    if not points:
        return None
    return "; ".join(f"{eval_when(step)}: " + ", ".join(f"{k} {v:.3f}" for k, v in found.items())
                     for step, found in points)


def _pass_order(name: str) -> tuple[int, str]:
    k = name.removeprefix("pass@")
    return (int(k), "") if k.isdigit() else (1 << 30, k)


def epoch(iso: str | None) -> float | None:
    """Unix seconds of an ISO timestamp from the state file (None when absent or unreadable)."""
    try:
        return datetime.fromisoformat(iso).timestamp() if iso else None
    except ValueError:
        return None


def duration(seconds: float | None) -> str:
    """`1h02m`, `3m12s`, `48s`; "-" when unknown."""
    if seconds is None:
        return "-"
    seconds = int(round(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"


@dataclass(frozen=True, kw_only=True)
class RunProgress:
    """Where a run stands: steps done of its total, time spent and the estimated time left."""

    done: int
    total: int | None
    elapsed_s: float | None
    # Seconds left at the recent steps' pace, less the current step's time so far (None: not yet known,
    # or the run has ended).
    eta_s: float | None
    active: bool
    # The step being generated now (1-based) and how long since the previous one ended.
    current_step: int | None = None
    current_step_s: float | None = None
    # Sessions of the current step: its first round's total (tasks x samples), and how many are done
    # (None: the loop does not report sessions done within a step).
    sessions_total: int | None = None
    sessions_done: int | None = None
    latest_eval: tuple[int, dict[str, float]] | None = None
    # Policy v0's held-out figures, evaluated before the first step (`[eval] at_start`); None: not recorded.
    before_eval: dict[str, float] | None = None


def run_progress(run: dict, rows: list[dict], *, now: float, sessions_per_step: int | None = None,
                 generation: dict | None = None) -> RunProgress:
    """`run` (a state-file run record) and its metrics rows as progress at time `now`; `generation`, the
    run folder's generation.json (rl360cli/progress.py), gives the current step's sessions done."""
    steps = step_rows(rows)
    total = run.get("num_steps")
    done = max([int(run.get("step") or 0)] + [r["step"] + 1 for r in steps if "step" in r])
    active = run.get("status") in RUN_ACTIVE
    started = epoch(run.get("started_at"))
    ended = epoch(run.get("ended_at")) or (steps[-1].get("time") if steps and not active else None)
    elapsed = ((now if active else ended or now) - started) if started is not None else None
    last_time = steps[-1].get("time") if steps else None
    pace = _step_pace(steps)
    eta = None
    if active and total is not None and pace is not None and done < total:
        since_last = now - last_time if last_time is not None else 0.0
        # The current step is assumed no shorter than it has already taken (it may overrun the pace).
        eta = max((total - done) * pace - since_last, (total - done - 1) * pace)
    current = done + 1 if active and (total is None or done < total) else None
    # The loop's figures are of its 0-based step; the true total counts later generation rounds too.
    generating = generation or {}
    reported = current is not None and generating.get("step") == current - 1
    evals = eval_points(rows)
    return RunProgress(
        done=done, total=total, elapsed_s=elapsed, eta_s=eta, active=active, current_step=current,
        current_step_s=now - last_time if current is not None and last_time is not None else None,
        sessions_total=(generating.get("sessions_total") if reported else None) or (
            sessions_per_step if current is not None else None),
        sessions_done=generating.get("sessions_done") if reported else None,
        latest_eval=evals[-1] if evals else None,
        before_eval=next((found for step, found in evals if step == BEFORE_TRAINING_STEP + 1), None),
    )


def _step_pace(steps: list[dict]) -> float | None:
    """Seconds per step lately: the median gap between the last rows (a step's own `step_s` when there
    is one row; with overlap a step's time runs from waiting on its groups to the end of its sync)."""
    times = [r["time"] for r in steps[-(ETA_WINDOW + 1):] if isinstance(r.get("time"), (int, float))]
    gaps = [b - a for a, b in zip(times, times[1:]) if b >= a]
    if gaps:
        return statistics.median(gaps)
    return value(steps[-1], "step_s") if steps else None


@dataclass(frozen=True, kw_only=True)
class RunSummary:
    """The head of the report: what the run is, how it stands, how it went."""

    run_id: str
    status: str
    # One line on the status: "step 7 of 30", "stopped by rl360 down", the failure's reason.
    detail: str
    progress: RunProgress
    started_at: str | None
    ended_at: str | None
    reward_first: float | None
    reward_last: float | None
    reward_best: float | None
    pass_last: float | None
    infra_failures: int
    infra_by_cause: dict[str, int] = field(default_factory=dict)
    overrides: tuple[str, ...] = ()


def run_summary(run_id: str, run: dict, rows: list[dict], *, now: float) -> RunSummary:
    steps = step_rows(rows)
    progress = run_progress(run, rows, now=now)
    rewards = [v for r in steps if (v := value(r, "reward_mean")) is not None]
    passes = [v for r in steps if (v := value(r, "pass_rate")) is not None]
    causes: dict[str, int] = {}
    for row in steps:
        for cause, count in (row.get("infra_failures_by_cause") or {}).items():
            causes[cause] = causes.get(cause, 0) + int(count)
    status = str(run.get("status") or "unknown")
    return RunSummary(
        run_id=run_id, status=status, detail=_status_detail(status, run, progress), progress=progress,
        started_at=run.get("started_at"), ended_at=run.get("ended_at"),
        reward_first=rewards[0] if rewards else None, reward_last=rewards[-1] if rewards else None,
        reward_best=max(rewards) if rewards else None, pass_last=passes[-1] if passes else None,
        infra_failures=sum(int(r.get("infra_failures") or 0) for r in steps),
        infra_by_cause=dict(sorted(causes.items())), overrides=tuple(run.get("overrides") or ()),
    )


def _status_detail(status: str, run: dict, progress: RunProgress) -> str:
    of = f"step {progress.done} of {progress.total if progress.total is not None else '?'}"
    if status == RunStatus.FINISHED:
        return f"finished: {of}"
    if status in (RunStatus.FAILED, RunStatus.STOPPED):
        return f"{status} at {of}: {run.get('reason') or 'no reason recorded'}"
    if status == RunStatus.STARTING:
        return "starting: engines and trainer coming up, no step yet"
    if status == RunStatus.RUNNING:
        return f"running: {of} done"
    return f"{status}: {of}"
