"""Benchmark of the rollout tier at scale: recipes/scale-sim.toml through `rl360 up` at 1,024 / 4,096 / 8,192 sessions.

    .venv/bin/python bench/bench_scale_sim.py [--sessions 1024 4096 8192] [--steps 2] [--latency-scale 1.0] \
        [--py-spy /path/to/py-spy] [--label TEXT] [--prior rows.jsonl] [--no-write]

Each size is one run of the real loop on the stand-ins (simulated nodes, engines and trainer; see the
recipe): 32 tasks x sessions/32 samples a step, all of a step's sessions allowed in flight at once,
the recipe's latencies multiplied by `--latency-scale`. While it runs, the orchestrating processes —
the driver (the trainer component) and everything under it: Ray's GCS and raylet, the session
actors — are sampled every second for CPU time and RSS; the stand-in engines and the router are
measured apart (the router's CPU as well). Figures per run:

- sessions in flight (max): the most simulated sandboxes live at once, summed over the actors;
- agent turns per second: agent commands (one per turn that acted) over the run's step time, and over
  only the seconds in which at least 95% of the peak of sessions were in flight (the rate the
  orchestrator sustains at that load: the simulated provider's ledgers time their commands), with the
  whole machine's busy cores in those seconds (2.0 on 2 cores: the rate is what the CPU allows);
- router requests per second: /generate requests the simulated engines answered over the same time;
- orchestration CPU seconds per 1,000 sessions, and peak RSS per 1,000 sessions in flight;
- the session actors' own CPU seconds per 1,000 sessions (their `actor_cpu_s` in metrics.jsonl: every
  session's agent, endpoint, engine requests and sandbox calls, without the actors' start);
- step wall time (mean of the steps).

Each run is checked against the invariants tests/loop/test_scale_sim.py checks at CI size (every sample
through build_batch, the weight sync on every engine, pulls within the cap, no node over its reservations,
the gauges against the providers' ledgers, every drawn failure masked under its cause, nothing left
running after `rl360 down`); a run that breaks one fails the benchmark.

With `--py-spy` (pip install py-spy; it needs ptrace) the busiest session actor is sampled for 20 s (GIL held only)
in the middle of the largest run and its top functions are printed. Rewrites the
`## Scale simulation` section of docs/benchmarks.md unless `--no-write`.
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
import urllib.request
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.machine_cpu import machine_jiffies  # noqa: E402
from bench.report import write_section  # noqa: E402
from tests.loop.test_scale_sim import expected_masked  # noqa: E402 - the test's own account of the failures

RECIPE = REPO / "recipes" / "scale-sim.toml"
# The recipe's latencies, which `--latency-scale` multiplies.
LATENCY_KEYS = ("engine.simulated.per_token_ms", "sandbox.simulated.exec_median_s", "sandbox.simulated.start_latency_s",
                "sandbox.simulated.verifier_latency_s", "trainer.simulated.step_s")


def recipe_latencies() -> dict[str, float]:
    recipe = tomllib.loads(RECIPE.read_text())
    return {key: functools.reduce(lambda table, name: table[name], key.split("."), recipe) for key in LATENCY_KEYS}


def free_base_port(count: int = 110) -> int:
    """Below the ephemeral range (32768+), which a run's thousands of connections leave in TIME_WAIT."""
    import socket

    for base in range(20000, 32000, 211):
        try:
            for port in range(base, base + count):
                with socket.socket() as s:
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
    raise RuntimeError("no free port block")


class Sampler(threading.Thread):
    """CPU seconds (last seen per process) and summed RSS of a process tree, every `interval_s`."""

    def __init__(self, find_root, interval_s: float = 1.0):
        super().__init__(daemon=True)
        self.find_root = find_root
        self.interval_s = interval_s
        self.cpu: dict[int, float] = {}
        self.peak_rss = 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            root = self.find_root()
            if root is not None:
                try:
                    procs = [psutil.Process(root), *psutil.Process(root).children(recursive=True)]
                except psutil.Error:
                    procs = []
                rss = 0
                for proc in procs:
                    try:
                        times = proc.cpu_times()
                        self.cpu[proc.pid] = times.user + times.system + times.children_user + times.children_system
                        rss += proc.memory_info().rss
                    except psutil.Error:
                        pass
                self.peak_rss = max(self.peak_rss, rss)
            self.done.wait(self.interval_s)

    @property
    def cpu_s(self) -> float:
        return sum(self.cpu.values())


