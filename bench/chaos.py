"""Chaos on the dev cluster: one `rl360 up` (Slurm tiers, Docker sandboxes) under a schedule of faults.

    .venv/bin/python bench/chaos.py [--steps 40] [--faults status,lock,...] [--no-write]

Needs the dev services (`bash cluster/dev/all.sh status`): Slurm n1..n4, dockerd n1..n3 and the
loopback registry. The run is local-smoke's committed policy v0 (no warm-up to build)
on the dev Slurm tiers, one job per tier on three fake nodes, with sandboxes as
containers on the three dev Docker nodes (the profile is cluster/dev-slurm.toml plus the `[[nodes]]`
and `[registry]` of cluster/dev-docker.toml, on free ports). It is started with `--detach`; the
faults of `bench/chaos_faults.py` SCHEDULE then fire one at a time, each once the previous one has
recovered and the run has finished one more step (so each fault has steps of its own). Per fault:
detected after and recovered after (s), the samples masked by cause in its window (from its firing
to the next fault's), the samples trained with a reward they did not earn, and after `rl360 down`
what was left: processes, containers, Ray, Slurm jobs. Every node is running again at the end, also
when the run failed. Writes `bench/results/chaos.json` and, unless `--no-write`, the section
"## Chaos on the dev cluster" of docs/reliability.md.

"Trained with a reward it did not earn" is read from the step ledger (`ledger.jsonl`: each step's
trained samples and its masked ones with their causes, every entry the bench saw, also those a resume
rewrote): a victim of a sandbox fault (its sandbox hit before its verifier wrote a reward) that was
trained, plus any trained sample the run itself recorded as infra-failed.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import queue
import re
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.chaos_faults import RECOVERY_TIMEOUT_S, SCHEDULE, Fault  # noqa: E402
from bench.report import write_section  # noqa: E402
from rl360cli import procinfo  # noqa: E402
from rl360cli.loop.ledger import trained_rewards  # noqa: E402
from rl360cli.ports import free_port_block  # noqa: E402

DEV_ROOT = Path(os.environ.get("RL360_DEV_ROOT", "/tmp/rl360-dev"))
RELIABILITY = REPO / "docs" / "reliability.md"
RESULTS = REPO / "bench" / "results" / "chaos.json"
TITLE = "Chaos on the dev cluster"
TASKS = REPO / "recipes" / "tasks" / "arith-32"
# local-smoke's committed policy v0: it earns rewards on the arith tasks and costs no warm-up (a tiny
# policy warmed up here took 87 s of a fresh machine's test run).
POLICY = REPO / "recipes" / "models" / "local-smoke-v0"
# The run seed of the bench's earlier results (docs/reliability.md).
RUN_SEED = 2

RECIPE = """
[run]
name = "chaos"
seed = {seed}
profile = "profile.toml"
[tasks]
path = "{tasks}"
[metrics]
wandb = false
[model]
kind = "huggingface"
path = "{policy}"
[loop]
num_steps = {steps}
num_tasks_per_step = {tasks_per_step}
num_samples_per_task = 4
max_generation_rounds = 1
# Faults cost steps their signal (an engine away, a node lost); the guard has its own test.
max_steps_without_signal = 0
[trainer]
checkpoint_every = 2
[engine]
num_threads = 1
[rollout]
# A rollout tier whose Ray worker never joins fails the run in two minutes, not at the bench's timeout.
actor_start_timeout_s = 120
[sandbox]
provider = "docker"
cpus = 0.05
# Below the arith tasks' declared 256 MB (an OOM of the verifier is then the infrastructure's), and
# equal to the two 64 MB tmpfs mounts, so that filling them fills the sandbox (the OOM fault).
memory_mb = 128
[sandbox.warm_pool]
# Every container is its attempt's (label rl360.attempt), so a fault's victim is known by name.
size = 0
"""

PROFILE = """
name = "chaos-dev"
backend = "slurm"
bind_host = "127.0.0.1"
base_port = {base}
sync_port = {sync}
images = "{images}"
[slurm]
slurm_conf = "${{RL360_DEV_ROOT:-/tmp/rl360-dev}}/slurm/slurm.conf"
partition = "debug"
time_limit = "00:30:00"
mode = "per-tier"
exclusive = true
max_requeues = 2
heartbeat_s = 1.0
poll_interval_s = 3.0
max_poll_interval_s = 30.0
allocation_timeout_s = 120.0
step_timeout_s = 60.0
command_timeout_s = 20.0
[tiers.service]
num_nodes = 1
[tiers.training]
num_nodes = 1
[tiers.rollout]
num_nodes = 1
[registry]
address = "{registry}"
max_concurrent_pulls = 4
mirrors = {{ "docker.io" = "{registry}/hub" }}
"""


def write_chaos_files(folder: Path, *, steps: int, tasks_per_step: int = 6) -> Path:
    """The profile (dev Slurm tiers + the dev Docker nodes, free ports) and the recipe; the recipe's path."""
    nodes = json.loads((DEV_ROOT / "docker" / "nodes.json").read_text())
    base = free_port_block(20)
    profile = PROFILE.format(base=base, sync=base + 15, images=REPO / "images" / "images.toml",
                             registry=nodes["registry"])
    for node in nodes["nodes"]:
        profile += f'[[nodes]]\nname = "{node["name"]}"\ndocker_host = "{node["docker_host"]}"\n'
    (folder / "profile.toml").write_text(profile)
    recipe = folder / "recipe.toml"
    recipe.write_text(textwrap.dedent(RECIPE).format(seed=RUN_SEED, tasks=TASKS, policy=POLICY,
                                                     steps=steps, tasks_per_step=tasks_per_step))
    return recipe


