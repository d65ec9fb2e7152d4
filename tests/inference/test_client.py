"""The rollouts' client: typed results, and every failure a typed EngineError with its cause."""

from __future__ import annotations

import asyncio

import pytest

from rl360cli.inference.client import EngineClient, EngineError, GenerateResult
from rl360cli.inference.protocol import SamplingParams

from .conftest import API_KEY, free_port


@pytest.fixture
def engine(keyed_engine):
    return keyed_engine


def run(coro):
    return asyncio.run(coro)


def test_generate_returns_tokens_logprobs_and_the_policy_version(engine):
    async def go():
        async with EngineClient(engine.url, api_key=API_KEY) as client:
            await client.wait_healthy(timeout_s=30)
            return await client.generate([1, 2, 3], SamplingParams(max_new_tokens=5, ignore_eos=True))

    result = run(go())
    assert isinstance(result, GenerateResult)
    assert len(result.output_ids) == 5 == len(result.logprobs) and all(lp <= 0 for lp in result.logprobs)
    assert result.finish_reason == "length" and result.weight_version == 0 and result.prompt_tokens == 3


def test_nothing_listening_is_a_connect_error_after_limited_retries():
    async def go():
        async with EngineClient(f"http://127.0.0.1:{free_port()}", num_connect_retries=2,
                                retry_backoff_s=0.01) as client:
            assert not await client.health()
            await client.generate([1])

    with pytest.raises(EngineError) as info:
        run(go())
    assert info.value.cause == "connect" and info.value.infra_cause == "engine_error"


def test_a_refused_request_is_an_engine_error_with_its_status(engine):
    async def go():
        async with EngineClient(engine.url, api_key=API_KEY) as client:
            await client.generate([1], {"top_p": 0})

    with pytest.raises(EngineError) as info:
        run(go())
    assert info.value.cause == "rejected" and info.value.status == 400 and "top_p" in str(info.value)


def test_an_aborted_generation_is_an_engine_error(engine):
    async def go():
        async with EngineClient(engine.url, api_key=API_KEY) as client:
            task = asyncio.ensure_future(client.generate([1, 2], {"max_new_tokens": 2000, "ignore_eos": True}))
            while (await client.request("GET", "/get_load"))[0]["num_reqs"] == 0:
                await asyncio.sleep(0.01)
            await client.request("POST", "/pause_generation", {"mode": "abort"})
            await client.request("POST", "/continue_generation")
            return await task

    with pytest.raises(EngineError) as info:
        run(go())
    assert info.value.cause == "aborted"


def test_a_non_integer_weight_version_is_a_protocol_error(engine):
    async def go():
        async with EngineClient(engine.url, api_key=API_KEY) as client:
            await client.request("POST", "/update_weight_version", {"new_version": "default"})
            try:
                await client.generate([1], {"max_new_tokens": 1})
            finally:
                await client.request("POST", "/update_weight_version", {"new_version": "0"})

    with pytest.raises(EngineError) as info:
        run(go())
    assert info.value.cause == "protocol" and "--weight-version" in str(info.value)


def test_an_engine_that_dies_under_a_request_is_an_engine_error(start_engine, tiny_model):
    victim = start_engine(tiny_model)[0]

    async def go():
        # The cut is sent once more if the server is back within reconnect_wait_s (the health tests cover
        # that); this one never comes back, so a short wait keeps the test from idling for the default.
        async with EngineClient(victim.url, reconnect_wait_s=2.0) as client:
            task = asyncio.ensure_future(client.generate([1, 2], {"max_new_tokens": 5000, "ignore_eos": True}))
            while (await client.request("GET", "/get_load"))[0]["num_reqs"] == 0:
                await asyncio.sleep(0.01)
            victim.kill()
            await task

    with pytest.raises(EngineError) as info:
        run(go())
    assert info.value.cause in ("disconnected", "connect")