def component_pid(state_path: Path, kind_prefix: str) -> int | None:
    try:
        doc = json.loads(state_path.read_text())
    except (OSError, ValueError):
        return None
    for rec in doc.get("components", {}).values():
        if rec.get("kind", "").startswith(kind_prefix) and rec.get("pid"):
            # The record holds the supervisor's pid; the component is its child.
            return rec["pid"]
    return None


class MachineCpu(threading.Thread):
    """The whole machine's busy CPU (cores' worth) in each wall-clock second, from /proc/stat."""

    def __init__(self):
        super().__init__(daemon=True)
        self.busy: dict[int, float] = {}
        self.done = threading.Event()

    def run(self) -> None:
        cores = os.cpu_count() or 1
        second, (busy, idle) = int(time.time()), machine_jiffies()
        while not self.done.wait(1.0 - time.time() % 1.0):
            now, (busy2, idle2) = int(time.time()), machine_jiffies()
            total = (busy2 - busy) + (idle2 - idle)
            self.busy[second] = cores * (busy2 - busy) / total if total else 0.0
            second, busy, idle = now, busy2, idle2


def busy_seconds(ledgers: list[dict], at_least: int) -> dict[int, int]:
    """{second: agent turns started in it} for the seconds in which at least `at_least` sandboxes were live,
    summed over the actors' ledgers (each reading carried forward to the seconds it has none for)."""
    seconds = sorted({second for ledger in ledgers for second, _, _ in ledger["timeline"]})
    live = dict.fromkeys(seconds, 0)
    done = dict.fromkeys(seconds, 0)
    for ledger in ledgers:
        readings = {second: (n_live, n_done) for second, n_live, n_done in ledger["timeline"]}
        last = (0, 0)
        for second in seconds:
            last = readings.get(second, last)
            live[second] += last[0]
            done[second] += last[1]
    return {second: done[after] - done[second] for second, after in zip(seconds, seconds[1:])
            if after == second + 1 and live[second] >= at_least}


class RequestCounter(threading.Thread):
    """The /generate requests the simulated engines have answered, polled every few seconds (`rl360 up`
    stops the engines when the run ends, so the last poll before that is the count)."""

    def __init__(self, state_path: Path, ports: range, interval_s: float = 3.0):
        super().__init__(daemon=True)
        self.state_path, self.ports, self.interval_s = state_path, ports, interval_s
        self.count = 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            try:
                doc = json.loads(self.state_path.read_text())
                run_dir = Path(doc["runs"][doc["current_run"]]["run_dir"])
                key = (run_dir / "api-key").read_text().strip()
                total = 0
                for port in self.ports:
                    request = urllib.request.Request(f"http://127.0.0.1:{port}/server_info",
                                                     headers={"Authorization": f"Bearer {key}"})
                    with urllib.request.urlopen(request, timeout=10) as reply:
                        total += json.load(reply)["num_finished_requests"]
                self.count = max(self.count, total)
            except (OSError, ValueError, KeyError, TypeError):
                pass
            self.done.wait(self.interval_s)


def py_spy_top(py_spy: str, state_path: Path, seconds: int = 20) -> str:
    """py-spy's top functions of the busiest Ray worker (a session actor) under the driver."""
    root = component_pid(state_path, "trainer")
    if root is None:
        return "(no driver found)"
    workers = [p for p in psutil.Process(root).children(recursive=True) if "SessionActor" in " ".join(p.cmdline())
               or "ray::SessionActor" in p.name()]
    if not workers:
        workers = [p for p in psutil.Process(root).children(recursive=True)
                   if "default_worker" in " ".join(p.cmdline())]
    if not workers:
        return "(no session actor found)"
    busiest = max(workers, key=lambda p: p.cpu_times().user)
    out = Path(tempfile.mkdtemp()) / "profile.txt"
    subprocess.run([py_spy, "record", "--pid", str(busiest.pid), "--duration", str(seconds), "--format", "raw",
                    "--gil", "--output", str(out), "--nonblocking"], capture_output=True, timeout=seconds + 60)
    if not out.exists():
        return "(py-spy wrote nothing: ptrace not permitted?)"
    # Raw format: "frame;frame;... count" — add up self time by the innermost frame.
    counts: dict[str, int] = {}
    total = 0
    for line in out.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frame = stack.split(";")[-1]
        frame = re.sub(r"\s+\(.*?/(site-packages|rl360cli)/", r" (\1/", frame)
        counts[frame] = counts.get(frame, 0) + int(count)
        total += int(count)
    top = sorted(counts.items(), key=lambda kv: -kv[1])[:15]
    return "\n".join(f"{100 * c / total:5.1f}%  {frame}" for frame, c in top)


