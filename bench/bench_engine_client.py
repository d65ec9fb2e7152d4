"""Benchmark of the rollouts' engine client: CPU per `/generate` request on the client's side.

Run: `.venv/bin/python bench/bench_engine_client.py [--requests 5000] [--no-write]` (about a minute).
Every agent turn is one `POST /generate` from a session actor to the router, so at the reference
scale (~1,000 turns a second) the client's CPU per request is the actors' budget. The server is a
stand-in for the router (a separate process on 127.0.0.1 answering every request with the same
SGLang `/generate` answer, 16 tokens with their logprobs, without parsing more than the request's
length), so that the figure is the client's alone. Two clients, alternated three times each in one
run, the median kept: `EngineClient` (rl360cli/inference/client.py over http1.Http1Client) and
aiohttp's `ClientSession` the way EngineClient used it until 2026-12-04 (`json=` body, `read()`,
`json.loads`, the same `GenerateResult.from_answer` checks). The figures go into the
`## Engine client` section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.report import write_section  # noqa: E402
from rl360cli.inference.client import EngineClient, GenerateResult  # noqa: E402

PROMPT = list(range(300))
PARAMS = {"max_new_tokens": 48, "temperature": 1.0, "top_p": 1.0}
ANSWER = json.dumps({
    "text": "```bash\necho '(x-1)**2' > answer.py\n```", "output_ids": list(range(16)),
    "meta_info": {"id": "r", "finish_reason": {"type": "stop", "matched": 2}, "prompt_tokens": len(PROMPT),
                  "completion_tokens": 16, "weight_version": "3",
                  "output_token_logprobs": [[-0.5, i, None] for i in range(16)]},
}).encode()


class CannedAnswer(asyncio.Protocol):
    """Stands in for the router: reads each request's head and body, answers ANSWER, keeps the connection."""

    reply = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (
        len(ANSWER), ANSWER)

    def connection_made(self, transport: asyncio.Transport) -> None:
        self.transport, self.buffer = transport, b""

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while (end := self.buffer.find(b"\r\n\r\n")) >= 0:
            length = next((int(line[15:]) for line in self.buffer[:end].lower().split(b"\r\n")
                           if line.startswith(b"content-length:")), 0)
            if len(self.buffer) < end + 4 + length:
                return
            self.buffer = self.buffer[end + 4 + length:]
            self.transport.write(self.reply)


async def serve(port: int) -> None:
    server = await asyncio.get_running_loop().create_server(CannedAnswer, "127.0.0.1", port)
    await server.serve_forever()


async def with_engine_client(url: str, n: int, concurrency: int) -> tuple[float, float]:
    async with EngineClient(url) as client:
        async def one() -> GenerateResult:
            return await client.generate(PROMPT, PARAMS, timeout_s=60)
        return await _measure(one, n, concurrency)


async def with_aiohttp(url: str, n: int, concurrency: int) -> tuple[float, float]:
    import aiohttp

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        async def one() -> GenerateResult:
            body = {"input_ids": PROMPT, "sampling_params": PARAMS, "return_logprob": True}
            async with session.request("POST", url + "/generate", json=body,
                                       timeout=aiohttp.ClientTimeout(total=60)) as reply:
                raw = await reply.read()
            return GenerateResult.from_answer(json.loads(raw), url=url, return_logprob=True)
        return await _measure(one, n, concurrency)


async def _measure(one, n: int, concurrency: int) -> tuple[float, float]:
    """(client CPU microseconds per request, requests per second) for `n` requests, `concurrency` at once."""
    await one()  # the first connection and imports outside the clock
    slots = asyncio.Semaphore(concurrency)

    async def limited() -> None:
        async with slots:
            result = await one()
        assert len(result.output_ids) == 16 and result.weight_version == 3

    wall, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(limited() for _ in range(n)))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return cpu / n * 1e6, n / wall


CLIENTS = {"EngineClient (http1.Http1Client)": with_engine_client,
           "aiohttp ClientSession (the client until 2026-12-04)": with_aiohttp}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)  # the server process's own mode
    parser.add_argument("--no-write", action="store_true", help="print the figures, leave docs/benchmarks.md alone")
    args = parser.parse_args()
    if args.serve:
        asyncio.run(serve(args.serve))
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(port)])
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while socket.socket().connect_ex(("127.0.0.1", port)) != 0:
            if time.monotonic() > deadline or server.poll() is not None:
                raise SystemExit("the stand-in server did not start")
            time.sleep(0.1)
        load = os.getloadavg()[0]
        rows = []
        for concurrency in args.concurrency:
            figures: dict[str, list[tuple[float, float]]] = {name: [] for name in CLIENTS}
            for _ in range(3):
                for name, client in CLIENTS.items():
                    figures[name].append(asyncio.run(client(url, args.requests, concurrency)))
            for name, runs in figures.items():
                cpu = statistics.median(r[0] for r in runs)
                rate = statistics.median(r[1] for r in runs)
                rows.append(f"| {name} | {concurrency} | {cpu:.0f} | {rate:,.0f} |")
    finally:
        server.terminate()
        server.wait(10)
    table = "\n".join(["| client | requests at once | client CPU per request (us) | requests/s |",
                       "|---|---|---|---|", *rows])
    print(table)
    if args.no_write:
        return
    write_section("Engine client", (
        f"`bench/bench_engine_client.py --requests {args.requests}`, {date.today()}, {platform.machine()}, "
        f"{os.cpu_count()} cores; load average {load:.1f} when it started. `POST /generate` with a "
        f"{len(PROMPT)}-token prompt against a stand-in for the router (another process answering every "
        "request with the same 16-token SGLang answer); client CPU is the client process's own, answer "
        "checks (`GenerateResult.from_answer`) included; each figure the median of three runs, the two "
        f"clients alternated.\n\n{table}\n"))


if __name__ == "__main__":
    main()
