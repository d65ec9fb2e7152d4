"""The first thing a component's job step runs on its node: record the step, then become the supervisor.

    srun ... python -m rl360cli.backends.slurm_step STEP_JSON STATUS_JSON LOG -- COMMAND [ARGS...]

It writes STEP_JSON (job id, step id, node, rank: what `scancel` and `sacct`
need, which `srun` itself never prints) and then execs
`python -m rl360cli.supervise STATUS_JSON LOG -- COMMAND`, so the
component's log lines get timestamps and its exit code lands in the shared run
folder. In a step of several tasks (one per node), rank 0 keeps the given
paths and rank r writes `NAME.r.log`, `NAME.r.status.json`, `NAME.r.step.json`.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path


def rank_path(path: str, rank: int) -> str:
    """`x/training.trainer.log` for rank 0, `x/training.trainer.2.log` for rank 2 (any suffix chain)."""
    if rank == 0:
        return path
    p = Path(path)
    stem, dot, suffix = p.name.partition(".")  # tier . rest
    name, _, ext = suffix.partition(".")
    return str(p.with_name(f"{stem}.{name}.{rank}.{ext}" if ext else f"{stem}{dot}{suffix}.{rank}"))


def step_report() -> dict:
    return {
        "job_id": os.environ.get("SLURM_JOB_ID"),
        "step_id": os.environ.get("SLURM_STEP_ID") or os.environ.get("SLURM_STEPID"),
        "node": os.environ.get("SLURMD_NODENAME") or socket.gethostname(),
        "rank": int(os.environ.get("SLURM_PROCID", "0")),
        "num_tasks": int(os.environ.get("SLURM_NTASKS", "1")),
        "host": socket.gethostname(),
        "pid": os.getpid(),
    }


def main(argv: list[str]) -> int:
    if len(argv) < 5 or argv[3] != "--":
        print("usage: python -m rl360cli.backends.slurm_step STEP_JSON STATUS_JSON LOG -- COMMAND [ARGS...]",
              file=sys.stderr)
        return 2
    step_path, status_path, log_path, command = argv[0], argv[1], argv[2], argv[4:]
    report = step_report()
    rank = report["rank"]
    step_file = Path(rank_path(step_path, rank))
    step_file.parent.mkdir(parents=True, exist_ok=True)
    tmp = step_file.with_name(f".{step_file.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(report))
    os.replace(tmp, step_file)
    os.execv(sys.executable, [sys.executable, "-m", "rl360cli.supervise",
                              rank_path(status_path, rank), rank_path(log_path, rank), "--", *command])
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
