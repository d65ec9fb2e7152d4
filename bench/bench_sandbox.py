"""Benchmark of the sandbox layer: one sandbox's start + exec + stop, and sustained attempts at 32 concurrent.

    .venv/bin/python bench/bench_sandbox.py [--cycles 40] [--attempts 320] [--docker-attempts 96]

1. Latency of one sandbox, one after the other: start, one `python3 -c` check, stop — p50 and p95 of each
   phase and of the whole cycle, for the process provider (bubblewrap) and the docker provider (a dev
   node, its image already cached).
2. Sustained throughput: full attempts (start, an agent that runs one Python check, upload tests, run
   test.sh, read the reward, stop) with 32 in flight at once through the admission controller, on this
   machine's cores; attempts per second, the median seconds of each phase, and the whole machine's busy
   CPU per attempt. The floor row makes the same Docker API calls as a docker attempt straight through
   the docker SDK (no rl360 in between), 32 at once on the same nodes: what the daemons alone cost.

The docker part needs the dev Docker nodes (bash cluster/dev/docker-nodes.sh up) and is skipped when they
are down. Prints the figures and rewrites the `## Sandboxes` section of docs/benchmarks.md, leaving the
other sections alone.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import platform
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.machine_cpu import machine_busy_s  # noqa: E402
from bench.report import write_section  # noqa: E402
from rl360cli.nodes.config import NodeSpec  # noqa: E402
from rl360cli.sandbox.attempt import run_attempt  # noqa: E402
from rl360cli.sandbox.config import SandboxConfig, WarmPoolConfig  # noqa: E402
from rl360cli.sandbox.providers import make_provider  # noqa: E402
from rl360cli.sandbox.task_loader import load_task  # noqa: E402

DEV_ROOT = Path(os.environ.get("RL360_DEV_ROOT", "/tmp/rl360-dev"))
PYTHON = "127.0.0.1:5000/rl360/python:3.11"
CHECK = "python3 -c 'print(sum(range(10)) == 45)'"
LATENCY_CPUS = 0.5
TITLE = "Sandboxes"


def make_task(root: Path) -> Path:
    """A task like the RL loop's: the agent writes an answer, a short sh verifier scores it."""
    folder = root / "bench-task"
    (folder / "tests").mkdir(parents=True)
    (folder / "task.toml").write_text(f'[environment]\ndocker_image = "{PYTHON}"\ncpus = 1\nmemory_mb = 256\n'
                                      'storage_mb = 64\n[agent]\ntimeout_sec = 60\n[verifier]\ntimeout_sec = 60\n')
    (folder / "instruction.md").write_text("Write True to /app/answer.\n")
    (folder / "tests" / "test.sh").write_text(
        '[ "$(cat /app/answer 2>/dev/null)" = True ] && r=1 || r=0; echo $r > /logs/verifier/reward.txt\n')
    return folder


def q(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))]


def docker_nodes() -> list[NodeSpec] | None:
    path = DEV_ROOT / "docker" / "nodes.json"
    if not path.exists():
        return None
    import docker

    specs = []
    for node in json.loads(path.read_text())["nodes"]:
        try:
            docker.APIClient(base_url=node["docker_host"], version="auto", timeout=5).ping()
        except Exception:  # noqa: BLE001
            continue
        specs.append(NodeSpec(name=node["name"], docker_host=node["docker_host"], cpus=2.0, memory_mb=4096))
    return specs or None


async def cycles(provider, task, count: int) -> dict[str, list[float]]:
    phases: dict[str, list[float]] = {"start": [], "exec": [], "stop": [], "total": []}
    node = provider.nodes()[0].name
    for i in range(count + 2):  # one at a time
        began = time.perf_counter()
        sandbox = await provider.start(task, attempt_id=f"lat-{i}", labels={}, node=node)
        started = time.perf_counter()
        result = await sandbox.exec(CHECK, timeout_s=30)
        done = time.perf_counter()
        await sandbox.stop()
        ended = time.perf_counter()
        assert result.exit_code == 0 and result.output.strip() == "True", result
        if i < 2:
            continue  # warm-up: the image, the daemon's connection, the page cache
        for name, value in (("start", started - began), ("exec", done - started), ("stop", ended - done),
                            ("total", ended - began)):
            phases[name].append(value)
    return phases


