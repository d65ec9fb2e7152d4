"""The append-only events log beside the state file: what every stage did, one JSON line each.

Each line is written with a single O_APPEND write, so lines from concurrent
CLI processes never interleave.

    {"time": "...", "stage": "serve", "action": "start", "subject": "service/router",
     "outcome": "ok", "detail": {...}}
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rl360cli.state.schema import now_iso
from rl360cli.state.store import StateFile


def record(state: StateFile, *, stage: str, action: str, subject: str, outcome: str = "ok", **detail: Any) -> None:
    """Append one event; `outcome` is ok, failed, skipped or a short word of the stage's own."""
    event = {"time": now_iso(), "stage": stage, "action": action, "subject": subject, "outcome": outcome}
    if detail:
        event["detail"] = detail
    line = (json.dumps(event, default=str) + "\n").encode()
    state.events_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(state.events_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def read(path: Path) -> Iterator[dict[str, Any]]:
    """Every event in the log, oldest first; a torn last line (a crash mid-write) is skipped."""
    try:
        with open(path) as f:
            for line in f:
                try:
                    yield json.loads(line)
                except json.JSONDecodeError:
                    continue
    except FileNotFoundError:
        return
