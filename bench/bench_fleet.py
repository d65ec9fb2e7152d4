"""Benchmark of fleets through the CLI: `rl360 sandboxes launch -n N` then `rl360 sandboxes stop`, process
sandboxes on this machine, against a state file of its own.

    .venv/bin/python bench/bench_fleet.py [--count 1500] [--no-write]

Reports launch and stop seconds and rates (each including the CLI's own start), and checks that
nothing is left afterwards: no folder of the fleet under the sandbox root, no keeper process alive.
Rewrites the `## Fleets` section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TITLE = "Fleets"
sys.path.insert(0, str(REPO))

from bench.report import write_section  # noqa: E402
from rl360cli import procinfo  # noqa: E402


def rl360(*args: str, state: Path) -> tuple[float, dict]:
    began = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "rl360cli", *args, "--json"], capture_output=True, text=True,
                          cwd=REPO, env={**os.environ, "RL360_STATE": str(state)}, timeout=900)
    seconds = time.perf_counter() - began
    if proc.returncode != 0:
        raise SystemExit(f"rl360 {' '.join(args)} failed: {proc.stderr[-2000:]}")
    return seconds, json.loads(proc.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=1500)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rl360-fleet-") as tmp:
        state = Path(tmp) / "state.json"
        run = f"fleet-bench-{os.getpid()}"
        launch_s, _ = rl360("sandboxes", "launch", "-n", str(args.count), "--cpus", "0.001", "--memory-mb", "16",
                            "--wave-size", "500", "--interval", "0.05", "--run", run,
                            "--profile", str(REPO / "cluster" / "local.toml"), state=state)
        records = json.loads(state.read_text())["sandboxes"]
        folders = [Path(r["folder"]) for r in records.values() if r.get("folder")]
        keepers = [(r["pid"], r.get("pid_start")) for r in records.values() if r.get("pid")]
        stop_s, stopped = rl360("sandboxes", "stop", state=state)
    left_folders = sum(f.exists() for f in folders)
    left_processes = sum(procinfo.is_alive(pid, start) for pid, start in keepers)
    count = len(records)
    lines = [f"`bench/bench_fleet.py` on this machine ({os.cpu_count()} cores, {platform.machine()}), "
             f"{time.strftime('%Y-%m-%d')}; load average {os.getloadavg()[0]:.1f} when it ended. Process sandboxes "
             "(bubblewrap keepers) through the CLI, each figure including the CLI's own start (~0.3 s).", "",
             "| sandboxes | launch | launch rate | stop | stop rate | left after stop (folders / processes) |",
             "|---|---|---|---|---|---|",
             f"| {count} | {launch_s:.1f} s | {count / launch_s:.0f}/s | {stop_s:.2f} s | {count / stop_s:.0f}/s | "
             f"{left_folders} / {left_processes} |", "",
             "Stopping kills every keeper first, waits for them together and deletes the folders on 16 threads "
             "(rl360cli/sandbox/janitor.py); one at a time, a kill, a wait and a delete took ~20 ms each "
             "(1,500 in 28.6 s, 52/s, before).", ""]
    text = "\n".join(lines)
    print(text)
    print(f"stopped {len(stopped.get('stopped', []))} of {count}")
    if left_folders or left_processes or len(stopped.get("stopped", [])) != count:
        raise SystemExit("the fleet was not fully removed")
    if not args.no_write:
        write_section(TITLE, text)


if __name__ == "__main__":
    main()
