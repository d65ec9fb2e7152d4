"""Benchmark of the session endpoint: CPU per agent turn over direct generate, 1,000 sessions in flight.

Run: `.venv/bin/python bench/bench_endpoint.py [--sessions 1000] [--turns 4] [--repeats 3] [--profile]
[--no-write]` (a few minutes). Every rollout session now talks to the model through the session endpoint
(rl360cli/agent/endpoint.py: chat template, session record, tool parsers); before, the built-in agent
called `EngineClient.generate` on token ids it kept itself (`ConversationTokens`, git show
49a8b0a:rl360cli/agent/session.py). Three ways of running the same sessions, in one process, each with
`--sessions` in flight at once and `--turns` turns each (a bash block from the model, a few hundred
characters of command output back):

- direct: the old loop, `EngineClient.generate` + `ConversationTokens` (observations framed once, appended);
- endpoint: `SessionEndpoint.complete` in process, driven by the built-in agent (builtin.py), then the
  record's samples: what a session actor does for `harness = "bash"`;
- http (aiohttp) and http (openai): the endpoint over loopback HTTP, from a harness in the same process
  (as an async harness runs on its session actor's loop): one aiohttp session for all, or the official
  `openai.AsyncOpenAI`, a client per session as docs/agents.md's example makes one (only at the first
  `--turns`: its client's own CPU is most of it).

The engine is a stand-in (`--serve`: another process, so its CPU is not counted): it answers SGLang's
`POST /generate` at once with the same scripted completion, tokenized with the tokenizer under test and
ended with its end-of-turn token, without parsing the request beyond its length. The tokenizers are real:
local-smoke's (recipes/models/local-smoke-v0, its own template) and SmolLM2's with Qwen2.5's ChatML template
(tests/agent/chat_fixtures.py). CPU is the process's own (`time.process_time`) over the whole run (sessions
registered and started, every turn, the samples), divided by the turns; the median of `--repeats` runs,
the ways alternated. The collector is set as in the session actors (rl360cli/inference/collector.py).
`--profile` adds a cProfile of one endpoint run. The figures go into the
`## Session endpoint: CPU per turn` section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import json
import os
import platform
import pstats
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.bench_engine_client import CannedAnswer  # noqa: E402
from bench.report import write_section  # noqa: E402
from rl360cli.agent.builtin import BuiltinAgent  # noqa: E402
from rl360cli.agent.config import AgentConfig, RolloutConfig  # noqa: E402
from rl360cli.agent.conversation import ConversationTokens, first_shell_block, format_observation, parse_action  # noqa: E402
from rl360cli.agent.endpoint import SessionEndpoint, SessionOptions  # noqa: E402
from rl360cli.agent.harness import Session, TaskInfo  # noqa: E402
from rl360cli.inference.client import EngineClient  # noqa: E402
from rl360cli.inference.collector import collect_for_many_requests  # noqa: E402
from rl360cli.sandbox.provider import ExecResult  # noqa: E402

LOCAL_SMOKE = REPO / "recipes" / "models" / "local-smoke-v0"
# The model's reply every turn: a short plan and a bash block (~30 tokens).
COMPLETION = "I will look at the files first.\n```bash\nls -la /app && head -n 20 /app/README.md\n```"
SYSTEM = ("You are a careful software engineer working in a Linux sandbox. Reply with one ```bash block to run a "
          "command; you will see what it printed. Say done when the task is solved.")
NUM_TASKS = 32
MAX_TOTAL_TOKENS = 32768
MAX_NEW_TOKENS = 256


def instruction(task: int) -> str:
    return (f"Task {task}: the program in /app/solve.py fails its tests on inputs larger than {task * 37 + 5}. "
            "Find the cause, fix it without changing the interface, and write the fixed value of "
            f"f({task}) to /app/answer.txt.")


def command_output(session: int, turn: int, chars: int) -> str:
    """A listing-like output of about `chars` characters, different for every session and turn."""
    lines, n = [], 0
    while n < chars:
        line = f"-rw-r--r-- 1 agent agent {(session * 7919 + turn * 104729 + n) % 99991:>6} Dec  6 07:{n % 60:02d} file_{session}_{turn}_{n}.py"
        lines.append(line)
        n += len(line) + 1
    return "\n".join(lines)[:chars]


# ---------------------------------------------------------------------------- the stand-in engine

class CannedGenerate(CannedAnswer):
    """Stands in for SGLang's `POST /generate`: reads each request's head and body, answers the canned
    completion at once (its `reply`, set per run), keeps the connection open."""

    reply = b""


def serve(port: int) -> None:
    answer = sys.stdin.buffer.read()
    CannedGenerate.reply = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (
        len(answer), answer)

    async def forever() -> None:
        server = await asyncio.get_running_loop().create_server(CannedGenerate, "127.0.0.1", port, backlog=4096)
        await server.serve_forever()
    asyncio.run(forever())


def canned_answer(tokenizer: Any, end_of_turn: str) -> dict:
    """SGLang's `/generate` answer for COMPLETION: its ids and the end-of-turn token (kept in `output_ids`,
    left out of `text`, as SGLang does)."""
    eot = tokenizer.convert_tokens_to_ids(end_of_turn)
    ids = list(tokenizer.encode(COMPLETION, add_special_tokens=False)) + [eot]
    return {"text": tokenizer.decode(ids[:-1], skip_special_tokens=True), "output_ids": ids,
            "meta_info": {"id": "r", "finish_reason": {"type": "stop", "matched": eot}, "prompt_tokens": 0,
                          "completion_tokens": len(ids), "weight_version": "0",
                          "output_token_logprobs": [[-0.5, t, None] for t in ids]}}


class StandIn:
    """The stand-in engine in its own process, for one tokenizer's canned answer."""

    def __init__(self, answer: dict):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.process = subprocess.Popen([sys.executable, __file__, "--serve", str(self.port)], stdin=subprocess.PIPE)
        self.process.stdin.write(json.dumps(answer).encode())
        self.process.stdin.close()
        deadline = time.monotonic() + 30
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    break
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise SystemExit("the stand-in engine did not start")
            time.sleep(0.1)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(10)