class ChaosRun:
    """One run under chaos: the CLI against its own state file, and what the faults look at."""

    def __init__(self, folder: Path, recipe: Path):
        import docker

        self.folder, self.recipe = folder, recipe
        self.state_path = folder / "rl360" / "state.json"
        self.env = {**os.environ, "RL360_STATE": str(self.state_path), "COLUMNS": "200"}
        nodes = json.loads((DEV_ROOT / "docker" / "nodes.json").read_text())["nodes"]
        self.docker = {n["name"]: docker.DockerClient(base_url=n["docker_host"], version="1.41", timeout=15)
                       for n in nodes}
        self.slurm_env = {**os.environ, **json.loads((DEV_ROOT / "slurm" / "cluster.json").read_text())["env"]}
        self.run_id = ""
        self._ledger: dict[str, tuple[float, dict]] = {}  # every entry seen, by its JSON, first sighting
        self._pids: dict[int, int | None] = {}  # every pid the run's records named -> its start time
        self._jobs: set[str] = set()
        self._last_reconcile = 0.0

    # ------------------------------------------------------------------ the CLI and the state file

    def cli(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "rl360cli", *args], check=False, cwd=self.folder, env=self.env,
                              capture_output=True, text=True, timeout=timeout)

    def doc(self) -> dict:
        for _ in range(20):  # the file is replaced atomically; this only covers its first creation
            try:
                return json.loads(self.state_path.read_text())
            except (OSError, ValueError):
                time.sleep(0.1)
        return json.loads(self.state_path.read_text())

    def run_record(self) -> dict:
        doc = self.doc()
        return doc["runs"].get(self.run_id or doc.get("current_run") or "", {})

    def step(self) -> int:
        return int(self.run_record().get("step") or 0)

    def status_json(self) -> dict | None:
        proc = self.cli("status", "--json", timeout=120)
        self._last_reconcile = time.time()
        try:
            return json.loads(proc.stdout)
        except ValueError:
            return None

    def reconcile(self, *, every_s: float) -> None:
        """`rl360 status` at most every `every_s`: the reconcile that notices a lost Slurm node."""
        if time.time() - self._last_reconcile >= every_s:
            self.status_json()

    def state_updated_after(self, when: float) -> bool:
        stamp = self.doc().get("updated_at")
        return stamp is not None and _epoch(stamp) > when

    def events_since(self, when: float) -> list[dict]:
        path = self.state_path.with_name("events.jsonl")
        out = []
        for line in path.read_text().splitlines() if path.exists() else []:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            event["_time"] = _epoch(event["time"])
            if event["_time"] >= when:
                out.append(event)
        return out

    def run_dir(self) -> Path:
        return Path(self.doc()["runs"][self.run_id]["run_dir"])

    def refresh(self) -> None:
        """Note every ledger entry, pid and Slurm job the run shows now (the ledger is rewritten on resume)."""
        doc = self.doc()
        for rec in doc.get("components", {}).values():
            for key in ("pid", "supervisor_pid"):
                pid = rec.get(key)
                if isinstance(pid, int) and pid not in self._pids:
                    self._pids[pid] = procinfo.start_time(pid)
            if rec.get("job_id"):
                self._jobs.add(str(rec["job_id"]))
        for tier in doc.get("tiers", {}).values():
            if tier.get("job_id"):
                self._jobs.add(str(tier["job_id"]))
        if not self.run_id:
            return
        ledger = self.run_dir() / "ledger.jsonl"
        for line in ledger.read_text().splitlines() if ledger.exists() else []:
            if line.strip() and line not in self._ledger:
                self._ledger[line] = (time.time(), json.loads(line))

    def ledger_seen(self) -> list[tuple[float, dict]]:
        return sorted(self._ledger.values(), key=lambda seen: seen[0])

    # ------------------------------------------------------------------ sandboxes

    def containers_newest_first(self) -> list[tuple[str, object]]:
        found = []
        for node, client in self.docker.items():
            try:
                found += [(node, c) for c in client.containers.list(filters={"label": f"rl360.run={self.run_id}"})]
            except Exception:  # noqa: BLE001 — a node that is down has none to offer
                continue
        return sorted(found, key=lambda nc: nc[1].attrs["Created"], reverse=True)

    def containers_as_started(self, until: float) -> Iterator[tuple[str, object]]:
        """The run's containers as their daemons start them (the daemons' `start` events), until `until`.

        A fault on a sandbox must find one before its agent answers: a step's attempts answer within a
        second of their start, and polling the daemons' lists found none unanswered in 120 s once (CI)."""
        import docker.errors

        started: queue.Queue = queue.Queue()
        streams = []
        for node, client in self.docker.items():
            try:
                stream = client.api.events(decode=True, filters={"type": "container", "event": "start",
                                                                 "label": f"rl360.run={self.run_id}"})
            except Exception:  # noqa: BLE001 — a node that is down starts nothing
                continue
            streams.append(stream)
            threading.Thread(target=_queue_events, args=(node, stream, started), daemon=True).start()
        try:
            while time.time() < until:
                try:
                    node, container_id = started.get(timeout=min(0.5, max(0.0, until - time.time())))
                except queue.Empty:
                    continue
                try:
                    yield node, self.docker[node].containers.get(container_id)
                except docker.errors.NotFound:  # its attempt ended already
                    continue
        finally:
            for stream in streams:
                stream.close()

    def container_exec(self, node: str, container, command: str) -> int | None:
        try:
            return container.exec_run(["/bin/sh", "-c", command], user="0").exit_code
        except Exception:  # noqa: BLE001
            return None

    def container_exec_output(self, node: str, container, command: str) -> tuple[int | None, str]:
        try:
            result = container.exec_run(["/bin/sh", "-c", command], user="0")
            return result.exit_code, result.output.decode(errors="replace")
        except Exception as e:  # noqa: BLE001
            return None, f"{type(e).__name__}: {e}"

    def has_any_file(self, node: str, container, paths: tuple[str, ...]) -> bool:
        """Whether any of `paths` exists in the container (paused or not: the daemon's archive call)."""
        import docker.errors

        for path in paths:
            try:
                container.get_archive(path)
                return True
            except docker.errors.NotFound:
                continue
            except Exception:  # noqa: BLE001 — cannot tell: count it as there (not a victim)
                return True
        return False

    def container_exists(self, node: str, container_id: str) -> bool:
        import docker.errors

        try:
            self.docker[node].containers.get(container_id)
            return True
        except docker.errors.NotFound:
            return False
        except Exception:  # noqa: BLE001 — the daemon did not answer: cannot tell, so not gone
            return True

    def newest_container_created(self, node: str) -> float | None:
        try:
            found = self.docker[node].containers.list(all=True, filters={"label": f"rl360.run={self.run_id}"})
        except Exception:  # noqa: BLE001
            return None
        return max((_epoch(c.attrs["Created"]) for c in found), default=None)

    def oom_events(self, node: str, container_id: str, since: float) -> int:
        try:
            return len(list(self.docker[node].api.events(since=int(since) - 1, until=int(time.time()) + 1,
                                                         filters={"container": container_id, "event": "oom"},
                                                         decode=True)))
        except Exception:  # noqa: BLE001
            return -1

    # ------------------------------------------------------------------ after `rl360 down`

    def leftovers(self) -> dict:
        """What the run left after `down`: its processes, containers, Ray daemons and Slurm jobs."""
        folder = str(self.folder)
        alive = sorted(pid for pid, started in self._pids.items() if procinfo.is_alive(pid, started))
        mentioning, ray = [], []
        for pid in _pids_on_machine():
            if pid == os.getpid():
                continue
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if folder in cmdline:
                (ray if re.search(r"raylet|gcs_server|ray/_private|dashboard", cmdline) else mentioning).append(pid)
        containers = {}
        for node, client in self.docker.items():
            try:
                containers[node] = [c.name for c in client.containers.list(
                    all=True, filters={"label": f"rl360.run={self.run_id}"})]
            except Exception as e:  # noqa: BLE001
                containers[node] = [f"(node did not answer: {type(e).__name__})"]
        queued = subprocess.run(["squeue", "-h", "-o", "%i"], check=False, env=self.slurm_env, capture_output=True,
                                text=True, timeout=60).stdout.split()
        return {"processes": sorted(set(alive) | set(mentioning)), "ray": ray,
                "containers": {n: c for n, c in containers.items() if c},
                "slurm_jobs": sorted(self._jobs & set(queued))}


