"""Benchmark of the Slurm backend on the dev Slurm cluster (cluster/dev/slurm.sh up).

    .venv/bin/python bench/bench_slurm.py [--rounds 7] [--no-node-loss]

Measures, through the real CLI against a private state file:
- provision (three whole-node tiers, submit -> every holder reported) and down (scancel -> sacct confirms);
- starting a component as a job step, and one `rl360 status`;
- fan-out: rounds of ten concurrent `rl360 status` calls, every Slurm command counted by a PATH wrapper
  that logs the call and runs the real tool: sacct calls per poll interval, against one per call;
- node loss: slurmd of the training node killed (`slurm.sh kill-node`), time until `rl360 status`
  says node_lost, until the tier runs again on another node, and until its component is restarted.
Writes the figures into the `## Slurm backend` section of docs/benchmarks.md, leaving the others alone.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.report import write_section  # noqa: E402

DEV_ROOT = Path(os.environ.get("RL360_DEV_ROOT", "/tmp/rl360-dev"))
PROFILE = REPO / "cluster" / "dev-slurm.toml"
TITLE = "Slurm backend"


def cli(state: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    full = {**os.environ, "RL360_STATE": str(state), **(env or {})}
    return subprocess.run([sys.executable, "-m", "rl360cli", *args], cwd=REPO, env=full, capture_output=True,
                          text=True, timeout=300)


def say(message: str) -> None:
    print(f"[bench_slurm {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def start(state: Path, name: str, tier: str, argv: list[str], kind: str = "bench") -> dict:
    from rl360cli.backends.base import ComponentSpec
    from rl360cli.stages.base import Context, resolve_profile, start_component
    from rl360cli.state.store import StateFile

    sf = StateFile(state)
    profile, path = resolve_profile(sf, None, None)
    ctx = Context(state=sf, profile=profile, profile_path=path)
    return start_component(ctx, ComponentSpec(name=name, tier=tier, stage="bench", kind=kind, argv=tuple(argv)))


def status(state: Path, env: dict | None = None) -> dict:
    proc = cli(state, "status", "--json", env=env)
    return json.loads(proc.stdout)


def fan_out(state: Path, work: Path, rounds: int, gap_s: float) -> dict:
    calls = work / "calls.log"
    wrappers = work / "bin"
    wrappers.mkdir(exist_ok=True)
    for tool in ("sacct", "squeue", "sinfo"):
        (wrappers / tool).write_text(f'#!/bin/sh\necho {tool} >> {calls}\nexec {shutil.which(tool)} "$@"\n')
        (wrappers / tool).chmod(0o755)
    env = {**os.environ, "PATH": f"{wrappers}:{os.environ['PATH']}", "RL360_STATE": str(state), "COLUMNS": "200"}
    latencies = []
    per_round = []
    t0 = time.monotonic()
    for i in range(rounds):
        started = time.monotonic()
        before = calls.read_text().split().count("sacct") if calls.exists() else 0
        procs = [(time.perf_counter(), subprocess.Popen([sys.executable, "-m", "rl360cli", "status", "--json"],
                                                        cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                                                        stderr=subprocess.DEVNULL)) for _ in range(10)]
        for t, p in procs:
            p.wait(timeout=300)
            latencies.append(time.perf_counter() - t)
        per_round.append(calls.read_text().split().count("sacct") - before if calls.exists() else 0)
        if i < rounds - 1:
            time.sleep(max(0.0, gap_s - (time.monotonic() - started)))
    elapsed = time.monotonic() - t0
    lines = calls.read_text().split() if calls.exists() else []
    return {"rounds": rounds, "calls": rounds * 10, "elapsed": elapsed, "sacct": lines.count("sacct"),
            "squeue": lines.count("squeue"), "sinfo": lines.count("sinfo"),
            "latency_p50": statistics.median(latencies), "latency_max": max(latencies), "per_round": per_round}


def node_loss(state: Path, interval: float) -> dict:
    doc = json.loads(state.read_text())
    victim = doc["tiers"]["training"]["nodes"][0]
    script = REPO / "cluster" / "dev" / "slurm.sh"
    t0 = time.monotonic()
    subprocess.run(["bash", str(script), "kill-node", victim], check=True, capture_output=True, timeout=120)
    out = {"victim": victim}
    try:
        while time.monotonic() - t0 < 120:
            asked = time.monotonic() - t0
            report = status(state)
            now = time.monotonic() - t0
            comp = report["components"]["training/worker"]
            tier = report["tiers"]["training"]
            if "node_lost" not in out and comp.get("reason") == "node_lost":
                out["node_lost"], out["asked"] = now, asked
            if "node_lost" in out and tier["status"] == "ready" and tier["nodes"] != [victim] and "back" not in out:
                out["back"] = now
                out["new_node"] = tier["nodes"][0]
            if "back" in out and comp["status"] == "running":
                out["restarted"] = now
                break
            time.sleep(0.5)
    finally:
        subprocess.run(["bash", str(script), "revive-node", victim], capture_output=True, timeout=120)
    out["interval"] = interval
    return out


def render(r: dict, load: float) -> str:
    f = r["fanout"]
    lines = [f"`bench/bench_slurm.py` on the dev Slurm (`cluster/dev/slurm.sh`: slurmctld, slurmdbd, four fake "
             f"nodes on one machine, {os.cpu_count()} cores), profile `cluster/dev-slurm.toml` (poll interval "
             f"{r['interval']:g} s, heartbeat {r['heartbeat']:g} s), {time.strftime('%Y-%m-%d')}; load average "
             f"{load:.1f} when it started (other work on the machine slows every figure).", "",
             "| step | seconds |", "|---|---|",
             f"| `rl360 provision` (3 whole-node tiers: sbatch through submitit until every node reported) | "
             f"{r['provision']:.2f} |",
             f"| start one component as a job step (`srun --overlap`, until its supervisor runs), median of 3 | "
             f"{r['launch']:.2f} |",
             f"| one `rl360 status` (3 tiers, 3 components; CLI start-up included) | {r['status']:.2f} |",
             f"| `rl360 down` (3 steps stopped, 3 jobs cancelled, confirmed through sacct) | {r['down']:.2f} |", "",
             f"**Ten concurrent `rl360 status`**: {f['rounds']} rounds of 10 concurrent calls, "
             f"{f['calls'] // f['rounds'] * f['rounds']} calls in {f['elapsed']:.1f} s; each Slurm command counted "
             "by a PATH wrapper that logs it and runs the real tool.", "",
             "| measure | value |", "|---|---|",
             f"| sacct calls | {f['sacct']} (poll intervals spanned: {f['elapsed'] / r['interval']:.1f}; "
             f"one per call would be {f['calls']}) |",
             f"| sacct calls per round of 10 concurrent calls | {', '.join(map(str, f['per_round']))} |",
             f"| squeue / sinfo calls | {f['squeue']} / {f['sinfo']} |",
             f"| status latency p50 / max under 10-way contention | {f['latency_p50']:.2f} s / "
             f"{f['latency_max']:.2f} s |"]
    loss = r.get("loss")
    if loss:
        lines += ["", f"**Node loss**: slurmd of the training node ({loss['victim']}) and its job steps killed "
                  "(`slurm.sh kill-node`); `rl360 status` every 0.5 s.", "",
                  "| after the kill | seconds |", "|---|---|",
                  f"| a status call returns `node_lost` (it began at {loss.get('asked', float('nan')):.1f}) | "
                  f"{loss.get('node_lost', float('nan')):.1f} "
                  f"({loss.get('node_lost', float('nan')) / loss['interval']:.1f} poll intervals) |",
                  f"| the tier runs again on {loss.get('new_node', '?')} (requeued, lost node excluded) | "
                  f"{loss.get('back', float('nan')):.1f} |",
                  f"| its component restarted there | {loss.get('restarted', float('nan')):.1f} |"]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--no-node-loss", action="store_true")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    cluster = json.loads((DEV_ROOT / "slurm" / "cluster.json").read_text())
    os.environ.update(cluster["env"])
    from rl360cli.config import load_profile

    opts = load_profile(PROFILE).slurm
    load = os.getloadavg()[0]
    work = Path(tempfile.mkdtemp(prefix="rl360-bench-slurm-"))
    state = work / "rl360" / "state.json"
    r: dict = {"interval": opts.poll_interval_s, "heartbeat": opts.heartbeat_s}
    try:
        say("provision")
        r["provision"], proc = timed(lambda: cli(state, "provision", "--profile", str(PROFILE)))
        assert proc.returncode == 0, proc.stderr
        say(f"provisioned in {r['provision']:.2f} s; starting components")
        launches = []
        for tier, name in (("service", "svc"), ("training", "worker"), ("rollout", "roll")):
            t, _ = timed(lambda: start(state, name, tier, ["sleep", "600"]))
            launches.append(t)
        r["launch"] = statistics.median(launches)
        r["status"], _ = timed(lambda: status(state))
        say(f"fan-out: {args.rounds} rounds of 10 concurrent status calls")
        r["fanout"] = fan_out(state, work, args.rounds, opts.poll_interval_s / 2)
        say(f"fan-out done: {r['fanout']}")
        if not args.no_node_loss:
            say("node loss")
            r["loss"] = node_loss(state, opts.poll_interval_s)
            say(f"node loss done: {r['loss']}")
        r["down"], proc = timed(lambda: cli(state, "down", "--grace", "3"))
        assert proc.returncode == 0, proc.stderr
    finally:
        if state.exists() and json.loads(state.read_text()).get("tiers"):
            cli(state, "down", "--grace", "1")
    text = render(r, load)
    print(f"## {TITLE}\n\n{text}")
    if not args.no_write:
        write_section(TITLE, text)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