def sdk_attempts(nodes: list[NodeSpec], count: int, concurrency: int) -> dict:
    """The daemons' floor of a docker attempt: the Docker API calls one makes (create + start, the agent's
    exec, the verifier's prepare exec, the tests' upload, the verifier's exec, the reward's download, the
    removal), made straight through the docker SDK, `concurrency` at once, round robin over `nodes`."""
    import docker

    apis = [docker.APIClient(base_url=node.docker_host, version="auto", timeout=60) for node in nodes]
    tests = io.BytesIO()
    with tarfile.open(fileobj=tests, mode="w") as tar:
        script = b'[ "$(cat /app/answer)" = True ] && r=1 || r=0; echo $r > /logs/verifier/reward.txt\n'
        info = tarfile.TarInfo("tests/test.sh")
        info.size = len(script)
        tar.addfile(info, io.BytesIO(script))

    def run(api, cid: str, command: str) -> None:
        exec_id = api.exec_create(cid, ["/bin/sh", "-c", command])["Id"]
        api.exec_start(exec_id)
        api.exec_inspect(exec_id)

    def one(i: int) -> bool:
        api = apis[i % len(apis)]
        host = api.create_host_config(nano_cpus=int(0.05e9), mem_limit="256m", memswap_limit="256m",
                                      network_mode="none", pids_limit=256)
        cid = api.create_container(PYTHON, entrypoint=["/bin/sh", "-c"], command=["read x"], stdin_open=True,
                                   working_dir="/app", host_config=host)["Id"]
        try:
            api.start(cid)
            run(api, cid, f"mkdir -p /app && {CHECK} > /app/answer")
            run(api, cid, "rm -rf /tests && mkdir -p /logs/verifier")
            api.put_archive(cid, "/", tests.getvalue())
            run(api, cid, "sh /tests/test.sh")
            stream, _ = api.get_archive(cid, "/logs/verifier/reward.txt")
            with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
                return tar.extractfile("reward.txt").read().strip() == b"1"
        finally:
            api.remove_container(cid, force=True)

    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(one, range(-concurrency, 0)))  # warm-up
        began, busy = time.perf_counter(), machine_busy_s()
        ok = sum(pool.map(one, range(count)))
        wall, busy = time.perf_counter() - began, machine_busy_s() - busy
    return {"attempts": count, "ok": ok, "wall_s": wall, "per_s": count / wall, "cpu_s_per_attempt": busy / count}


async def sustained(provider, task, count: int, concurrency: int) -> dict:
    gate = asyncio.Semaphore(concurrency)

    async def agent(sandbox):
        await sandbox.exec(f"{CHECK} > /app/answer", timeout_s=30)

    async def one(i):
        async with gate:
            return await run_attempt(provider, task, agent, attempt_id=f"s-{i}", labels={})

    await asyncio.gather(*(one(-i - 1) for i in range(min(concurrency, 8))))  # warm-up
    began, busy = time.perf_counter(), machine_busy_s()
    results = await asyncio.gather(*(one(i) for i in range(count)))
    wall, busy = time.perf_counter() - began, machine_busy_s() - busy
    ok = [r for r in results if r.outcome.value == "ok" and r.reward == 1.0]
    phases = {}
    for name in ("start", "agent", "upload_tests", "verify", "reward", "stop", "total"):
        phases[name] = statistics.median(r.timings.get(name, 0.0) for r in results)
    return {"attempts": count, "ok": len(ok), "wall_s": wall, "per_s": count / wall, "phases": phases,
            "cpu_s_per_attempt": busy / count}