def _queue_events(node: str, stream, started: queue.Queue) -> None:
    try:
        for event in stream:
            started.put((node, event["id"]))
    except Exception:  # noqa: BLE001 — the stream was closed, or its daemon stopped
        pass


def run_chaos(folder: Path, *, steps: int, faults: list[str | Fault], tasks_per_step: int = 6,
              steps_between: int = 1, log=None) -> dict:
    """One run under the faults, in order (SCHEDULE's keys, or Fault objects); the report (see the module
    docstring). Each fault fires once the previous one has recovered and the run has finished
    `steps_between` more steps (0: at once)."""
    log = log or (lambda line: print(line, flush=True))
    recipe = write_chaos_files(folder, steps=steps, tasks_per_step=tasks_per_step)
    run = ChaosRun(folder, recipe)
    chosen: list[Fault] = [SCHEDULE[f]() if isinstance(f, str) else f for f in faults]
    report: dict = {"steps": steps, "faults": [], "started": time.time()}
    try:
        up = run.cli("up", "--recipe", str(recipe), "--detach", timeout=900)
        if up.returncode != 0:
            raise RuntimeError(f"rl360 up exited {up.returncode}: {(up.stderr or up.stdout)[-2000:]}")
        run.run_id = run.doc()["current_run"]
        log(f"run {run.run_id} started")
        doc = run.doc()
        report["tier_nodes"] = {name: tier.get("nodes") for name, tier in doc["tiers"].items()}
        report["components_without_job"] = sorted(c for c, rec in doc["components"].items() if not rec.get("job_id"))
        wait(run, lambda: run.step() >= 1, 900, "the run's first step", reconcile_every_s=10.0)
        for fault in chosen:
            if not all(wait_for_next_step(run, steps) for _ in range(steps_between)) or not run_goes_on(run, steps):
                fault.notes.append("not fired: the run had no step left")
                continue
            log(f"fault: {fault.name} (at step {run.step()})")
            try:
                fault.fire(run)
                deadline = time.time() + RECOVERY_TIMEOUT_S
                while fault.recovered_at is None and time.time() < deadline:
                    run.refresh()
                    fault.poll(run)
                    time.sleep(0.5)
            except Exception as e:  # noqa: BLE001 — the row says what broke; the schedule goes on
                fault.ok = False
                fault.notes.append(f"{type(e).__name__}: {e}"[:300])
            finally:
                fault.restore(run)
            log(f"  {fault.row()}")
        wait(run, lambda: run.run_record().get("status") not in ("starting", "running"), 1200,
             "the run's end", reconcile_every_s=5.0)
        run.refresh()
        record = run.run_record()
        report["run"] = {k: record.get(k) for k in ("status", "step", "policy_version", "engine_versions", "reason")}
        rows = [json.loads(line) for line in Path(record["metrics_path"]).read_text().splitlines()]
        report["metrics_rows"] = [{"step": r.get("step"), "reward_mean": r.get("reward_mean")} for r in rows]
    finally:
        for fault in chosen:
            try:
                fault.restore(run)
            except Exception as e:  # noqa: BLE001
                log(f"restore of {fault.name} failed: {e}")
        if run.state_path.exists():
            run.refresh()
            down = run.cli("down", timeout=600)
            report["down_exit"] = down.returncode
            report["leftovers"] = settled_leftovers(run) if run.run_id else {}
        report["wall_s"] = round(time.time() - report["started"], 1)
    report["faults"] = fault_rows(run, chosen)
    report["unearned_total"] = unearned_total(run, chosen)
    return report


