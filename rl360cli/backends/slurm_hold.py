"""What a tier's allocation runs: one task per node that says where it is, then holds the node.

submitit pickles `hold` by reference and runs it as the job's first step, one
task per node. Each task writes `NODES_DIR/<node>.<job id>.json` (node name,
host, CPUs it may use, GPUs Slurm gave it) so that `rl360 provision` knows the
allocation really started on every node and that Python and rl360 work there;
then it touches that file every few seconds (a heartbeat: rl360 counts a node
whose file goes stale as lost) until Slurm ends the job. Components are started later as job
steps that overlap this one. Imports nothing heavy: it runs on every node.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from pathlib import Path


def node_report() -> dict:
    """What this task knows about its node, from Slurm's environment."""
    return {
        "node": os.environ.get("SLURMD_NODENAME") or socket.gethostname(),
        "host": socket.gethostname(),
        "job_id": os.environ.get("SLURM_JOB_ID"),
        "het_job_id": os.environ.get("SLURM_HET_JOB_ID"),
        "het_group": os.environ.get("SLURM_HET_JOB_OFFSET") or os.environ.get("SLURM_HET_JOB_ID_SET"),
        "cpus": len(os.sched_getaffinity(0)),
        "gpus": os.environ.get("CUDA_VISIBLE_DEVICES") or os.environ.get("SLURM_STEP_GPUS") or "",
        "pid": os.getpid(),
        "started_at": time.time(),
    }


def write_report(nodes_dir: Path, report: dict) -> Path:
    nodes_dir.mkdir(parents=True, exist_ok=True)
    path = nodes_dir / f"{report['node']}.{report['job_id']}.json"
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(report))
    os.replace(tmp, path)
    return path


class _Ended(Exception):
    """Raised from the SIGTERM handler: a sleep would otherwise resume after the handler returns."""


def hold(nodes_dir: str, *, tick_s: float = 30.0) -> None:
    """Report this node, then touch the report every `tick_s` (a heartbeat: a node whose report goes
    stale is lost) until Slurm ends the allocation (SIGTERM or the time limit)."""
    report = write_report(Path(nodes_dir), node_report())

    def end(_signum: int, _frame: object) -> None:
        raise _Ended

    signal.signal(signal.SIGTERM, end)
    try:
        while True:
            time.sleep(tick_s)
            try:
                os.utime(report)
            except OSError:
                pass  # a file system hiccup; the next beat tries again
    except _Ended:
        return