# ---------------------------------------------------------------------------- the sessions, three ways

@dataclass(frozen=True, slots=True)
class Workload:
    sessions: int
    turns: int
    observation_chars: int


class InstantSandbox:
    """A sandbox whose every command returns at once with a listing-like output."""

    def __init__(self, session: int, chars: int):
        self.session, self.chars, self.calls = session, chars, 0

    async def exec(self, command: str, *, timeout_s: float | None = None, cwd: str | None = None,
                   env: Any = None) -> ExecResult:
        self.calls += 1
        return ExecResult(exit_code=0, output=command_output(self.session, self.calls, self.chars))


def first_messages(session: int) -> list[dict]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": instruction(session % NUM_TASKS)}]


async def direct_session(index: int, work: Workload, *, tokenizer: Any, client: EngineClient) -> dict:
    """The old built-in agent's loop (49a8b0a:rl360cli/agent/session.py), less the sandbox's start and verifier."""
    conversation = ConversationTokens(tokenizer, first_messages(index), observation_role="tool")
    sandbox = InstantSandbox(index, work.observation_chars)
    turns = []
    for _ in range(work.turns):
        budget = min(MAX_NEW_TOKENS, MAX_TOTAL_TOKENS - len(conversation))
        reply = await client.generate(conversation.token_ids,
                                      {"max_new_tokens": budget, "temperature": 1.0, "top_p": 1.0}, timeout_s=60)
        conversation.add_generated(reply.output_ids, reply.logprobs, reply.weight_version)
        action = parse_action(reply.text)
        turns.append({"action": action.kind, "tokens": len(reply.output_ids), "finish": reply.finish_reason})
        if action.kind == "submit":
            break
        result = await sandbox.exec(action.command, timeout_s=60)
        observation = format_observation(result.exit_code, result.output, timed_out=result.timed_out)
        conversation.add_observation(observation)
    return {"token_ids": conversation.token_ids, "loss_mask": conversation.loss_mask, "turns": len(turns)}


