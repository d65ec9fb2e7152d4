"""Benchmark: a local-smoke session's CPU in the process provider, a bubblewrap per command against a keeper
per sandbox (`[sandbox] process_namespace = "command"` / `"sandbox"`, rl360cli/sandbox/process/keeper.py).

    sudo .venv/bin/python bench/bench_process_keeper.py [--sessions 60] [--rounds 3] [--concurrency 1]

Each session is `run_attempt` on the first arith-32 task (the `echo` answers it) with local-smoke's [sandbox] (0.05 CPUs, 256 MB) and an agent
that runs the one `echo` a local-smoke answer is: start, the agent's command, the tests' upload, the
verifier, the reward, stop. The two modes take turns, `--rounds` times `--sessions` each (`--concurrency`
at once). Prints, per mode, the CPU per session in this process and in the sandboxes' processes (reaped
children: bubblewrap reaps the keeper, which reaps the commands), the median wall time of a session, and
the rewards (all 1.0, or the figures are void). Needs root (a sandbox uid of its own) and bubblewrap.
docs/benchmarks.md ("Local smoke: one step, profiled", "Halving the run, weighed") quotes it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import shutil
import statistics
import sys
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rl360cli.sandbox.attempt import run_attempt  # noqa: E402
from rl360cli.sandbox.config import SandboxConfig  # noqa: E402
from rl360cli.sandbox.process.provider import ProcessProvider  # noqa: E402
from rl360cli.sandbox.task_loader import load_task_set  # noqa: E402

TASKS = REPO / "recipes" / "tasks" / "arith-32"
ANSWER = "echo 'x - 5' > answer.py"
MODES = ("command", "sandbox")


def cpu_s() -> tuple[float, float]:
    """CPU seconds of this process and of its reaped children."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


async def sessions(provider: ProcessProvider, n: int, concurrency: int) -> tuple[list[float], list[float]]:
    """(rewards, wall seconds) of `n` sessions."""
    tasks = load_task_set(TASKS, refused={})
    slots = asyncio.Semaphore(concurrency)

    async def agent(sandbox):
        await sandbox.exec(ANSWER, timeout_s=30)

    async def one(i: int):
        async with slots:
            began = time.monotonic()
            result = await run_attempt(provider, tasks[0], agent, attempt_id=f"bench-{i}",
                                       labels={"rl360.run": provider.run_id})
            return result.reward, time.monotonic() - began

    done = await asyncio.gather(*(one(i) for i in range(n)))
    return [reward for reward, _ in done], [wall for _, wall in done]


async def main(args: argparse.Namespace) -> None:
    if os.geteuid() != 0 or shutil.which("bwrap") is None:
        raise SystemExit("needs root (a sandbox uid of its own) and bubblewrap")
    root = Path("/tmp/rl360-bench-keeper") / uuid.uuid4().hex[:8]
    root.mkdir(parents=True)
    os.chmod(root.parent, 0o711)
    providers = {mode: ProcessProvider(SandboxConfig(cpus=0.05, memory_mb=256, process_namespace=mode),
                                       run_id=f"bench-keeper-{mode}", root=root / mode) for mode in MODES}
    assert providers["sandbox"].keeps_namespaces
    figures: dict[str, list[tuple[float, float, float]]] = {mode: [] for mode in MODES}
    rewards: dict[str, list[float]] = {mode: [] for mode in MODES}
    try:
        for mode in MODES:  # a warm-up round each: the task set, the keeper's binary, the first imports
            await sessions(providers[mode], 4, args.concurrency)
        for _ in range(args.rounds):
            for mode in MODES:
                own0, kids0 = cpu_s()
                got, walls = await sessions(providers[mode], args.sessions, args.concurrency)
                own1, kids1 = cpu_s()
                n = args.sessions
                figures[mode].append((1000 * (own1 - own0) / n, 1000 * (kids1 - kids0) / n,
                                      1000 * statistics.median(walls)))
                rewards[mode] += got
    finally:
        for provider in providers.values():
            await provider.close()
        shutil.rmtree(root, ignore_errors=True)
    for mode in MODES:
        rounds = " | ".join(f"{own:.1f} + {kids:.1f} ms" for own, kids, _ in figures[mode])
        own = statistics.median(f[0] for f in figures[mode])
        kids = statistics.median(f[1] for f in figures[mode])
        wall = statistics.median(f[2] for f in figures[mode])
        print(f"process_namespace = {mode!r}: per session {own:.1f} ms here + {kids:.1f} ms in the sandbox's "
              f"processes = {own + kids:.1f} ms of CPU (median of rounds: {rounds}); median session "
              f"{wall:.0f} ms wall; rewards {sorted(set(rewards[mode]))} over {len(rewards[mode])}")
    print(f"{args.sessions} sessions x {args.rounds} rounds, {args.concurrency} at once; load average "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} cores")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=1)
    asyncio.run(main(parser.parse_args()))
