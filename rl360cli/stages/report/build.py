"""Stage `report`: write a run's page into its folder (`<run folder>/report/report.html` and its PNGs,
and `trajectories.html`, the samples the loop kept in `trajectories.jsonl`: what the agent did).

Reads the run's record (the state file, reconciled first, so a trainer that died shows as failed, not
running), its `metrics.jsonl`, `trajectories.jsonl` and the recipe copy the run started from; changes
nothing else. It works on a run in any state: a running run's page is a snapshot of the steps done so far.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from rl360cli.config import RUN_OVERRIDES, RUN_RECIPE
from rl360cli.errors import Rl360Error
from rl360cli.stages.base import Context
from rl360cli.stages.report.charts import CHARTS, draw_charts
from rl360cli.stages.report.page import render_page
from rl360cli.stages.report.series import RunSummary, read_rows, run_summary
from rl360cli.stages.report.trajectories import PAGE as TRAJECTORIES_PAGE
from rl360cli.stages.report.trajectories import Kept, write_trajectories
from rl360cli.stages.status import reconcile
from rl360cli.state.schema import RunRecord

NAME = "report"
FOLDER = "report"
PAGE = "report.html"


@dataclass(frozen=True, kw_only=True)
class Report:
    run_id: str
    path: Path  # the page
    summary: RunSummary
    charts: tuple[str, ...]  # the PNGs drawn, beside the page
    not_recorded: tuple[str, ...]  # charts with nothing in metrics.jsonl
    trajectories: Path  # the trajectories page, beside the page
    kept: Kept  # the samples it shows

    def to_dict(self) -> dict:
        s = self.summary
        return {"run": self.run_id, "path": str(self.path), "status": s.status, "detail": s.detail,
                "step": s.progress.done, "num_steps": s.progress.total,
                "charts": [str(self.path.parent / c) for c in self.charts], "not_recorded": list(self.not_recorded),
                "trajectories": str(self.trajectories), "trajectory_samples": len(self.kept.samples),
                "trajectory_steps": self.kept.steps()}


def pick_run(runs: dict[str, RunRecord], wanted: str | None, current: str | None = None) -> str:
    """`wanted`, or the current run (the one `rl360 up` started last), or the run started last; a
    one-line error naming the runs there are otherwise."""
    if not runs:
        raise Rl360Error("there is no run in the state file", "start one with `rl360 up`, or pass --state FILE")
    if wanted is None:
        if current in runs:
            return current
        return max(runs, key=lambda rid: runs[rid].get("started_at") or "")
    if wanted not in runs:
        known = ", ".join(sorted(runs, key=lambda rid: runs[rid].get("started_at") or "")[-5:])
        raise Rl360Error(f"there is no run {wanted!r} in the state file", f"pass one of: {known}")
    return wanted


def write_report(ctx: Context, run: str | None = None) -> Report:
    status = reconcile(ctx)
    runs = status.runs
    run_id = pick_run(runs, run, status.current_run)
    record = runs[run_id]
    run_dir = Path(record.get("run_dir") or ctx.run_root / run_id)
    if not run_dir.is_dir():
        raise Rl360Error(f"the folder of run {run_id} ({run_dir}) is gone",
                         "pass another run; `rl360 status` lists them")
    rows = read_rows(Path(record.get("metrics_path") or run_dir / "metrics.jsonl"))
    summary = run_summary(run_id, dict(record), rows, now=time.time())
    folder = run_dir / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    drawn = draw_charts(rows, folder)
    for chart, item in zip(CHARTS, drawn):  # a chart drawn by an earlier report, not recorded now
        if item.file is None:
            (folder / f"{chart.name}.png").unlink(missing_ok=True)
    recipe_text, recipe_source = _recipe(run_dir, record)
    kept = write_trajectories(run_dir, folder, run_id, active=summary.progress.active)
    page = folder / PAGE
    staging = folder / f".{PAGE}.tmp"
    staging.write_text(render_page(summary, drawn, recipe_text=recipe_text, recipe_source=recipe_source,
                                   run_dir=str(run_dir), trajectories=kept.describe()))
    staging.replace(page)
    ctx.event(NAME, "write", f"run {run_id}", path=str(page), status=summary.status)
    return Report(run_id=run_id, path=page, summary=summary,
                  charts=tuple(d.file for d in drawn if d.file),
                  not_recorded=tuple(d.chart.name for d in drawn if d.file is None),
                  trajectories=folder / TRAJECTORIES_PAGE, kept=kept)


def _recipe(run_dir: Path, record: RunRecord) -> tuple[str | None, str]:
    """The recipe text the run started from, and where it came from."""
    copy = run_dir / RUN_RECIPE
    overrides = run_dir / RUN_OVERRIDES
    with_overrides = f"; its --set overrides are in {overrides.name}" if overrides.is_file() else ""
    if copy.is_file():
        started_from = record.get("recipe", "?")
        return copy.read_text(), f"{copy} (copied when the run started, from {started_from}{with_overrides})"
    source = Path(record.get("recipe") or "")
    if source.is_file():
        return source.read_text(), f"{source} (the run folder has no copy: this is the file as it is now)"
    return None, f"{record.get('recipe', '?')} (not found)"