AGENT = AgentConfig(system_prompt=SYSTEM)


async def endpoint_session(index: int, work: Workload, *, endpoint: SessionEndpoint, options: SessionOptions) -> dict:
    """A rollout session's agent part as rollout/session.py runs it: registered, the built-in agent, the samples."""
    handle = endpoint.register(options)
    agent = BuiltinAgent(agent=AGENT, rollout=RolloutConfig(max_turns=work.turns, max_new_tokens=MAX_NEW_TOKENS,
                                                            max_total_tokens=MAX_TOTAL_TOKENS),
                         exec_timeout_s=60)
    sandbox = InstantSandbox(index, work.observation_chars)
    session = Session(task=TaskInfo(id=f"task-{index % NUM_TASKS}", instruction=instruction(index % NUM_TASKS)),
                      base_url=handle.base_url, api_key=handle.token, model=options.model, sandbox=None,
                      async_sandbox=sandbox, complete=lambda body: endpoint.complete(handle.token, body))
    await agent(session)
    record = endpoint.unregister(handle.token)
    samples = record.samples()
    assert record.num_tito_breaks == 0 and len(samples) == 1, record.break_reasons
    return {"token_ids": samples[0].token_ids, "loss_mask": samples[0].loss_mask, "turns": record.num_turns}


async def http_session(index: int, work: Workload, *, endpoint: SessionEndpoint, options: SessionOptions,
                       connect: Any) -> dict:
    """A user's harness over HTTP: the same loop as the built-in agent's, in OpenAI messages. `connect(handle)`
    gives the harness's client: (an async function from a request body to the answer's message, its close)."""
    handle = endpoint.register(options)
    post, close = connect(handle)
    sandbox = InstantSandbox(index, work.observation_chars)
    messages = first_messages(index)
    for _ in range(work.turns):
        message = await post({"model": options.model, "messages": messages, "max_tokens": MAX_NEW_TOKENS})
        messages.append(message)
        command = first_shell_block(message.get("content") or "")
        if command is None:
            break
        result = await sandbox.exec(command, timeout_s=60)
        messages.append({"role": "tool", "content": format_observation(result.exit_code, result.output)})
    await close()
    record = endpoint.unregister(handle.token)
    samples = record.samples()
    assert record.num_tito_breaks == 0 and len(samples) == 1, record.break_reasons
    return {"token_ids": samples[0].token_ids, "loss_mask": samples[0].loss_mask, "turns": record.num_turns}


