"""Per-step metrics: a JSON line each in the run folder's `metrics.jsonl`, and W&B.

W&B runs offline unless `WANDB_API_KEY` is set; its offline files stay in the
run folder (`wandb sync` uploads them later). The JSONL copy is what `rl360
status`, the live view and the tests read.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any


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
            self._wandb.log({k: v for k, v in _flatten(values).items() if isinstance(v, (int, float))}, step=step)

    def close(self) -> None:
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None


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
