"""The live view of `rl360 up`: the run's progress step by step, then a summary.

On a terminal it is a rich live table (step, reward, pass rate, infra
failures by cause, tokens/s, overlap, weight sync); piped, one line per step.
Ctrl-C detaches and leaves the run going. When the run ends, its serving
components (engines, router) are stopped; the tiers stay provisioned.
"""

from __future__ import annotations

import time

from rich.console import Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from rl360cli.commands.common import err, out
from rl360cli.logview import FINAL_RUN
from rl360cli.metrics import read_metrics
from rl360cli.stages.base import Context
from rl360cli.stages.status import reconcile
from rl360cli.state import COMPONENT_FINAL, RUN_FINAL, ComponentStatus, RunStatus, by_backend


def watch_run(ctx: Context, *, quiet: bool = False, poll_s: float = 1.0) -> int:
    """Follow the current run until it ends; returns the exit code its final status maps to."""
    run_id = ctx.run_id
    started = time.monotonic()
    shown = 0
    live = Live(console=err, refresh_per_second=2, transient=False) if err.is_terminal and not quiet else None
    try:
        if live:
            live.start()
        while True:
            report = reconcile(ctx)
            run = report.runs.get(run_id, {})
            rows = read_metrics(run.get("metrics_path") or ctx.run_dir / "metrics.jsonl")
            if live:
                live.update(_view(run_id, run, rows, time.monotonic() - started))
            elif not quiet:
                for row in rows[shown:]:
                    out.print(_line(row, run), markup=False, highlight=False)
                shown = len(rows)
            if run.get("status") in RUN_FINAL:
                break
            time.sleep(poll_s)
    except KeyboardInterrupt:
        if live:
            live.stop()
        err.print(f"detached; run {run_id} goes on: `rl360 logs --follow` to follow it, `rl360 down` to stop it")
        return 0
    finally:
        if live and live.is_started:
            live.stop()
    stop_serving(ctx, run_id)
    if not quiet:
        out.print(_summary(run_id, run, rows, time.monotonic() - started))
    return FINAL_RUN[run["status"]]


def stop_serving(ctx: Context, run_id: str) -> None:
    """Stop the components of a run that has ended (its engines and router)."""
    doc = ctx.state.read()
    mine = {cid: rec for cid, rec in doc["components"].items() if rec["run"] == run_id}
    for name, records in by_backend(mine).items():
        ctx.backend_named(name).stop(records, grace_s=10.0)
    with ctx.state.update() as doc:
        for cid in mine:
            rec = doc["components"].get(cid)
            if rec is not None and rec["status"] not in COMPONENT_FINAL:
                rec["status"] = ComponentStatus.STOPPED
    for cid in mine:
        ctx.event("up", "stop", cid, reason="run ended")


def _fmt(value, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def _line(row: dict, run: dict) -> str:
    causes = ", ".join(f"{k} {v}" for k, v in sorted(row.get("infra_failures_by_cause", {}).items())) or "none"
    return (f"step {row['step'] + 1}/{run.get('num_steps', '?')}  reward {_fmt(row.get('reward_mean'))}  "
            f"pass {_fmt(row.get('pass_rate'))}  infra {causes}  tok/s {_fmt(row.get('tokens_per_s'), '.0f')}  "
            f"overlap {_fmt(row.get('overlap_ratio'), '.2f')}  sync {_fmt(row.get('weight_sync_s'), '.2f')}s  "
            f"step {_fmt(row.get('step_s'), '.1f')}s")


def _view(run_id: str, run: dict, rows: list[dict], elapsed: float) -> Group:
    table = Table("step", "reward", "pass", "infra failures", "masked", "filtered", "tok/s", "overlap", "sync s",
                  "step s", title=f"run {run_id} — {run.get('status', '?')} — {elapsed:.0f}s", title_justify="left")
    for row in rows[-12:]:
        batch = row.get("batch", {})
        causes = ", ".join(f"{k} {v}" for k, v in sorted(row.get("infra_failures_by_cause", {}).items())) or "-"
        table.add_row(f"{row['step'] + 1}/{run.get('num_steps', '?')}", _fmt(row.get("reward_mean")),
                      _fmt(row.get("pass_rate")), causes, str(batch.get("masked", 0)),
                      str(batch.get("filtered_zero_std", 0)), _fmt(row.get("tokens_per_s"), ".0f"),
                      _fmt(row.get("overlap_ratio"), ".2f"), _fmt(row.get("weight_sync_s"), ".2f"),
                      _fmt(row.get("step_s"), ".1f"))
    if not rows:
        return Group(table, Text("waiting for the first step (engines warming up, first batch generating)…",
                                 style="dim"))
    return Group(table)


def _summary(run_id: str, run: dict, rows: list[dict], elapsed: float) -> Text:
    rewards = [r["reward_mean"] for r in rows if r.get("reward_mean") is not None]
    infra = sum(r.get("infra_failures", 0) for r in rows)
    text = Text(f"run {run_id} {run.get('status')} after {run.get('step', 0)} steps in {elapsed:.0f}s",
                style="bold red" if run.get("status") == RunStatus.FAILED else "bold")
    if rewards:
        text.append(f"; reward {rewards[0]:.3f} → {rewards[-1]:.3f} (best {max(rewards):.3f})")
    text.append(f"; infra failures masked: {infra}")
    if run.get("reason"):
        text.append(f"; {run['reason']}")
    return text