def settled_leftovers(run: ChaosRun, grace_s: float = 15.0) -> dict:
    """What the run left after `down`, once what `down` signalled has had `grace_s` to go (a job
    step's processes end a moment after Slurm has cancelled it)."""
    deadline = time.time() + grace_s
    while True:
        left = run.leftovers()
        if not any(left.values()) or time.time() > deadline:
            return left
        time.sleep(1.0)


def wait(run: ChaosRun, done, timeout_s: float, what: str, *, reconcile_every_s: float | None = None) -> None:
    deadline = time.time() + timeout_s
    while not done():
        run.refresh()
        status = run.run_record().get("status")
        if status in ("failed", "stopped") and what != "the run's end":
            raise RuntimeError(f"the run {status} while waiting for {what}: {run.run_record().get('reason')}")
        if time.time() > deadline:
            raise RuntimeError(f"timed out after {timeout_s:g}s waiting for {what}")
        if reconcile_every_s:
            run.reconcile(every_s=reconcile_every_s)
        time.sleep(0.5)


def run_goes_on(run: ChaosRun, steps: int) -> bool:
    return run.step() < steps and run.run_record().get("status") == "running"


def wait_for_next_step(run: ChaosRun, steps: int) -> bool:
    """Until the run has finished one more step (False when it has none left)."""
    start = run.step()
    if start >= steps or run.run_record().get("status") not in ("starting", "running"):
        return False
    wait(run, lambda: run.step() > start or run.run_record().get("status") not in ("starting", "running"), 600,
         "the next step", reconcile_every_s=10.0)
    return run.step() < steps and run.run_record().get("status") == "running"