def provider_for(kind: str, nodes, concurrency: int, *, admission: bool = True, cpus: float = 0.05,
                 pool: int = 0):
    config = SandboxConfig(provider=kind, cpus=cpus, memory_mb=256, max_concurrent=concurrency,
                           wave_size=concurrency, wave_interval_s=0.25, warm_pool=WarmPoolConfig(size=pool))
    return make_provider(config, nodes=nodes or (), run_id=f"bench-{uuid.uuid4().hex[:6]}", admission=admission)


def raw_docker_runs(node: NodeSpec, count: int, cpus: float) -> dict[str, list[float]]:
    """The daemon's floor: `docker run --rm` of the same image and check, with the same limits."""
    argv = ["docker", "-H", node.docker_host, "run", "--rm", "--network", "none", f"--cpus={cpus}",
            "--memory=256m", "--memory-swap=256m", "--pids-limit=256", PYTHON, "sh", "-c", CHECK]
    totals = []
    for i in range(count + 2):
        began = time.perf_counter()
        out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60).stdout
        assert out.strip() == "True", out
        if i >= 2:
            totals.append(time.perf_counter() - began)
    return {"total": totals}


async def main_async(args) -> dict:
    out: dict = {"latency": {}, "sustained": {}}
    with tempfile.TemporaryDirectory(prefix="rl360-bench-") as tmp:
        task = load_task(make_task(Path(tmp)))
        nodes = docker_nodes()
        # (row, provider kind, warm pool size per node and spec)
        rows = [("process", "process", 0)]
        if nodes:
            rows += [("docker", "docker", 0), ("docker, warm pool", "docker", args.pool)]
            out["latency"]["raw `docker run --rm`"] = await asyncio.to_thread(
                raw_docker_runs, nodes[0], args.cycles, LATENCY_CPUS)
        for row, kind, pool in rows:
            one_node = nodes[:1] if kind == "docker" else None
            # The provider's own cost, no waves; the raw run's limits.
            provider = provider_for(kind, one_node, 1, admission=False, cpus=LATENCY_CPUS, pool=pool)
            try:
                out["latency"][row] = await cycles(provider, task, args.cycles)
            finally:
                await provider.close()
            count = args.attempts if kind == "process" else args.docker_attempts
            provider = provider_for(kind, nodes if kind == "docker" else None, 32, pool=pool)
            try:
                out["sustained"][row] = await sustained(provider, task, count, 32)
                out["sustained"][row]["pool"] = getattr(provider.inner, "pool_stats", lambda: None)()
            finally:
                await provider.close()
            s = out["sustained"][row]
            print(f"{row}: cycle p50 {statistics.median(out['latency'][row]['total']) * 1000:.0f} ms; "
                  f"{s['per_s']:.1f} attempts/s at 32 concurrent ({s['ok']}/{s['attempts']} rewarded)", flush=True)
        if nodes:
            out["floor"] = await asyncio.to_thread(sdk_attempts, nodes, args.docker_attempts, 32)
    out["docker_nodes"] = len(nodes) if nodes else 0
    return out


