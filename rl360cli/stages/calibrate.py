"""`rl360 tasks calibrate`: how often the recipe's starting policy solves each task of a set, and the manifest
of those in a pass-rate band (rl360cli/loop/calibration.py says why).

    result = calibrate(ctx, Path("tasks/coding-32"), k=16, band=Band(0.2, 0.4), manifest=Path("m.json"))
    result.rows        # TaskFigures per task: samples, valid, passed, pass rate, infra failures by cause
    result.chosen      # those in band with every sample scored; listed in result.manifest

A calibration is a run of its own (`calibrate: k` in its record): the stages of `rl360 up` bring up its
engines and sandboxes as they would for training, and its trainer component attempts each task k times on
policy v0 and trains nothing (rl360cli/run/calibrate.py). `--resume` never picks it up.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rl360cli.config import write_manifest
from rl360cli.configload import Override, parse_override
from rl360cli.errors import Rl360Error
from rl360cli.loop.calibration import CALIBRATION, Band, TaskFigures, in_band, read_table
from rl360cli.stages.base import Context
from rl360cli.stages.lifecycle import bring_up, follow, start_run, was_stopped
from rl360cli.state.schema import RunStatus


@dataclass(frozen=True, slots=True)
class Calibration:
    run_id: str
    status: RunStatus
    reason: str | None
    rows: list[TaskFigures]
    chosen: list[TaskFigures]
    manifest: Path | None  # None when the run did not finish
    seconds: float | None


def calibration_overrides(tasks_path: Path, include: Sequence[str]) -> list[Override]:
    """The recipe as a calibration runs it: the given task set (all of it, or `include`), no evaluation."""
    return [parse_override(f"tasks.path={json.dumps(str(tasks_path.absolute()))}"),
            parse_override(f"tasks.include={json.dumps(list(include))}"),
            parse_override('tasks.manifest=""'),
            parse_override("eval.enabled=false")]


def calibrate(ctx: Context, *, k: int, band: Band, manifest: Path | None, overrides: Sequence[Override]) -> Calibration:
    """Run a calibration of `ctx.recipe` (with `overrides`, `calibration_overrides` among them) to its end, then
    write the manifest of the tasks in `band` (to `manifest`, by default the run folder's manifest.json)."""
    if k < 2:
        raise Rl360Error(f"-k {k}: a pass rate needs at least 2 samples per task", "pass -k 16 (the default)")
    start_run(ctx, overrides=overrides, calibrate=k)
    bring_up(ctx)
    seen = None
    if not was_stopped(ctx):
        for seen in follow(ctx, poll_s=1.0):
            pass
    run = seen.run if seen else {}
    status = RunStatus(run.get("status", RunStatus.STOPPED))
    table = ctx.run_dir / CALIBRATION
    if status != RunStatus.FINISHED or not table.exists():
        return Calibration(run_id=ctx.run_id or "", status=status, reason=run.get("reason"), rows=[], chosen=[],
                           manifest=None, seconds=None)
    about, rows = read_table(table)
    chosen = in_band(rows, band)
    manifest = manifest or ctx.run_dir / "manifest.json"
    write_manifest(manifest, {r.task: r.pass_rate for r in chosen}, tags={r.task: r.tags for r in chosen},
                   source=about["tasks_path"], band=str(band), k=k, policy=_policy(ctx.need_recipe().model))
    return Calibration(run_id=ctx.run_id or "", status=status, reason=None, rows=rows, chosen=chosen,
                       manifest=manifest, seconds=about.get("seconds"))


def _policy(model) -> str:
    """The starting policy, as the manifest names it."""
    return model.path or model.package or f"{model.kind} (warm-up seed {model.warmup_seed})"