def fault_rows(run: ChaosRun, faults: list[Fault]) -> list[dict]:
    """Each fault's row, with the masked causes and the unearned rewards of its window."""
    seen = run.ledger_seen()
    trained = {s: r for _, entry in seen for s, r in trained_rewards(entry).items()}
    rows = []
    fired = [f.fired_at for f in faults if f.fired_at is not None]
    for fault in faults:
        row = fault.row()
        if fault.fired_at is not None:
            later = [t for t in fired if t > fault.fired_at]
            until = min(later) if later else float("inf")
            window = [entry for at, entry in seen if fault.fired_at < at <= until]
            row["masked_by_cause"] = dict(collections.Counter(c for e in window for c in e.get("masked", {}).values()))
            in_window_trained_masked = sum(len(set(e.get("samples", [])) & set(e.get("masked", {}))) for e in window)
            row["unearned"] = len(fault.unearned(trained)) + in_window_trained_masked
        else:
            row["masked_by_cause"], row["unearned"] = {}, 0
        rows.append(row)
    return rows


def unearned_total(run: ChaosRun, faults: list[Fault]) -> int:
    """The whole run's: every fault's victims that were trained, and every trained sample a step recorded
    as infra-failed (in a fault's window or not)."""
    seen = [entry for _, entry in run.ledger_seen()]
    trained = {s: r for entry in seen for s, r in trained_rewards(entry).items()}
    unearned = {v for fault in faults for v in fault.unearned(trained)}
    return len(unearned) + sum(len(set(e.get("samples", [])) & set(e.get("masked", {}))) for e in seen)


