"""The engine server over HTTP: SGLang's answers, API key, health while busy, pause/continue."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest


@pytest.fixture
def server(keyed_engine):
    return keyed_engine


def call(server, method, path, body=None, *, key="sekret", timeout=60):
    async def go():
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        async with aiohttp.ClientSession(headers=headers) as s:
            async with s.request(method, server.url + path, json=body,
                                 timeout=aiohttp.ClientTimeout(total=timeout)) as r:
                raw = await r.read()
                try:
                    return r.status, json.loads(raw)
                except ValueError:
                    return r.status, raw.decode()
    return asyncio.run(go())


def test_generate_answers_in_sglang_shape(server):
    status, answer = call(server, "POST", "/generate", {
        "text": "def add", "sampling_params": {"temperature": 0, "max_new_tokens": 6, "ignore_eos": True},
        "return_logprob": True})
    assert status == 200
    assert set(answer) == {"text", "output_ids", "meta_info"}
    meta = answer["meta_info"]
    assert meta["finish_reason"] == {"type": "length", "length": 6}
    assert meta["completion_tokens"] == 6 and meta["prompt_tokens"] > 0 and meta["weight_version"] == "0"
    entries = meta["output_token_logprobs"]
    assert [e[1] for e in entries] == answer["output_ids"]
    assert all(e[0] <= 0 and e[2] is None for e in entries)
    assert isinstance(answer["text"], str)


def test_batch_generate_and_prompt_logprobs(server):
    status, answers = call(server, "POST", "/generate", {
        "input_ids": [[1, 2, 3], [4, 5]], "sampling_params": {"max_new_tokens": 2},
        "return_logprob": True, "logprob_start_len": 0, "return_text_in_logprobs": True})
    assert status == 200 and len(answers) == 2
    first = answers[0]["meta_info"]["input_token_logprobs"]
    # As SGLang: the first prompt token has no logprob; every entry carries its text when asked.
    assert [e[1] for e in first] == [1, 2, 3] and first[0][0] is None and first[1][0] < 0
    assert all(isinstance(e[2], str) for e in first)


def test_api_key_guards_everything_but_health(server):
    assert call(server, "POST", "/generate", {"input_ids": [1]}, key=None)[0] == 401
    assert call(server, "POST", "/generate", {"input_ids": [1]}, key="wrong")[0] == 401
    assert call(server, "GET", "/health", key=None)[0] == 200
    status, info = call(server, "GET", "/get_model_info")
    assert status == 200 and info["is_generation"] and info["weight_version"] == "0"


def test_bad_request_is_a_400_in_sglang_error_shape(server):
    status, body = call(server, "POST", "/generate", {"input_ids": [1], "sampling_params": {"top_p": 0}})
    assert status == 400 and body["object"] == "error" and "top_p" in body["message"]
    status, body = call(server, "POST", "/generate", {"input_ids": [10 ** 6]})
    assert status == 400 and "vocabulary" in body["message"]


def test_health_answers_while_a_long_generation_runs(server):
    async def go():
        headers = {"Authorization": "Bearer sekret"}
        async with aiohttp.ClientSession(headers=headers) as s:
            long = asyncio.ensure_future(s.post(server.url + "/generate", json={
                "input_ids": [1, 2], "sampling_params": {"max_new_tokens": 900, "ignore_eos": True}}))
            while True:  # wait until it is really generating
                async with s.get(server.url + "/get_load") as r:
                    if (await r.json())[0]["num_reqs"]:
                        break
            async with s.get(server.url + "/health") as r:
                health = r.status
            busy = not long.done()
            reply = await long
            return health, busy, reply.status, len((await reply.json())["output_ids"])

    health, busy, status, n = asyncio.run(go())
    assert health == 200 and busy and status == 200 and n == 900


def test_paused_engine_queues_requests_until_continue(server):
    async def go():
        async with aiohttp.ClientSession(headers={"Authorization": "Bearer sekret"}) as s:
            async with s.post(server.url + "/pause_generation", json={"mode": "in_place"}) as r:
                paused = await r.json()
            pending = asyncio.ensure_future(s.post(server.url + "/generate", json={
                "input_ids": [3], "sampling_params": {"max_new_tokens": 4}}))
            while True:
                async with s.get(server.url + "/get_load") as r:
                    if (await r.json())[0]["num_waiting_reqs"]:
                        break
            waiting = not pending.done()
            async with s.post(server.url + "/continue_generation") as r:
                resumed = await r.json()
            reply = await pending
            return paused, waiting, resumed, reply.status

    paused, waiting, resumed, status = asyncio.run(go())
    assert paused == {"message": "Generation paused successfully.", "status": "ok"}
    assert waiting and resumed["status"] == "ok" and status == 200


def test_flush_cache_and_weight_version_endpoints(server):
    status, text = call(server, "POST", "/flush_cache")
    assert status == 200 and text.startswith("Cache flushed")
    status, body = call(server, "POST", "/update_weight_version", {"new_version": "5"})
    assert status == 200 and body["new_version"] == "5"
    # As SGLang 0.5.23: the version is in /model_info (there is no /get_weight_version).
    assert call(server, "GET", "/model_info")[1]["weight_version"] == "5"
    assert call(server, "GET", "/get_weight_version")[0] == 404
    status, answer = call(server, "POST", "/generate", {"input_ids": [1], "sampling_params": {"max_new_tokens": 1}})
    assert answer["meta_info"]["weight_version"] == "5"
    call(server, "POST", "/update_weight_version", {"new_version": "0"})


def test_a_client_that_goes_away_stops_its_generation(server):
    async def go():
        async with aiohttp.ClientSession(headers={"Authorization": "Bearer sekret"}) as s:
            async def info():
                async with s.get(server.url + "/get_server_info") as r:
                    return await r.json()

            doomed = asyncio.ensure_future(s.post(server.url + "/generate", json={
                "input_ids": [1, 2], "sampling_params": {"max_new_tokens": 900, "ignore_eos": True}},
                timeout=aiohttp.ClientTimeout(total=1.5)))
            while (await info())["internal_states"][0]["num_running_reqs"] == 0:
                await asyncio.sleep(0.01)
            # Freeze it so that it cannot finish on its own before the client gives up.
            await s.post(server.url + "/pause_generation", json={"mode": "in_place"})
            at_pause = (await info())["num_generated_tokens"]
            with pytest.raises(asyncio.TimeoutError):
                await doomed
            await s.post(server.url + "/continue_generation")
            for _ in range(100):
                state = await info()
                if state["internal_states"][0]["num_running_reqs"] == 0:
                    break
                await asyncio.sleep(0.05)
            return state["internal_states"][0]["num_running_reqs"], state["num_generated_tokens"] - at_pause

    running, generated_after_pause = asyncio.run(go())
    # Aborted while paused: it never generated again (it had ~900 tokens to go).
    assert running == 0 and generated_after_pause == 0