def broken_invariants(doc: dict, rows: list[dict], ledgers: list[dict], *, steps: int, samples: int,
                      max_in_flight: int, pull_cap: int, max_infra_retries: int) -> list[str]:
    """What of tests/loop/test_scale_sim.py's invariants a run broke (at any scale); empty when all held."""
    problems = []
    run = doc["runs"][doc["current_run"]]
    if run["status"] != "finished" or run["policy_version"] != steps:
        problems.append(f"the run ended {run['status']} at version {run['policy_version']}")
    if len(rows) != steps or not all(row["samples"] == samples == row["batch"]["total"] and row["batch"]["kept"] > 0
                                     for row in rows):
        problems.append("not every sample of every step went through build_batch")
    if any(row["weight_sync_failed_engines"] for row in rows) or set(run["engine_versions"].values()) != {steps}:
        problems.append("the weight sync missed an engine")
    if sum(ledger["pull_cap"] for ledger in ledgers) > pull_cap or not all(
            0 < ledger["max_pulls_in_flight"] <= ledger["pull_cap"] for ledger in ledgers):
        problems.append("pulls in flight went over the cap")
    nodes = [name for ledger in ledgers for name in ledger["nodes"]]
    if len(nodes) != len(set(nodes)):
        problems.append("two actors shared a node")
    for ledger in ledgers:
        for name, node in ledger["nodes"].items():
            if node["overcommits"] or node["peak_cpus"] > node["cpus"] or node["peak_mb"] > node["memory_mb"]:
                problems.append(f"node {name} went over its reservations")
    if max(row["sessions_in_flight_max"] for row in rows) > max_in_flight:
        problems.append("more sessions in flight than allowed")
    if sum(row["sandbox_starts"] + row["sandbox_failed_starts"] for row in rows) != sum(
            ledger["starts"] for ledger in ledgers):
        problems.append("the gauges' sandbox starts differ from the providers' ledgers")
    if not all(row["pull_cap"] == pull_cap and 0 <= row["pulls_in_flight_max"] <= pull_cap for row in rows):
        problems.append("the gauges' pulls in flight went over the cap")
    if not all(row["router_rps_source"] == "router" for row in rows):
        problems.append("the router's own request counter could not be read")
    if round(sum(row["router_requests_per_s"] * row["gauge_interval_s"] for row in rows)) != round(
            sum(row["actor_requests_per_s"] * row["gauge_interval_s"] for row in rows)):
        problems.append("the router's request count differs from the actors'")
    masked: collections.Counter = collections.Counter()
    for row in rows:
        masked.update(row["infra_failures_by_cause"])
    expected = expected_masked(ledgers, max_infra_retries=max_infra_retries)
    if masked != expected:
        problems.append(f"masked infra failures {dict(masked)} differ from the drawn ones that ended attempts "
                        f"{dict(expected)}")
    return problems


def setting_value(settings: list[str], recipe: dict, key: str) -> int:
    """`key` of the run: its last `--set` (later settings win, as in `rl360 up`), else the recipe's."""
    given = [setting.split("=", 1)[1] for setting in settings if setting.split("=", 1)[0] == key]
    return int(given[-1]) if given else functools.reduce(lambda table, name: table[name], key.split("."), recipe)