async def run_way(way: str, work: Workload, *, tokenizer: Any, engine_url: str,
                  profile: cProfile.Profile | None = None) -> tuple[float, float, list[dict]]:
    """(CPU seconds, wall seconds, each session's result) for `work.sessions` sessions at once, one way."""
    client = EngineClient(engine_url, num_connect_retries=0, num_cut_retries=0)
    endpoint = SessionEndpoint(tokenizer=tokenizer, client=client)
    await endpoint.start()
    options = SessionOptions(tool_parser=None, max_new_tokens=MAX_NEW_TOKENS, max_total_tokens=MAX_TOTAL_TOKENS)
    closers = []
    if way == "direct":
        def one(i: int):
            return direct_session(i, work, tokenizer=tokenizer, client=client)
    elif way == "endpoint":
        def one(i: int):
            return endpoint_session(i, work, endpoint=endpoint, options=options)
    elif way == "http (aiohttp)":
        import aiohttp

        http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        closers.append(http.close)

        def connect(handle):
            async def post(body: dict) -> dict:
                async with http.post(handle.base_url + "/chat/completions", json=body,
                                     headers={"Authorization": f"Bearer {handle.token}"}) as reply:
                    answer = await reply.json()
                return answer["choices"][0]["message"]

            async def close() -> None:
                pass
            return post, close

        def one(i: int):
            return http_session(i, work, endpoint=endpoint, options=options, connect=connect)
    elif way == "http (openai)":
        import openai

        def connect(handle):
            # A client per session, as the harness in docs/agents.md makes one.
            client = openai.AsyncOpenAI(base_url=handle.base_url, api_key=handle.token, max_retries=0)

            async def post(body: dict) -> dict:
                reply = await client.chat.completions.create(**body)
                return reply.choices[0].message.model_dump(exclude_none=True)
            return post, client.close

        def one(i: int):
            return http_session(i, work, endpoint=endpoint, options=options, connect=connect)
    else:
        raise ValueError(way)
    await asyncio.gather(*(one(i) for i in range(8)))  # connections, caches and imports outside the clock
    gc.collect()
    if profile is not None:
        profile.enable()
    wall, cpu = time.perf_counter(), time.process_time()
    results = await asyncio.gather(*(one(i) for i in range(work.sessions)))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    if profile is not None:
        profile.disable()
    for close in closers:
        await close()
    await endpoint.close()
    await client.close()
    return cpu, wall, results


WAYS = ("direct", "endpoint", "http (aiohttp)", "http (openai)")


def load_tokenizers(names: list[str]) -> dict[str, tuple[Any, str]]:
    """{name: (tokenizer, end-of-turn token)}"""
    from transformers import AutoTokenizer

    from tests.agent.chat_fixtures import qwen_tokenizer

    found = {}
    for name in names:
        if name == "local-smoke":
            found[name] = (AutoTokenizer.from_pretrained(LOCAL_SMOKE), "<|end|>")
        else:
            found[name] = (qwen_tokenizer(name), "<|im_end|>")
    return found


def check_same_tokens(direct: list[dict], other: list[dict], way: str) -> None:
    """Each session trained on the same tokens both ways: the endpoint's are the direct loop's (which also
    appended its last observation), but for the end-of-turn separator's tail that the old loop left out
    (ChatML's `\\n` after `<|im_end|>`: at most one token a turn)."""
    for a, b in zip(direct, other):
        at, skipped = 0, 0
        for token in b["token_ids"]:
            if at < len(a["token_ids"]) and a["token_ids"][at] == token:
                at += 1
            else:
                skipped += 1
        if skipped > b["turns"] or a["turns"] != b["turns"]:
            raise SystemExit(f"{way}: a session's tokens differ from the direct loop's")


PROFILED_PARTS = {  # (file suffix, function): label
    ("builtin.py", "__call__"): "`BuiltinAgent.__call__` (the agent, its requests included)",
    ("endpoint.py", "_complete"): "`SessionEndpoint._complete` (a request, generate included)",
    ("client.py", "generate"): "&nbsp;&nbsp;`EngineClient.generate` (as in direct)",
    ("session_record.py", "prepare"): "&nbsp;&nbsp;`SessionRecord.prepare`",
    ("session_record.py", "continuation_problem"): "&nbsp;&nbsp;&nbsp;&nbsp;`continuation_problem` (the history compared)",
    ("chat_template.py", "prompt_ids"): "&nbsp;&nbsp;&nbsp;&nbsp;`ChatTemplate.prompt_ids` (a session's first request)",
    ("chat_template.py", "append_ids"): "&nbsp;&nbsp;&nbsp;&nbsp;`ChatTemplate.append_ids` (the appends)",
    ("chat_template.py", "_render"): "&nbsp;&nbsp;&nbsp;&nbsp;of the two: `ChatTemplate._render` (the conversation, Jinja)",
    ("chat_template.py", "encode"): "&nbsp;&nbsp;&nbsp;&nbsp;of the two: `ChatTemplate.encode` (the tokenizer)",
    ("session_record.py", "commit"): "&nbsp;&nbsp;`SessionRecord.commit`",
    ("tool_parsers.py", "parse_completion"): "&nbsp;&nbsp;`parse_completion`",
    ("session_record.py", "samples"): "`SessionRecord.samples` (once a session)",
}