def render(report: dict) -> str:
    """The markdown of docs/reliability.md's chaos section."""
    left = report.get("leftovers", {})
    lines = [
        "| fault | detected after (s) | recovered after (s) | masked by cause (its steps) | trained on an unearned "
        "reward | notes |",
        "|---|---|---|---|---|---|",
    ]
    for row in report["faults"]:
        masked = ", ".join(f"{c} {n}" for c, n in sorted(row["masked_by_cause"].items())) or "none"
        fmt = (lambda v: "—" if v is None else f"{v:g}")
        rec = fmt(row["recovered_s"]) if row["recovered_s"] is not None else "**not recovered**"
        if row["recovered_s"] is not None and not row["ok"]:
            rec = f"**{rec}, by hand**"  # e.g. the run failed and the bench resumed it (see the notes)
        notes = "; ".join(n for n in row["notes"] if n)
        lines.append(f"| {row['fault']} | {fmt(row['detected_s'])} | {rec} | {masked} | {row['unearned']} | {notes} |")
    run = report.get("run", {})
    lines[:0] = [
        f"One `rl360 up` of local-smoke's policy v0, {report['steps']} steps of 6 tasks x 4 samples, on the "
        "dev Slurm tiers (router, engine and trainer as job steps on three fake nodes) with its sandboxes as "
        "containers on the three dev Docker nodes (128 MB each, no warm pool), under the faults below, one "
        f"after another. Measured on the 2-core dev machine shared with other sessions (load average "
        f"{', '.join(f'{x:.0f}' for x in report.get('load_average') or ())} at the end).",
        "",
    ]
    count = (lambda key: sum(len(v) for v in left.get(key, {}).values()) if isinstance(left.get(key), dict)
             else len(left.get(key, [])))
    lines += [
        "",
        f"The run: {run.get('status')} at step {run.get('step')} of {report['steps']}, policy version "
        f"{run.get('policy_version')}, engines at {sorted(set((run.get('engine_versions') or {}).values()))}; "
        f"{report['wall_s']:g} s from `up` to the end of `down`. Samples trained on an unearned reward, in all: "
        f"{report['unearned_total']}.",
        f"Left after `rl360 down` (exit {report.get('down_exit')}): processes {count('processes')}, containers "
        f"{count('containers')}, Ray {count('ray')}, Slurm jobs {count('slurm_jobs')}.",
    ]
    return "\n".join(lines)


def _epoch(stamp: str) -> float:
    """Seconds since the epoch of an ISO time (the state file's, the events', Docker's nanosecond ones)."""
    stamp = stamp.replace("Z", "+00:00")
    stamp = re.sub(r"(\.\d{6})\d+", r"\1", stamp)
    return datetime.fromisoformat(stamp).timestamp()


def _pids_on_machine() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--faults", default=",".join(SCHEDULE), help=f"from: {', '.join(SCHEDULE)}")
    parser.add_argument("--no-write", action="store_true", help="leave docs/reliability.md as it is")
    parser.add_argument("--from-json", type=Path, help="render a report written before instead of running")
    args = parser.parse_args()
    if args.from_json:
        report = json.loads(args.from_json.read_text())
    else:
        folder = Path(tempfile.mkdtemp(prefix="rl360-chaos-"))
        print(f"run folder {folder} (kept: logs, ledger, metrics)", flush=True)
        report = run_chaos(folder, steps=args.steps, faults=args.faults.split(","))
        report["folder"] = str(folder)
        report["load_average"] = os.getloadavg()
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(report, indent=2, default=str) + "\n")
    text = render(report)
    print(text)
    if not args.no_write:
        write_section(TITLE, text + "\n\n" + READING, RELIABILITY)
    return 0