def one_run(sessions: int, *, steps: int, latency_scale: float, py_spy: str | None, workdir: Path,
            extra: tuple[str, ...] = ()) -> dict:
    base = free_base_port()
    profile = workdir / f"profile-{sessions}.toml"
    text = (REPO / "cluster" / "sim-24-nodes.toml").read_text()
    text = re.sub(r"(?m)^base_port = \d+", f"base_port = {base}", text)
    profile.write_text(re.sub(r"(?m)^sync_port = \d+", f"sync_port = {base + 105}", text))
    ledgers = workdir / f"ledgers-{sessions}"
    state = workdir / f"state-{sessions}" / "state.json"
    settings = [f"loop.num_steps={steps}", f"loop.num_samples_per_task={sessions // 32}",
                f"rollout.max_concurrent_sessions={sessions}", f"sandbox.max_concurrent={sessions // 2}",
                f'sandbox.simulated.ledger_dir="{ledgers}"']
    settings += [f"{key}={value * latency_scale!r}" for key, value in recipe_latencies().items()]
    settings += extra
    argv = [sys.executable, "-m", "rl360cli", "up", "--recipe", str(RECIPE), "--profile", str(profile)]
    for setting in settings:
        argv += ["--set", setting]
    env = {**os.environ, "RL360_STATE": str(state), "COLUMNS": "200"}
    orchestration = Sampler(lambda: component_pid(state, "trainer"))
    engines = Sampler(lambda: component_pid(state, "engine-"))
    router = Sampler(lambda: component_pid(state, "router"))
    machine = MachineCpu()
    requests = RequestCounter(state, range(base + 2, base + 2 + 96))
    watchers = (orchestration, engines, router, machine, requests)
    for watcher in watchers:
        watcher.start()
    began = time.time()
    up = subprocess.Popen(argv, cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    profile_text = None
    if py_spy:
        def spy():
            nonlocal profile_text
            time.sleep(max(30.0, 90 * latency_scale))
            profile_text = py_spy_top(py_spy, state)
        spier = threading.Thread(target=spy, daemon=True)
        spier.start()
    output, _ = up.communicate(timeout=7200)
    wall = time.time() - began
    for watcher in watchers:
        watcher.done.set()
    try:
        if up.returncode != 0:
            raise RuntimeError(f"rl360 up exited {up.returncode}:\n{output[-4000:]}")
        doc = json.loads(state.read_text())
        run = doc["runs"][doc["current_run"]]
        rows = [json.loads(line) for line in Path(run["metrics_path"]).read_text().splitlines()]
    finally:
        subprocess.run([sys.executable, "-m", "rl360cli", "down"], cwd=workdir, env=env, capture_output=True,
                       timeout=300)
    found = [json.loads(p.read_text()) for p in ledgers.glob("ledger-*.json")]
    recipe = tomllib.loads(RECIPE.read_text())

    def value(key: str) -> int:
        return setting_value(settings, recipe, key)
    problems = broken_invariants(
        doc, rows, found, steps=steps, samples=value("loop.num_tasks_per_step") * value("loop.num_samples_per_task"),
        max_in_flight=value("rollout.max_concurrent_sessions"), pull_cap=value("sandbox.simulated.max_concurrent_pulls"),
        max_infra_retries=value("sandbox.max_infra_retries"))
    if json.loads(state.read_text())["components"]:
        problems.append("`rl360 down` left components running")
    actor_cpu = [row.get("actor_cpu_s") for row in rows]
    in_flight = sum(ledger["max_live"] for ledger in found)
    agent_turns = sum(ledger["execs"] - ledger["verifier_execs"] for ledger in found)
    run_s = sum(row["step_s"] for row in rows)
    peak = busy_seconds(found, int(0.95 * in_flight))
    peak_cpu = [machine.busy[second] for second in peak if second in machine.busy]
    return {
        "sessions": sessions, "steps": len(rows), "samples": sum(row["samples"] for row in rows),
        "in_flight_max": in_flight, "agent_turns": agent_turns, "turns_per_s": agent_turns / run_s,
        "turns_per_s_at_peak": sum(peak.values()) / len(peak) if peak else 0.0, "seconds_at_peak": len(peak),
        "machine_cores_busy_at_peak": sum(peak_cpu) / len(peak_cpu) if peak_cpu else None,
        "router_rps": requests.count / run_s, "step_s": run_s / len(rows),
        "step_s_each": [round(row["step_s"], 1) for row in rows],
        "generation_s_each": [round(row["generation_s"], 1) for row in rows],
        "cpu_s": orchestration.cpu_s,
        "cpu_s_per_1k": orchestration.cpu_s / (sum(row["samples"] for row in rows) / 1000),
        "actor_cpu_s_per_1k": (sum(actor_cpu) / (sum(row["sessions_done"] for row in rows) / 1000)
                               if None not in actor_cpu else None),
        "rss_mb": orchestration.peak_rss / 2**20,
        "rss_mb_per_1k_in_flight": orchestration.peak_rss / 2**20 / (in_flight / 1000),
        "engines_cpu_s": engines.cpu_s, "router_cpu_s": router.cpu_s, "up_wall_s": wall,
        "infra": [row["infra_failures_by_cause"] for row in rows], "broken_invariants": problems,
        "profile": profile_text,
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sessions", type=int, nargs="+", default=[1024, 4096, 8192])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--latency-scale", type=float, default=1.0)
    parser.add_argument("--py-spy", default=None)
    parser.add_argument("--set", dest="extra", action="append", default=[], metavar="KEY=VALUE",
                        help="a further recipe setting for every run (e.g. sandbox.cpus=0.25: more sandboxes a node)")
    parser.add_argument("--label", default="", help="what the table's rows of this run say after the sessions")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--prior", type=Path, default=None,
                        help="rows measured earlier (the JSON lines this prints), put first in the table")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="rl360-bench-scale-"))
    results = []
    if args.prior:
        results = [{**json.loads(line), "profile": None} for line in args.prior.read_text().splitlines() if line]
    for sessions in args.sessions:
        spy = args.py_spy if sessions == max(args.sessions) else None
        result = one_run(sessions, steps=args.steps, latency_scale=args.latency_scale, py_spy=spy, workdir=workdir,
                         extra=tuple(args.extra))
        result["label"] = args.label
        print(json.dumps({k: v for k, v in result.items() if k != "profile"}), flush=True)
        for problem in result["broken_invariants"]:
            print(f"broken invariant at {sessions} sessions: {problem}", flush=True)
        if result["profile"]:
            print(result["profile"], flush=True)
        results.append(result)
    if args.no_write:
        return 0
    write_section("Scale simulation", section(results, args, load=os.getloadavg()[0]))
    return 1 if any(r.get("broken_invariants") for r in results) else 0