def profile_parts(profile: cProfile.Profile, turns: int) -> dict[str, tuple[float, float]]:
    """{part: (inclusive ms per turn, share of the run)} of an endpoint run, on cProfile's clock."""
    stats = pstats.Stats(profile)
    parts = {}
    for (suffix, name), label in PROFILED_PARTS.items():
        found = [value for key, value in stats.stats.items() if key[0].endswith(suffix) and key[2] == name]
        cumulative = sum(value[3] for value in found)
        parts[label] = (1e3 * cumulative / turns, cumulative / stats.total_tt)
    return parts


def profile_table(profiles: list[tuple[str, dict[str, tuple[float, float]]]]) -> list[str]:
    """One row per part, one column per profiled run: ms per turn (share of the run)."""
    rows = ["| part | " + " | ".join(title for title, _ in profiles) + " |", "|---" * (len(profiles) + 1) + "|"]
    for label in PROFILED_PARTS.values():
        cells = [f"{parts[label][0]:.2f} ({100 * parts[label][1]:.0f}%)" for _, parts in profiles]
        rows.append(f"| {label} | " + " | ".join(cells) + " |")
    return rows


def openai_client_ms(num: int = 50) -> float:
    """CPU ms to make one `openai.AsyncOpenAI` (its httpx client loads the CA certificates)."""
    import openai

    started = time.process_time()
    clients = [openai.AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="k") for _ in range(num)]
    spent = time.process_time() - started
    for client in clients:
        asyncio.run(client.close())
    return 1e3 * spent / num


