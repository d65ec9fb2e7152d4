"""What the readers show, fuzzed (hypothesis): state documents drawn over the schema (rl360cli/state/schema.py),
each field the schema lets be missing, null or an empty list or object drawn so, and metrics.jsonl rows each of
whose figures the loop may write as null drawn null or a number. `rl360 status`, `rl360 logs` (not following),
`rl360 report` and the live view of `rl360 up` (its frame, its piped lines and its summary) render every one:
exit 0 (`status`: 3 exactly when a component or the current run failed), never an exception.

The records stay local ones: a Slurm record makes `rl360 status` ask the dev cluster's sacct and step its requeue
(tests/slurm/ covers those). A component's pid is one no Linux process has (above pid_max's largest value,
2^22), so a live component is observed as ended, as after a reboot. The nullable figures of a row are read off
the loop's own functions on a step whose every sample was masked, so a figure added there is drawn here too.
"""

from __future__ import annotations

import io
import json
import tempfile
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from types import UnionType
from typing import Any, NotRequired, Required, Union, get_args, get_origin, get_type_hints, is_typeddict

from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console
from typer.testing import CliRunner

from rl360cli.cli import build_app
from rl360cli.commands.watch import live_view, row_line, scale_text, summary_text
from rl360cli.loop.eval import eval_metrics
from rl360cli.loop.train_loop import step_metrics
from rl360cli.rollout.gauges import merge
from rl360cli.rollout.rollouts import GenerationReport
from rl360cli.state import schema
from rl360cli.state.schema import ComponentStatus, RunStatus, StateDoc
from tests.conftest import REPO
from tests.fuzz.test_fuzz_state import fuzz

NOT_A_PID = 2**22 + 7  # pid_max is at most 2^22 (4,194,304) on Linux
ABSENT = object()
STAMP = "2026-12-01T00:00:00.000+00:00"


def full_doc(home: Path) -> dict:
    """A state with every field of every record present (lists and objects not empty); its run's folder is
    `home`/runs/r1 (`make_run_dir` makes it)."""
    run_dir = home / "runs" / "r1"
    component = {
        "backend": "local", "node": "local", "pid": NOT_A_PID, "start_time": 1, "status_path": str(home / "s.json"),
        "log_path": str(run_dir / "logs" / "trainer.log"), "command": ["python", "-m", "x"], "stage": "serve",
        "tier": "rollout", "name": "engine-0", "kind": "engine-local", "run": "r1", "ports": {"http": 9},
        "url": "http://127.0.0.1:9", "health_url": "http://127.0.0.1:9/health", "started_at": STAMP,
        "status": "running", "exit_code": 1, "reason": "gone", "cause": "node_lost",
        "supervisor_pid": NOT_A_PID, "supervisor_start_time": 1, "pgid": NOT_A_PID,
        "nodes": ["local"], "num_tasks": 1, "job_id": "17", "het_leader": "16", "het_group": 1, "step": "0",
        "step_key": "17.0", "srun_pid": NOT_A_PID, "srun_start_time": 1, "step_path": str(home / "step"),
        "srun_log": str(home / "srun.log"), "env": {"A": "1"}, "requested_node": "local", "launched_at": 1.0,
        "restarts": 2, "restarted_at": STAMP, "restart_reason": "died", "served_version": 3,
        "rejoin_requested_at": STAMP, "rejoin_error": "no group", "restart": True,
        "holders": [{"pid": NOT_A_PID, "start_time": 1, "command": "rl360 tasks check", "since": STAMP}],
        "for_commands": True,
    }
    trainer = {**component, "name": "trainer", "kind": "trainer", "tier": "training", "stage": "train"}
    router = {**component, "name": "router", "kind": "router", "tier": "service", "run": None}
    sandbox = {
        "run": "fleet-1", "node": "local", "provider": "docker", "task": "t", "attempt": "a0", "image": "python:3.11",
        "container_id": "c0ffee", "pid": NOT_A_PID, "status": "running", "started_at": STAMP,
        "start_latency_s": 0.5, "queued_s": 0.1, "warm": True, "name": "sb", "image_id": "sha256:ab",
        "docker_host": "unix:///nonexistent.sock", "network": "none", "network_denied": True,
        "folder": str(home / "sb"), "uid": 1000, "pid_start": 1,
    }
    return {
        "schema_version": schema.SCHEMA_VERSION, "created_at": STAMP, "updated_at": STAMP, "current_run": "r1",
        "profile": {"name": "local", "path": str(REPO / "cluster" / "local.toml"), "backend": "local"},
        "tiers": {"rollout": {
            "kind": "rollout", "backend": "local", "status": "ready", "nodes": ["local"],
            "resources": {"cpus": 1.0, "memory_mb": 1024, "gpus": 0, "cpu_list": [0]},
            "mode": "per-tier", "job_id": "17", "het_leader": "16", "het_group": 0, "partition": "p",
            "script": "#!/bin/sh\n", "holder_log": str(home / "holder.log"), "submitted_at": STAMP, "requeues": 1,
            "lost_nodes": ["n9"], "reason": "lost n9", "requeued_at": STAMP, "replaced_nodes": ["n9"], "prewarm_pending": ["n8"],
            "pending": {"group": ["rollout"], "job_id": "18", "script": "#!/bin/sh\n", "submitted_at": 1.0,
                        "het": False, "exclude": ["n9"]},
            "previous_job_ids": ["15"]}},
        "nodes": {"local": {
            "address": "127.0.0.1", "tier": "all", "cpus": 2.0, "memory_mb": 4096,
            "images": {"python:3.11": {"digest": "sha256:ab", "size": 10, "pulled_at": STAMP, "seconds": 1.5,
                                       "started_at": STAMP, "attempts": 1, "image_id": "sha256:cd",
                                       "source": "prewarm", "superseded": ["sha256:ef"]}},
            "reserved_cpus": 1.0, "reserved_memory_mb": 1024, "gpus": 0, "status": "ready",
            "docker_host": "unix:///nonexistent.sock", "disk_budget_gb": 10.0,
            "prewarm": {"status": "failed", "reason": "full", "at": STAMP}}},
        "components": {"rollout/engine-0": component, "training/trainer": trainer, "service/router": router},
        "runs": {"r1": {
            "name": "r", "recipe": str(home / "nonexistent.toml"), "run_dir": str(run_dir),
            "metrics_path": str(run_dir / "metrics.jsonl"), "started_at": STAMP, "num_steps": 4, "step": 2,
            "policy_version": 2, "status": "running", "resumed": False, "calibrate": 2, "overrides": ["run.seed=3"],
            "pid": NOT_A_PID, "reward_mean": 0.5, "ended_at": STAMP, "engine_versions": {"rollout/engine-0": 2},
            "reason": "trainer gone", "cause": "node_lost", "resume_after": "node_lost"}},
        "sandboxes": {"fleet-1/a0": sandbox},
        "prewarm": {"at": STAMP, "images_file": str(home / "images.toml"), "wave_size": 4,
                    "images": {"py": {"ref": "python:3.11", "digest": "sha256:ab", "nodes": ["local"],
                                      "rule": "all", "size": 10, "capacity": 100}},
                    "failed_nodes": {"n9": "unreachable"}},
    }