READING = """\
How to read it: `bench/chaos.py` (one run, the faults one after another; each fires once the previous
one has recovered and the run has finished one more step). Detected: the run's first record of the
fault — for a sandbox, its container removed by the attempt that saw it fail; for dockerd, the first
step whose ledger masks a sandbox that was on the node; for an engine or the router, the health
watcher's `dead` event; for the rollout node, the tier's `requeue` event; for the trainer, `rl360
status` no longer reporting the run running; for the lock, a writer with a 2 s timeout naming the
stuck holder. Recovered: the victim's step in the ledger with it masked (sandboxes); a new sandbox
of the run on the restarted node (dockerd); the component running again under its record, an engine
at the trainer's version (engine, router); the tier ready on another node with its engine and a step
finished since (slurmd); a step trained past the kill by `up --resume` (trainer); the run's next
write after the holder was killed (lock); the slowest of the 16 answers (status). Masked by cause:
the infra failures of the steps finished between the fault and the next one. Trained on an unearned
reward: the fault's victims (sandboxes hit before their verifier wrote a reward) that a step trained,
plus trained samples a step recorded as infra-failed (`ledger.jsonl` `samples` and `masked`). An
OOM victim trained with a passing reward earned it (a full memory makes tests fail, never pass); one
trained with a failing reward is counted (`ledger.jsonl` `rewards`).

The CI-sized chaos test is `tests/loop/test_chaos_ci.py`: the same code on 8 steps with 4 of the
faults (the lock held 5 s, a sandbox killed, the router killed, 16 concurrent `status`), 2 min 30 s on
the dev machine; every fault recovered, 0 unearned, 0 left after `down`.
`tests/bench/test_chaos_report.py` checks the bench's accounting on ledger entries
written by the real `step_entry`.

What it found, and what changed since the first runs of 2026-12-01 (one failed at step 20 at the
lost node, one at step 16 at the engine kill):
- **A lost rollout node now recovers by itself** (37.8 s). Slurm requeues the rollout tier on the
  free node, Ray starts both session actors again there (`max_task_retries = -1`: with a count of 3
  the retries ran out while the actors came back), and the engine comes back at the trainer's
  version. Before, the health watcher saw the engine dead before Slurm saw the node lost, started it
  again on the lost node ("node n3 is not in tier rollout"), spent its 5 restarts in a second, and
  the requeue skipped the engine as one that had ended on its own: 480 samples masked
  `engine_error`, the engine left at v0. Now a failure on a node that is lost is the requeue's to
  restart. The watcher leaves to it any component marked `restart`, on a lost node or in a
  requeueing tier; it adopts the component once it runs on the new node (at the URL naming that
  node) and rejoins it to the weight syncs. A failed restart of its own backs off 2, 4, 8 s
  (`rl360cli/run/control.py`).
- **A sandbox kill is `sandbox_lost`**, no longer `provider_error` or `verifier_error`. An exec in a
  container paused from outside waits for the unpause (the bench pauses a container while it looks
  for the attempt's answer); a command SIGKILLed without an OOM looks at its container again a moment
  later; a reward file missing in a container that is gone is a lost sandbox, not a verifier that wrote
  none (`tests/sandbox/test_docker_provider.py`). In the run before, 2 of 4 kills read `provider_error`
  and 2 `verifier_error`.
- **A weight sync while the only engine restarts** ended a run ("no engine is left to take weight
  version 16"): the step's sync fell inside the engine's ~10 s restart, and the engines the health
  watcher is restarting were all there was. Such a sync now sends nothing and returns; the rejoin
  sends the trainer's weights of then (`tests/inference/test_weight_sync.py`).
- **The OOM fault.** The fill OOM-kills itself, the attempt goes on, its verifier writes a reward and
  the sample is trained. By rl360's rule that is right: a sandbox whose memory filled and whose
  verifier still ran is scored (an agent that fills its own memory is the policy's failure, and a
  reward written under the task's own reservation stands). When rl360's own command fails instead
  (`prepare_verifier`, an exec runc cannot start for lack of memory), the attempt ends `sandbox_oom`.
  The ledger keeps each trained sample's reward now, and the bench counts a trained victim as
  unearned only when its reward failed (a full memory makes tests fail, never pass): the row's
  victim passed (reward 1). An earlier run counted such a victim unearned before rewards were kept.
- **The state lock.** A holder stuck for less than the 30 s lock timeout only delays the run's writes
  (the row). A holder stuck for longer no longer fails the run: a step's progress is left out of the
  state file (the next step records it again) and the run's end waits up to 10 minutes for the lock
  (`tests/loop/test_state_locked.py`). The fault now holds 45 s. Alone (`--faults lock --steps 8`),
  the run logged "progress not recorded in the state file (... locked ... for over 30s); the run goes
  on", finished 8 of 8 with its engine at the trainer's version, and recovered 45.6 s after the fire.
- **Ray on the fake nodes.** They share one host and its /tmp/ray, and Ray names a second node's
  sockets in a shared temp dir by counting what is there: two Ray workers started at once took the
  same plasma socket. Each Ray node now has a temp dir of its own (`--temp-dir=/tmp/ray/<node>`,
  `rl360cli/backends/slurm_ray.py`), and Ray's worker ports miss the profile's ports."""


if __name__ == "__main__":
    raise SystemExit(main())
