"""Engine answers, fuzzed (hypothesis): the real `EngineClient` over real HTTP to an aiohttp server
on 127.0.0.1 that answers `/generate` and `/model_info` with drawn bodies — SGLang's answer with a
field of the wrong JSON type at any level, keys missing, ids and logprobs of different lengths,
logprobs NaN, infinite or strings, token ids negative, floats, huge or strings, odd finish reasons
and weight versions; JSON cut anywhere, bytes that are no JSON, JSON nested too deep; under HTTP
200, 4xx and 5xx; a body cut mid-way (the server closes the connection) and a server that never
answers. Every call returns a well-formed result (ids ints >= 0, as many finite float logprobs,
an integer version) or raises `EngineError` with the cause the failure calls for — no other
exception, no hang past the timeout — and a session whose engine answers garbage ends as the
`engine_error` infra failure (masked, never a reward). Case counts: `fuzz(n)`, docs/reliability.md.
"""

from __future__ import annotations

import asyncio
import json
import math
import typing
from dataclasses import dataclass

import pytest
from aiohttp import web
from hypothesis import event, given
from hypothesis import strategies as st

from rl360cli.agent.config import RolloutConfig
from rl360cli.agent.session import SessionSpec
from rl360cli.inference.client import Cause, EngineClient, EngineError, GenerateResult
from rl360cli.outcome import InfraCause, Outcome
from rl360cli.sandbox.task_loader import load_task
from tests.agent.sessions import builtin_session
from tests.agent.test_conversation import CHATML, byte_tokenizer
from tests.fuzz.test_fuzz_tasks import fuzz
from tests.sandbox.conftest import bwrap, process_config, process_provider, sandbox_root  # noqa: F401 (fixtures)
from tests.sandbox.conftest import write_task

CAUSES = set(typing.get_args(Cause))
HANG_TIMEOUT_S = 0.3  # the client's, against a server that never answers: the call must end about then
TIMEOUT_S = 10.0  # the client's otherwise: far from what a loaded CI machine could need to answer


@dataclass(frozen=True)
class Reply:
    """What the server answers the next request with."""

    status: int = 200
    body: bytes = b""
    content_type: str = "application/json"
    cut_at: int | None = None  # announce the whole body, send this many bytes of it, close the connection
    hang: bool = False  # then say nothing more (until the test ends): before the headers, or after `cut_at` bytes


class FuzzedEngine:
    """A real HTTP server answering every `/generate` and `/model_info` with `reply`; `/health` is 200
    (the client asks it after a cut, to tell a dead server from a request lost behind a live one)."""

    def __init__(self, reply: Reply):
        self.reply = reply
        self.released = asyncio.Event()
        self.requests = 0

    async def answer(self, request: web.Request) -> web.StreamResponse:
        self.requests += 1
        reply = self.reply
        if reply.hang and reply.cut_at is None:
            await self.released.wait()
        headers = {"Content-Type": reply.content_type}
        if reply.cut_at is None:
            return web.Response(status=reply.status, body=reply.body, headers=headers)
        response = web.StreamResponse(status=reply.status, headers=headers)
        response.content_length = len(reply.body)
        await response.prepare(request)
        await response.write(reply.body[:reply.cut_at])
        if reply.hang:
            await self.released.wait()
        request.transport.close()
        return response

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({})