def _inner(annotation: Any) -> Any:
    """The annotation under NotRequired/Required and `| None`."""
    while get_origin(annotation) in (NotRequired, Required):
        annotation = get_args(annotation)[0]
    args = [a for a in get_args(annotation) if a is not type(None)]
    return args[0] if get_origin(annotation) in (Union, UnionType) and len(args) == 1 else annotation


@st.composite
def drawn_record(draw, record_type: Any, full: dict) -> dict:
    """`full`, each field drawn: missing (a field the schema does not require), null (one it lets be null),
    empty (a list or object), or as it is; a status drawn among its enum's; records inside drawn the same way."""
    hints = get_type_hints(record_type, include_extras=True)
    nullable = {name for name, types in schema.json_field_types(record_type).items() if type(None) in types}
    drawn: dict = {}
    for name, value in full.items():
        inner = _inner(hints[name])
        choices: list = [value]
        if name in record_type.__optional_keys__:
            choices.append(ABSENT)
        if name in nullable:
            choices.append(None)
        if isinstance(inner, type) and issubclass(inner, StrEnum):
            choices += list(inner)
        elif is_typeddict(inner):
            choices[0] = draw(drawn_record(inner, value))
        elif get_origin(inner) is dict and is_typeddict(get_args(inner)[1]):
            choices[0] = {key: draw(drawn_record(get_args(inner)[1], item)) for key, item in value.items()}
        if isinstance(value, (list, dict)):
            choices.append(type(value)())
        choice = draw(st.sampled_from(choices))
        if choice is not ABSENT:
            drawn[name] = choice
    return drawn


def masked_step_row() -> dict:
    """A metrics.jsonl row of a step whose every sample failed for infrastructure, as the loop writes it: its step
    figures, its held-out evaluation's, and its scale figures from actors that reported nothing."""
    report = GenerationReport(step=0, seconds=1.0, rounds=1, num_groups=0, first_round_rewards=[])
    row = step_metrics([], {"masked": 8}, report, {}, None, waited_s=0.0, train_s=0.0, busy_s=0.0, hidden_s=None,
                       step_s=0.0, version=0)
    row.update(eval_metrics([], k=4, step=0, policy_version=0))
    row.update(merge([], seconds=1.0), router_requests_per_s=None, router_rps_source="actors")
    return {"step": 0, "time": 1.0, **row}


MASKED = masked_step_row()
NULLABLE_FIGURES = sorted(k for k, v in MASKED.items() if v is None)
FIGURE = st.integers(0, 10**6) | st.floats(0, 1e6)