def section(args: argparse.Namespace, tokenizers: dict[str, tuple[Any, str]], *, load: float, table: str,
            profile_lines: list[str], client_ms: float | None) -> str:
    """The `## Session endpoint: CPU per turn` section's text."""
    body = [
        f"`bench/bench_endpoint.py --sessions {args.sessions} --turns {' '.join(map(str, args.turns))} "
        f"--observation-chars {args.observation_chars} --repeats {args.repeats}"
        f"{' --profile' if args.profile else ''}`, {date.today()}, {platform.machine()}, {os.cpu_count()} cores; "
        f"load average {load:.1f} when it started. {args.sessions:,} sessions in flight in one process, each "
        "turn a `/generate` of the stand-in engine (another process: its CPU is not counted) answering the "
        "same bash block at once ("
        + ", ".join(f"{len(canned_answer(*pair)['output_ids'])} tokens with {name}'s tokenizer"
                    for name, pair in tokenizers.items())
        + f"), and {args.observation_chars} characters of command output back as a tool message. CPU is the process's "
        "own over the whole run (sessions registered, every turn, the samples) per turn, the median of the "
        "runs, the ways alternated; `direct` is the old built-in agent's loop (`EngineClient.generate` + "
        "`ConversationTokens`), `endpoint` the built-in agent on `SessionEndpoint.complete`, `http` a harness "
        "in the same process over loopback HTTP (its client's CPU counted: on a session actor it is the "
        "actor's), `openai` with a client per session as docs/agents.md's example makes one"
        + (f" ({client_ms:.0f} ms of CPU to make each)" if client_ms is not None else "")
        + ". Every session's trained tokens were checked the same across the ways (but for the `\\n` after "
        "ChatML's `<|im_end|>`, which the old loop left out)." + (f" {args.note}" if args.note else ""),
        "", table,
    ]
    if profile_lines:
        body += ["", ("Where an `endpoint` run's time goes (cProfile, inclusive ms per turn and share of the run; "
                      "cProfile's own overhead inflates Python-heavy parts, so read the shares):"), "", *profile_lines]
    return "\n".join(body)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--turns", type=int, nargs="+", default=[4])
    parser.add_argument("--observation-chars", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tokenizers", nargs="+", default=["local-smoke", "qwen2.5-instruct"])
    parser.add_argument("--ways", nargs="+", default=list(WAYS), choices=WAYS)
    parser.add_argument("--profile", action="store_true", help="a cProfile of one endpoint run per tokenizer")
    parser.add_argument("--note", default="", help="a sentence for the section (what else ran, which commit)")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)  # the stand-in engine's own mode
    parser.add_argument("--no-write", action="store_true", help="print the figures, leave docs/benchmarks.md alone")
    args = parser.parse_args()
    if args.serve:
        serve(args.serve)
        return
    tokenizers = load_tokenizers(args.tokenizers)
    collect_for_many_requests()
    load = os.getloadavg()[0]
    rows, profiles, lengths = [], [], {}
    for name, (tokenizer, end_of_turn) in tokenizers.items():
        engine = StandIn(canned_answer(tokenizer, end_of_turn))
        try:
            for turns in args.turns:
                work = Workload(sessions=args.sessions, turns=turns, observation_chars=args.observation_chars)
                ways = [way for way in args.ways if way != "http (openai)" or turns == args.turns[0]]
                figures: dict[str, list[tuple[float, float]]] = {way: [] for way in ways}
                for _ in range(args.repeats):
                    results: dict[str, list[dict]] = {}
                    for way in ways:
                        cpu, wall, results[way] = asyncio.run(run_way(way, work, tokenizer=tokenizer,
                                                                      engine_url=engine.url))
                        n_turns = sum(r["turns"] for r in results[way])
                        figures[way].append((1e3 * cpu / n_turns, n_turns / wall))
                        print(f"{name} {turns} turns {way}: {1e3 * cpu / n_turns:.2f} ms CPU a turn, "
                              f"{n_turns / wall:,.0f} turns/s", flush=True)
                    if "direct" in results:
                        for way in results:
                            if way != "direct":
                                check_same_tokens(results["direct"], results[way], way)
                some = results.get("endpoint") or next(iter(results.values()))
                lengths[(name, turns)] = statistics.mean(len(r["token_ids"]) for r in some)
                base = statistics.median(f[0] for f in figures["direct"]) if "direct" in figures else None
                for way, runs in figures.items():
                    cpu = statistics.median(r[0] for r in runs)
                    extra = "" if base is None or way == "direct" else f"{cpu - base:+.2f}"
                    rows.append(f"| {name} | {turns} | {lengths[(name, turns)]:,.0f} | {way} | {cpu:.2f} | {extra} "
                                f"| {statistics.median(r[1] for r in runs):,.0f} |")
                if args.profile:
                    profile = cProfile.Profile()
                    asyncio.run(run_way("endpoint", work, tokenizer=tokenizer, engine_url=engine.url, profile=profile))
                    profiles.append((f"{name}, {turns} turns", profile_parts(profile, args.sessions * turns)))
                    pstats.Stats(profile).sort_stats("tottime").print_stats(25)
        finally:
            engine.close()
    head = "| tokenizer | turns | trained tokens a session | way | CPU ms per turn | over direct (ms) | turns/s |"
    table = "\n".join([head, "|---|---|---|---|---|---|---|", *rows])
    print(table)
    lines = profile_table(profiles) if profiles else []
    print("\n".join(lines))
    client_ms = openai_client_ms() if "http (openai)" in args.ways else None
    if client_ms is not None:
        print(f"one openai.AsyncOpenAI: {client_ms:.1f} ms CPU")
    if args.no_write:
        return
    write_section("Session endpoint: CPU per turn", section(args, tokenizers, load=load, table=table, profile_lines=lines,
                                                           client_ms=client_ms))


if __name__ == "__main__":
    main()