def render(data: dict, args) -> str:
    load = os.getloadavg()[0]
    lines = [f"`bench/bench_sandbox.py` on this machine ({os.cpu_count()} cores, {platform.machine()}), "
             f"{time.strftime('%Y-%m-%d')}; load average {load:.1f} when it ended (other work on the machine slows "
             "every figure). The check is `" + CHECK + "`; the process provider runs the host's python3 under "
             "bubblewrap, the docker provider runs the dev python image (cached on the node).", "",
             f"**One sandbox at a time** ({args.cycles} cycles after 2 warm-up ones): start, exec of the check, "
             f"stop, each sandbox limited to {LATENCY_CPUS:g} CPU and 256 MB. The raw row is the daemon's floor: "
             "`docker run --rm` of the same image and check with the same limits, on the same node, in the same run. "
             f"The warm pool keeps {args.pool} started containers per node and spec; a start takes one and the "
             "pool refills behind it while the attempt runs.",
             "", "| provider | start p50 / p95 | exec p50 / p95 | stop p50 / p95 | start+exec+stop p50 / p95 |"
             " p50 / raw p50 |", "|---|---|---|---|---|---|"]
    raw = data["latency"].get("raw `docker run --rm`")
    for row, phases in data["latency"].items():
        cells = [f"{q(phases[n], 0.5) * 1000:.0f} / {q(phases[n], 0.95) * 1000:.0f} ms" if n in phases else "—"
                 for n in ("start", "exec", "stop", "total")]
        ratio = f"{q(phases['total'], 0.5) / q(raw['total'], 0.5):.2f}" if raw and row.startswith("docker") else ""
        lines.append(f"| {row} | " + " | ".join(cells) + f" | {ratio} |")
    lines += ["", "**Sustained, 32 attempts in flight** (a full attempt: start, an agent running the check, "
              "upload tests, test.sh, reward, stop; through the admission controller, 0.05 CPU reserved each):", "",
              "| provider | attempts | rewarded | seconds | attempts/s | median start / agent / tests+verify / stop "
              "| pool hits | machine CPU per attempt |", "|---|---|---|---|---|---|---|---|"]
    for row, s in data["sustained"].items():
        p = s["phases"]
        pool = s.get("pool")
        hits = (f"{pool.hits}/{pool.hits + pool.misses} ({pool.waited} waited)"
                if pool and pool.hits + pool.misses and "pool" in row else "")
        nodes = f" ({data['docker_nodes']} nodes)" if row.startswith("docker") else ""
        lines.append(f"| {row}{nodes} | {s['attempts']} | {s['ok']} | {s['wall_s']:.1f} | {s['per_s']:.1f} | "
                     f"{p['start'] * 1000:.0f} / {p['agent'] * 1000:.0f} / "
                     f"{(p['upload_tests'] + p['verify'] + p['reward']) * 1000:.0f} / {p['stop'] * 1000:.0f} ms | "
                     f"{hits} | {s['cpu_s_per_attempt'] * 1000:.0f} ms |")
    floor = data.get("floor")
    if floor:
        lines.append(f"| the daemons' floor: the same API calls through the docker SDK ({data['docker_nodes']} nodes) | "
                     f"{floor['attempts']} | {floor['ok']} | {floor['wall_s']:.1f} | {floor['per_s']:.1f} | — | | "
                     f"{floor['cpu_s_per_attempt'] * 1000:.0f} ms |")
    if "docker" not in data["latency"]:
        lines += ["", "The dev Docker nodes were not running: no docker figures."]
    lines += ["", "A process sandbox costs a folder (its stop renames it away; the deletion runs in the background: "
              "deleting is slow on this disk) and one bubblewrap start per command (a fresh pid namespace "
              "each time). A Docker sandbox costs a container create + start (the daemon's runc start is most of "
              "it), a `docker exec` per command and a removal; its stop only sends the removal (the provider "
              "finishes it in the background and waits for it when it closes), and with a warm pool the create + "
              "start happens before the attempt asks. All three dev daemons share these cores.",
              ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cycles", type=int, default=40)
    parser.add_argument("--attempts", type=int, default=320)
    parser.add_argument("--docker-attempts", type=int, default=96)
    parser.add_argument("--pool", type=int, default=3, help="Warm pool size per node and spec for the pooled rows.")
    parser.add_argument("--no-write", action="store_true", help="Print only; leave docs/benchmarks.md alone.")
    args = parser.parse_args()
    data = asyncio.run(main_async(args))
    text = render(data, args)
    print(f"## {TITLE}\n\n{text}")
    if not args.no_write:
        write_section(TITLE, text)


if __name__ == "__main__":
    main()