@st.composite
def metrics_rows(draw) -> list[dict]:
    """0-3 step rows, each nullable figure null or a number."""
    rows = []
    for step in range(draw(st.integers(0, 3))):
        row = {**MASKED, "step": step, "time": 1.0 + step}
        row.update({k: draw(st.none() | FIGURE) for k in NULLABLE_FIGURES})
        rows.append(row)
    return rows


def make_run_dir(run: dict, rows: list[dict]) -> None:
    """The run's folder with a log, the recipe copy and `rows` as its metrics.jsonl."""
    logs = Path(run["run_dir"]) / "logs"
    logs.mkdir(parents=True)
    (logs / "trainer.log").write_text("2026-12-01T00:00:01.000 step 1 done\n")
    (logs.parent / "recipe.toml").write_text('[run]\nname = "r"\n')
    Path(run["metrics_path"]).write_text("".join(json.dumps(row) + "\n" for row in rows))


@st.composite
def cases(draw, home: Path) -> tuple[dict, list[dict]]:
    """(a state document, its run's metrics rows), drawn over `full_doc(home)`."""
    template = full_doc(home)
    doc = draw(drawn_record(StateDoc, template))
    # The run stays (`rl360 report` on no run is a one-line error, tested in tests/cli/test_report.py).
    doc["runs"] = {"r1": draw(drawn_record(schema.RunRecord, template["runs"]["r1"]))}
    return doc, draw(metrics_rows())


def test_the_template_holds_every_field_of_the_schema(tmp_path):
    """A field added to the schema must be added to `full_doc`, or it would never be drawn."""
    doc = full_doc(tmp_path)
    records = {schema.StateDoc: doc, schema.ProfileRecord: doc["profile"], schema.TierRecord: doc["tiers"]["rollout"],
               schema.TierResources: doc["tiers"]["rollout"]["resources"],
               schema.PendingAllocation: doc["tiers"]["rollout"]["pending"], schema.NodeRecord: doc["nodes"]["local"],
               schema.NodeImage: doc["nodes"]["local"]["images"]["python:3.11"],
               schema.NodePrewarm: doc["nodes"]["local"]["prewarm"],
               schema.ComponentRecord: doc["components"]["rollout/engine-0"],
               schema.HolderRecord: doc["components"]["rollout/engine-0"]["holders"][0], schema.RunRecord: doc["runs"]["r1"],
               schema.SandboxRecord: doc["sandboxes"]["fleet-1/a0"], schema.PrewarmRecord: doc["prewarm"],
               schema.PrewarmImage: doc["prewarm"]["images"]["py"]}
    for record_type, record in records.items():
        assert set(record) == set(get_type_hints(record_type)), record_type.__name__
    assert schema.shape_problem(doc) is None
    assert {"reward_mean", "pass_rate", "eval/pass@1", "admission_queue_max"} <= set(NULLABLE_FIGURES)


def invoke(state: Path, *args: str):
    return CliRunner().invoke(build_app(), ["--state", str(state), *args])


def render_live_view(run_id: str, run: dict, rows: list[dict]) -> str:
    console = Console(file=io.StringIO(), width=160)
    now = datetime.fromisoformat(STAMP).timestamp() + 60.0
    console.print(live_view(run_id, run, rows, 12.0, now=now, sessions_per_step=8, generation=None))
    for row in rows:
        console.print(row_line(row, run), markup=False)
        console.print(scale_text(row) or "", markup=False)
    console.print(summary_text(run_id, run, rows, 12.0))
    return console.file.getvalue()


@fuzz(40)
@given(data=st.data())
def test_every_nullable_field_renders(tmp_path, monkeypatch, data):
    monkeypatch.chdir(REPO)  # a state with no profile falls back to cluster/local.toml
    home = Path(tempfile.mkdtemp(dir=tmp_path))
    doc, rows = data.draw(cases(home))
    make_run_dir(doc["runs"]["r1"], rows)
    state = home / "state.json"
    state.write_text(json.dumps(doc))

    result = invoke(state, "status")
    after = json.loads(state.read_text())
    failed = (any(c["status"] == ComponentStatus.FAILED for c in after["components"].values())
              or after["runs"].get(after.get("current_run") or "", {}).get("status") == RunStatus.FAILED)
    assert result.exit_code == (3 if failed else 0) and not _raised(result), said(result)
    assert "runs" in result.output and "None" not in result.output, said(result)  # a null shows as "-"
    for args in (["logs"], ["report"]):
        result = invoke(state, *args)
        assert result.exit_code == 0 and not _raised(result) and "None" not in result.output, said(result)
    assert "report.html" in result.output
    frame = render_live_view("r1", json.loads(state.read_text())["runs"]["r1"], rows)
    assert "run r1" in frame and "None" not in frame, frame


def said(result) -> str:
    return f"exit {result.exit_code}, {result.exception!r}: {result.output[-1500:]}"


def _raised(result) -> BaseException | None:
    """The exception the command ended with, other than its exit code."""
    return None if isinstance(result.exception, (SystemExit, type(None))) else result.exception
