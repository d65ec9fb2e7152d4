"""Benchmark: what one local-smoke attempt costs in its process sandbox, and each command's floor.

    .venv/bin/python bench/bench_arith_attempt.py [--attempts 200] [--concurrency 16] [--execs 40]

1. `run_attempt` on the arith-32 tasks through the process provider (bubblewrap, prlimit, setpriv as
   root), with an agent that runs the one `echo` a local-smoke answer is, `--concurrency` at once: the CPU
   seconds per attempt in this process and in the sandboxes' processes (reaped children), and the
   median of each phase.
2. One sandbox, one command after another (`--execs` each): the CPU of a bare command (`true`: the
   floor every command pays), the agent's `echo`, the verifier (`VERIFY_COMMAND`) and a bare
   `python3 -I -S`.
3. The floor's layers (`--execs` each, started here one after another with `subprocess.run`): the whole
   wrapper around `true`, without `setpriv` and `prlimit`, without the `sh` + `bash` that keep the
   command off pid 1, `setpriv` + `prlimit` alone; and what a long-lived keeper per sandbox would pay to
   start instead: the host's `python3 -I -S`, and with `ctypes` (to make itself non-dumpable, so that the
   sandbox's own commands, of the same uid, cannot write its memory through /proc/1/mem).

Prints the figures (docs/benchmarks.md, "Local smoke: one step, profiled", quotes them); writes nothing.
CPU seconds hold on a shared machine; the wall times do not.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rl360cli.sandbox.attempt import VERIFY_COMMAND, run_attempt  # noqa: E402
from rl360cli.sandbox.config import SandboxConfig  # noqa: E402
from rl360cli.sandbox.process.isolation import rlimit_args  # noqa: E402
from rl360cli.sandbox.process.provider import ProcessProvider  # noqa: E402
from rl360cli.sandbox.task_loader import load_task_set  # noqa: E402

TASKS = REPO / "recipes" / "tasks" / "arith-32"
# local-smoke's [sandbox]: a sliver of a core and 256 MB per sandbox.
CONFIG = SandboxConfig(cpus=0.05, memory_mb=256)
ANSWER = "echo 'x - 5' > answer.py"
PHASES = ("start", "agent", "upload_tests", "verify", "reward", "stop", "total")


def cpu_s() -> tuple[float, float]:
    """CPU seconds of this process and of its reaped children."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


async def attempts(provider: ProcessProvider, n: int, concurrency: int) -> None:
    tasks = load_task_set(TASKS, refused={})
    slots = asyncio.Semaphore(concurrency)
    results = []

    async def agent(sandbox) -> None:
        await sandbox.exec(ANSWER, timeout_s=30)

    async def one(i: int) -> None:
        async with slots:
            results.append(await run_attempt(provider, tasks[i % len(tasks)], agent, attempt_id=f"bench-{i}"))

    await one(-1)  # the first attempt lays out what later ones reuse
    results.clear()
    (own0, kids0), began = cpu_s(), time.monotonic()
    await asyncio.gather(*(one(i) for i in range(n)))
    (own1, kids1), wall = cpu_s(), time.monotonic() - began
    print(f"{n} attempts, {concurrency} at once: {wall:.1f} s; CPU per attempt: {1000 * (own1 - own0) / n:.1f} ms "
          f"here, {1000 * (kids1 - kids0) / n:.1f} ms in the sandboxes' processes")
    for phase in PHASES:
        print(f"  {phase:13s} median {1000 * statistics.median(r.timings.get(phase, 0.0) for r in results):7.1f} ms")


async def commands(provider: ProcessProvider, n: int) -> None:
    task = load_task_set(TASKS, refused={})[0]
    sandbox = await provider.start(task, attempt_id="bench-commands", labels={})
    try:
        await sandbox.exec(ANSWER, timeout_s=30)
        for entry in sorted(task.tests_dir.iterdir()):
            await sandbox.upload(entry, f"/tests/{entry.name}")
        for name, command in (("true (the floor)", "true"), ("the agent's echo", ANSWER),
                              ("the verifier", VERIFY_COMMAND), ("python3 -I -S -c pass", "python3 -I -S -c pass")):
            result = await sandbox.exec(command, timeout_s=30)
            (_, kids0), began = cpu_s(), time.monotonic()
            for _ in range(n):
                await sandbox.exec(command, timeout_s=30)
            (_, kids1), wall = cpu_s(), time.monotonic() - began
            print(f"  {name:24s} exit {result.exit_code}: {1000 * (kids1 - kids0) / n:5.1f} ms CPU, "
                  f"{1000 * wall / n:6.1f} ms wall")
    finally:
        await sandbox.stop()


async def layers(provider: ProcessProvider, n: int) -> None:
    task = load_task_set(TASKS, refused={})[0]
    sandbox = await provider.start(task, attempt_id="bench-layers", labels={})
    iso = provider.isolation
    limits = rlimit_args(memory_mb=CONFIG.memory_mb, pids=CONFIG.pids_limit, file_mb=CONFIG.max_file_mb,
                         open_files=CONFIG.max_open_files, cpu_s=31)
    try:
        whole = iso.argv(sandbox.fs, "true", workdir=task.workdir, limits=limits, uid=sandbox.uid)
        bwrap = whole[whole.index(iso.bwrap):] if iso.bwrap else whole
        bare = bwrap[:len(bwrap) - 1 - bwrap[::-1].index("--")] + ["--", "/bin/sh", "-c", "true"]
        python = [sys.executable if not Path("/usr/bin/python3").exists() else "/usr/bin/python3", "-I", "-S", "-c"]
        for name, argv in (("setpriv, prlimit, bwrap, sh, bash", whole), ("bwrap, sh, bash", bwrap),
                           ("bwrap, sh -c true", bare), ("setpriv, prlimit, true", whole[:len(whole) - len(bwrap)]
                                                         + ["/bin/true"]),
                           ("python3 -I -S -c pass", [*python, "pass"]),
                           ("python3 -I -S, import ctypes", [*python, "import ctypes"])):
            (_, kids0), began = cpu_s(), time.monotonic()
            for _ in range(n):
                subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               check=True)
            (_, kids1), wall = cpu_s(), time.monotonic() - began
            print(f"  {name:34s} {1000 * (kids1 - kids0) / n:5.1f} ms CPU, {1000 * wall / n:6.1f} ms wall")
    finally:
        await sandbox.stop()


async def main(args: argparse.Namespace) -> None:
    provider = ProcessProvider(CONFIG, run_id="bench-arith-attempt")
    try:
        await attempts(provider, args.attempts, args.concurrency)
        print(f"one sandbox, {args.execs} commands each:")
        await commands(provider, args.execs)
        print(f"the floor's layers, {args.execs} runs each:")
        await layers(provider, args.execs)
    finally:
        await provider.close()
    print(f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} cores")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attempts", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--execs", type=int, default=40)
    asyncio.run(main(parser.parse_args()))
