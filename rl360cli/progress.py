"""How far the step being generated has got: `generation.json` in the run folder, for the live view.

The loop rewrites it while it waits for a step's groups — sessions done (whole groups: a group comes
back when its last session ends) of the sessions the step waits for, later generation rounds
included — at most once every `min_interval_s`, and always when the count reaches the total. `rl360
up`'s live view reads it beside metrics.jsonl. It is not in the state file: a rewrite a second of the
file every command locks would cost the most where the view is most wanted, at thousands of sandboxes.

    progress = GenerationProgress(run_dir)
    progress(step=3, sessions_done=96, sessions_total=256)     # step: 0-based, as in metrics.jsonl
    read_generation(run_dir)   # {"step": 3, "sessions_done": 96, "sessions_total": 256, "time": ...} or None

Test: tests/test_progress.py.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

FILE = "generation.json"


class GenerationProgress:
    """Writes the run's `generation.json` (atomically: a reader never sees half a file)."""

    def __init__(self, run_dir: Path, *, min_interval_s: float = 1.0):
        self.path = Path(run_dir) / FILE
        self.min_interval_s = min_interval_s
        self._written: tuple[int, int, int] | None = None
        self._at = float("-inf")

    def __call__(self, *, step: int, sessions_done: int, sessions_total: int) -> None:
        figures = (step, sessions_done, sessions_total)
        now = time.monotonic()
        if figures == self._written or (now - self._at < self.min_interval_s and sessions_done < sessions_total):
            return
        partial = self.path.with_suffix(".tmp")
        try:
            partial.write_text(json.dumps({"step": step, "sessions_done": sessions_done,
                                           "sessions_total": sessions_total, "time": time.time()}))
            os.replace(partial, self.path)
        except OSError:
            return  # the view is a convenience: a full disk or a removed run folder must not stop the run
        self._written, self._at = figures, now


def read_generation(run_dir: Path | str | None) -> dict | None:
    """The last progress written in `run_dir`, or None (no file yet, or not a well-formed one)."""
    if run_dir is None:
        return None
    try:
        data = json.loads((Path(run_dir) / FILE).read_text())
    except (OSError, ValueError):
        return None
    fields = ("step", "sessions_done", "sessions_total")
    if not isinstance(data, dict) or not all(type(data.get(k)) is int and data[k] >= 0 for k in fields):
        return None
    return data