def section(results: list[dict], args: argparse.Namespace, *, load: float) -> str:
    """The `## Scale simulation` section's text for `results` (the prior rows first)."""
    lines = [
        f"`bench/bench_scale_sim.py --sessions {' '.join(map(str, args.sessions))} --steps {args.steps} "
        f"--latency-scale {args.latency_scale:g}{''.join(f' --set {setting}' for setting in args.extra)}"
        f"{f' --prior {args.prior}' if args.prior else ''}` on {os.cpu_count()} cores "
        f"({platform.processor() or platform.machine()}), "
        f"load average {load:.1f} at the end (the machine is shared"
        f"{'; the rows of `--prior` ran before, one after the other' if args.prior else ''}). recipes/scale-sim.toml "
        "on the stand-ins (simulated nodes, 96 simulated engines behind the real sglang-router, simulated trainer), 2 session "
        "actors, every session of a step allowed in flight; one run per row. Orchestration = the driver and "
        "everything under it (Ray GCS, raylet, the session actors), sampled every second; the actors' CPU is "
        "their own count in metrics.jsonl, per 1,000 sessions ended; \"at peak\" = the seconds with at least "
        "95% of the run's most sessions in flight. " + invariants_line(results),
        "",
        "| sessions/step | in flight (max) | agent turns/s | turns/s at peak (seconds) | router req/s | step wall (s) "
        "| orch. CPU s / 1k sessions | actors' CPU s / 1k sessions | orch. RSS MB / 1k in flight "
        "| engines / router CPU s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        per_step = r["samples"] // r["steps"]
        label = (f"{per_step:,}" + (f" ({r['sessions']:,} allowed at once)" if r["sessions"] != per_step else "")
                 + (f", {r['label']}" if r.get("label") else ""))
        actors = f"{r['actor_cpu_s_per_1k']:.2f}" if r.get("actor_cpu_s_per_1k") is not None else "—"
        lines.append(f"| {label} | {r['in_flight_max']:,} | {r['turns_per_s']:.0f} "
                     f"| {r['turns_per_s_at_peak']:,.0f} ({r['seconds_at_peak']}) | {r['router_rps']:.0f} "
                     f"| {r['step_s']:.1f} ({', '.join(map(str, r['step_s_each']))}) | {r['cpu_s_per_1k']:.1f} "
                     f"| {actors} | {r['rss_mb_per_1k_in_flight']:.0f} "
                     f"| {r['engines_cpu_s']:.0f} / {r['router_cpu_s']:.0f} |")
    profiled = [r for r in results if r["profile"]]
    if profiled:
        lines += ["", f"py-spy, the busiest session actor at {profiled[0]['sessions']:,} sessions (self time):", "",
                  "```", profiled[0]["profile"], "```"]
    return "\n".join(lines)


def invariants_line(results: list[dict]) -> str:
    """What the rows say of tests/loop/test_scale_sim.py's invariants (rows from before the check say nothing)."""
    checked = [r for r in results if "broken_invariants" in r]
    broken = [f"{r['sessions']:,}: {'; '.join(r['broken_invariants'])}" for r in checked if r["broken_invariants"]]
    if not checked:
        return ""
    if broken:
        return "Invariants of tests/loop/test_scale_sim.py broken: " + " / ".join(broken) + "."
    return ("Every row but the earlier ones held the invariants of tests/loop/test_scale_sim.py (checked by the "
            "bench since 2026-12-06)." if len(checked) < len(results) else
            "Every run held the invariants of tests/loop/test_scale_sim.py (checked by the bench).")


if __name__ == "__main__":
    sys.exit(main())