def ask(reply: Reply, call: str = "generate", *, timeout_s: float = TIMEOUT_S):
    """The client's result for one call against a server answering `reply`, or the EngineError it raised."""

    async def go():
        engine = FuzzedEngine(reply)
        app = web.Application()
        app.router.add_post("/generate", engine.answer)
        app.router.add_get("/model_info", engine.answer)
        app.router.add_get("/health", engine.health)
        runner = web.AppRunner(app, shutdown_timeout=0.1, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        try:
            async with EngineClient(f"http://127.0.0.1:{port}", timeout_s=timeout_s, retry_backoff_s=0.001,
                                    reconnect_wait_s=0.5) as client:
                try:
                    if call == "generate":
                        return await client.generate([1, 2, 3], {"max_new_tokens": 8})
                    return await client.weight_version()
                except EngineError as e:
                    return e
        finally:
            engine.released.set()
            await runner.cleanup()

    # The call ends by its own timeout; this outer one only turns a hang into a failure, not a stuck suite.
    return asyncio.run(asyncio.wait_for(go(), timeout=2 * timeout_s + 5))


def assert_well_formed(result: GenerateResult) -> None:
    assert all(type(t) is int and t >= 0 for t in result.output_ids), result.output_ids
    assert len(result.logprobs) == len(result.output_ids)
    assert all(type(lp) is float and math.isfinite(lp) for lp in result.logprobs), result.logprobs
    assert type(result.weight_version) is int and result.weight_version >= 0
    assert result.finish_reason in ("stop", "length") and isinstance(result.text, str)
    assert type(result.prompt_tokens) is int and result.prompt_tokens >= 0


def assert_engine_error(outcome, cause: str | set[str]) -> EngineError:
    assert isinstance(outcome, EngineError), outcome
    assert outcome.cause in CAUSES and "\n" not in str(outcome), outcome
    assert outcome.cause in ({cause} if isinstance(cause, str) else cause), (outcome.cause, str(outcome))
    return outcome


# ----------------------------------------------------------------------------- SGLang's answer, then broken

@st.composite
def sglang_answers(draw) -> dict:
    """A well-formed /generate answer, as SGLang 0.5 gives it (see rl360cli/inference/protocol.py)."""
    ids = draw(st.lists(st.integers(0, 151_935), max_size=6))
    logprobs = draw(st.lists(st.floats(-30.0, 0.0), min_size=len(ids), max_size=len(ids)))
    finish = draw(st.sampled_from([{"type": "stop", "matched": 151_645}, {"type": "stop", "matched": "</s>"},
                                   {"type": "stop", "matched": None}, {"type": "length", "length": len(ids)}]))
    return {"text": draw(st.text(max_size=8)), "output_ids": ids, "meta_info": {
        "id": "r", "finish_reason": finish, "prompt_tokens": 3, "completion_tokens": len(ids), "cached_tokens": 0,
        "weight_version": str(draw(st.integers(0, 10**6))), "e2e_latency": 0.01,
        "output_token_logprobs": [[lp, t, None] for lp, t in zip(logprobs, ids)], "input_token_logprobs": []}}


JUNK = st.sampled_from([None, True, False, -1, 1.5, 2**31, 10**30, float("nan"), float("inf"), -float("inf"),
                        "", "7", "nan", "x" * 50, [], [1], {}, {"type": "stop"}, [[[]]], {"a": {"b": [None]}}])
BAD_IDS = st.sampled_from([-1, -2**40, 1.5, 3.0, 2**31, 10**30, "5", None, True, [1], {}, float("nan")])
BAD_LOGPROBS = st.sampled_from([float("nan"), float("inf"), -float("inf"), "-0.5", "nan", None, True, [0.1], {},
                                10**400])
BAD_ENTRIES = st.sampled_from([[], "x", None, 3, {"0": -0.5}, [None, 5, None], ["-1", 5, None]])
BAD_REASONS = st.sampled_from([None, "stop", ["stop"], {}, {"type": None}, {"type": "eos"}, {"type": ["stop"]},
                               5, {"type": "STOP"}])
BAD_MATCHED = st.sampled_from([1.5, -1, [], {}, True])
BAD_VERSIONS = st.sampled_from(["1.5", "-1", "v1", None, 1.5, -1, True, [], "", " 7", "\u0667", "9" * 30,
                                float("inf"), {"v": 1}, 10**400])


@st.composite
def broken(draw, answer: dict, *, harmless: bool = False) -> tuple[str, bool]:
    """Changes `answer` in place one way: returns (what was done, whether a correct client must refuse it)."""
    meta = answer["meta_info"]
    ids, entries = answer["output_ids"], meta["output_token_logprobs"]
    ways = ["id", "logprob", "harmless", "entry", "shorter", "longer", "reason", "version", "harmless", "level",
            "missing", "matched", "text", "prompt_tokens"]
    way = "harmless" if harmless else draw(st.sampled_from(ways))
    if way in ("id", "logprob", "entry", "shorter") and not ids:
        way = "longer"
    if way == "id":
        ids[draw(st.integers(0, len(ids) - 1))] = draw(BAD_IDS)
    elif way == "logprob":
        entries[draw(st.integers(0, len(ids) - 1))][0] = draw(BAD_LOGPROBS)
    elif way == "entry":
        entries[draw(st.integers(0, len(ids) - 1))] = draw(BAD_ENTRIES)
    elif way == "shorter":
        entries.pop()
    elif way == "longer":
        entries.append([-0.5, 7, None])
    elif way == "reason":
        meta["finish_reason"] = draw(BAD_REASONS)
    elif way == "matched":
        meta["finish_reason"] = {"type": "stop", "matched": draw(BAD_MATCHED)}
    elif way == "version":
        meta["weight_version"] = draw(BAD_VERSIONS)
    elif way == "level":  # a whole level of the wrong JSON type
        where = draw(st.sampled_from(["output_ids", "meta_info", "output_token_logprobs"]))
        (meta if where == "output_token_logprobs" else answer)[where] = draw(
            st.sampled_from([None, "x", 5, {}, {"0": 1}] + ([[1]] if where == "meta_info" else [])))
    elif way == "missing":
        key = draw(st.sampled_from(["output_ids", "meta_info", "finish_reason", "output_token_logprobs",
                                    "weight_version"]))
        (answer if key in ("output_ids", "meta_info") else meta).pop(key)
    elif way == "text":
        answer["text"] = draw(st.sampled_from([None, 5, ["a"], {"t": "a"}]))
    elif way == "prompt_tokens":
        meta["prompt_tokens"] = draw(st.sampled_from([-1, "3", 1.5, None, True]))
    else:  # what a correct client takes: unknown keys, a stop string, a version as an int, defaults
        change = draw(st.sampled_from(["extra", "matched-str", "version-int", "no-text", "no-prompt-tokens"]))
        if change == "extra":
            answer["routed_experts"] = meta["spec_verify_ct"] = [None, {"x": 1}]
        elif change == "matched-str":
            meta["finish_reason"] = {"type": "stop", "matched": "<|im_end|>"}
        elif change == "version-int":
            meta["weight_version"] = 42
        elif change == "no-text":
            answer.pop("text", None)
        else:
            meta.pop("prompt_tokens", None)
        return change, False
    return way, True


HTTP_STATUSES = [400, 401, 403, 404, 413, 422, 429, 500, 502, 503, 504]
# Hypothesis leans to the first choices: what most cases should be comes first and more than once.
SHAPES = ["broken"] * 5 + ["broken-after-harmless", "intact", "truncated", "not-json", "deep", "wrong-top", "abort"]


def drawn_body(data) -> tuple[str, str, bool, dict, bytes]:
    """(shape, how it was broken, whether a correct client must refuse it as 200 JSON, the answer) -> body."""
    answer = data.draw(sglang_answers())
    shape = data.draw(st.sampled_from(SHAPES))
    way, refuse = shape, shape not in ("intact", "abort")
    if shape == "broken-after-harmless":  # a change a client takes does not hide one it must refuse
        data.draw(broken(answer, harmless=True))
    if shape.startswith("broken"):
        way, refuse = data.draw(broken(answer))
    body = json.dumps(answer).encode()  # NaN and infinity go out as JSON's NaN / Infinity literals
    if shape == "truncated":
        body = body[:data.draw(st.integers(0, len(body) - 1))]  # any cut of an object is no JSON
    elif shape == "not-json":
        body = data.draw(st.sampled_from([b"", b"<html>502 Bad Gateway</html>", b"\xff\xfe\x00", b"null null",
                                          b"{'single': 'quotes'}", b"Internal Server Error"]) | st.binary(max_size=20))
    elif shape == "deep":
        body = b"[" * data.draw(st.sampled_from([10_000, 100_000]))
    elif shape == "wrong-top":
        body = json.dumps(data.draw(JUNK | st.lists(JUNK, max_size=3))).encode()
    elif shape == "abort":
        answer["meta_info"]["finish_reason"] = {"type": "abort", "message": data.draw(st.text(max_size=20)),
                                                "status_code": None, "err_type": None}
        body = json.dumps(answer).encode()
    return shape, way, refuse, answer, body


@fuzz(250)
@given(data=st.data())
def test_any_generate_answer_is_a_well_formed_result_or_an_engine_error(data):
    shape, way, refuse, answer, body = drawn_body(data)
    outcome = ask(Reply(body=body))
    event(f"{way}: {outcome.cause if isinstance(outcome, EngineError) else 'result'}")  # --hypothesis-show-statistics
    if shape == "abort":
        assert_engine_error(outcome, "aborted")
    elif refuse:
        assert_engine_error(outcome, "protocol")
    else:
        assert isinstance(outcome, GenerateResult), outcome
        assert_well_formed(outcome)
        assert outcome.output_ids == answer["output_ids"] and outcome.text == answer.get("text", "")
        assert outcome.logprobs == [e[0] for e in answer["meta_info"]["output_token_logprobs"]]
        assert outcome.weight_version == int(answer["meta_info"]["weight_version"])


@fuzz(60)
@given(data=st.data(), status=st.sampled_from([200, *HTTP_STATUSES]),
       content_type=st.sampled_from(["text/plain", "text/html", "application/json"]))
def test_an_error_status_or_an_answer_that_is_no_json_is_an_engine_error_of_its_cause(data, status, content_type):
    _, _, _, _, body = drawn_body(data)
    if status == 200 and content_type == "application/json":
        content_type = "text/plain"  # the client reads a text answer as {"text": ...}: no /generate answer
    outcome = ask(Reply(status=status, body=body, content_type=content_type))
    cause = ("protocol" if status == 200 else "unavailable" if status in (429, 503)
             else "rejected" if status < 500 else "http")
    event(f"status {status}")
    assert assert_engine_error(outcome, cause).status == (None if status == 200 else status)
    if status in (429, 503):
        assert "answered" in str(outcome)  # sent again (with backoff) first; the last answer is the error


# ----------------------------------------------------------------------------- /model_info, cuts, silence

@fuzz(80)
@given(value=BAD_VERSIONS | JUNK | st.integers(0, 10**12) | st.integers(0, 10**12).map(str),
       wrapped=st.sampled_from(["field", "field", "top", "missing"]), status=st.sampled_from([200] * 3 + [500, 404]))
def test_any_model_info_answer_is_an_integer_version_or_an_engine_error(value, wrapped, status):
    document = {"field": {"model_path": "m", "weight_version": value}, "top": value, "missing": {"model_path": "m"}}
    outcome = ask(Reply(status=status, body=json.dumps(document[wrapped]).encode()), call="weight_version")
    if status != 200:
        assert_engine_error(outcome, "rejected" if status < 500 else "http")
    elif wrapped == "field" and ((type(value) is int and value >= 0) or (isinstance(value, str) and value.isascii()
                                                        and value.isdigit() and len(value) <= 18)):
        assert outcome == int(value)
    else:
        assert_engine_error(outcome, "protocol")


@fuzz(20)
@given(answer=sglang_answers(), fraction=st.floats(0.0, 0.99), status=st.sampled_from([200, 200, 500]))
def test_a_body_cut_mid_way_is_a_disconnected_engine_error(answer, fraction, status):
    body = json.dumps(answer).encode()
    outcome = ask(Reply(status=status, body=body, cut_at=int(len(body) * fraction)))
    # The server still listens (its /health answers): what was cut was this request, not the server.
    assert_engine_error(outcome, "disconnected")


@fuzz(4)
@given(call=st.sampled_from(["generate", "weight_version"]), stalls_mid_body=st.booleans())
def test_a_server_that_never_answers_ends_at_the_timeout(call, stalls_mid_body):
    body = b'{"output_ids": [1, 2], "meta_info": {}}'
    outcome = ask(Reply(hang=True, body=body, cut_at=12 if stalls_mid_body else None), call=call,
                  timeout_s=HANG_TIMEOUT_S)
    assert_engine_error(outcome, "timeout")
    assert f"timed out after {HANG_TIMEOUT_S:g}s" in str(outcome)


# ----------------------------------------------------------------------------- through the session

def answer_bytes(*, ids: str = "[1, 2]", reason: str = '{"type": "stop"}', text: str = '"done"',
                 logprobs: str = "[[-0.5, 1, null], [-0.5, 2, null]]") -> bytes:
    """A /generate answer as raw JSON text (so NaN and other non-JSON spellings go out as written)."""
    return (f'{{"text": {text}, "output_ids": {ids}, "meta_info": {{"finish_reason": {reason}, '
            f'"weight_version": "0", "output_token_logprobs": {logprobs}}}}}').encode()


GARBAGE = {  # each once: a list to walk, not a space to sample
    "nan-logprob": Reply(body=answer_bytes(logprobs="[[NaN, 1, null], [-0.5, 2, null]]")),
    "string-logprob": Reply(body=answer_bytes(logprobs='[["-0.5", 1, null], [-0.5, 2, null]]')),
    "negative-id": Reply(body=answer_bytes(ids="[1, -2]")),
    "float-id": Reply(body=answer_bytes(ids="[1, 2.7]")),
    "reason-a-string": Reply(body=answer_bytes(reason='"stop"')),
    "fewer-logprobs": Reply(body=answer_bytes(logprobs="[[-0.5, 1, null]]")),
    "text-a-number": Reply(body=answer_bytes(text="5")),
    "truncated": Reply(body=answer_bytes()[:40]),
    "deep": Reply(body=b"[" * 100_000),
    "502": Reply(status=502, body=b"<html>Bad Gateway</html>", content_type="text/html"),
    "cut": Reply(body=answer_bytes(), cut_at=10),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("garbage", [*GARBAGE, "well-formed"])
def test_a_session_whose_engine_answers_garbage_ends_as_engine_error(process_provider, tmp_path, garbage):
    """The real session, process sandbox (bubblewrap) and client: the attempt is the masked
    `engine_error` infra failure, its detail one line naming the engine, and no sandbox is left
    (the fixture checks). The well-formed answer is the control: the same session takes its turn."""
    provider = process_provider()
    task = load_task(write_task(tmp_path, "t"))
    tokenizer = byte_tokenizer(CHATML)
    spec = SessionSpec(task_id="t", group_id="g", sample_index=0, attempt_id="fuzz-0")

    async def session(client: EngineClient):
        try:
            [trajectory] = await builtin_session(
                spec, task, tokenizer=tokenizer, client=client, provider=provider,
                rollout=RolloutConfig(max_turns=1, generate_timeout_s=TIMEOUT_S), exec_timeout_s=30)
            return trajectory
        finally:
            await provider.close()

    trajectory = serve_session(GARBAGE.get(garbage, Reply(body=answer_bytes())), session)
    if garbage == "well-formed":
        assert trajectory.cause != InfraCause.ENGINE_ERROR and trajectory.versions == (0,)
        assert trajectory.logprobs[-2:].tolist() == [-0.5, -0.5]
        return
    assert trajectory.outcome == Outcome.INFRA_FAILURE and trajectory.cause == InfraCause.ENGINE_ERROR
    assert not trajectory.is_valid  # out of the group statistics and the loss: its 0.0 is no reward
    assert float(trajectory.loss_mask.sum()) == 0.0 and trajectory.versions == ()  # no turn was taken
    detail = trajectory.metadata["detail"]
    assert "127.0.0.1" in detail and "\n" not in detail, detail


def serve_session(reply: Reply, session):
    """`session(client)` against a server answering `reply` (the same server `ask` uses)."""

    async def go():
        engine = FuzzedEngine(reply)
        app = web.Application()
        app.router.add_post("/generate", engine.answer)
        app.router.add_get("/health", engine.health)
        runner = web.AppRunner(app, shutdown_timeout=0.1, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        try:
            async with EngineClient(f"http://127.0.0.1:{port}", retry_backoff_s=0.001, reconnect_wait_s=0.5) as c:
                return await session(c)
        finally:
            await runner.cleanup()

    return asyncio.run(go())
