"""SGLang's request shapes as the local engine parses them (no torch, no server)."""

from __future__ import annotations

import pytest

from rl360cli.inference.protocol import (
    InitWeightsUpdateGroup,
    ProtocolError,
    SamplingParams,
    UpdateWeightsFromDistributed,
    parse_generate,
    parse_pause_mode,
)


def test_single_prompt_of_token_ids_with_sglang_defaults():
    items, batch = parse_generate({"input_ids": [3, 4, 5], "return_logprob": True})
    assert not batch and len(items) == 1
    item = items[0]
    assert item.input_ids == (3, 4, 5) and item.text is None and item.return_logprob
    # SGLang's SamplingParams defaults.
    assert item.params == SamplingParams(max_new_tokens=128, temperature=1.0, top_p=1.0, top_k=-1)
    assert item.rid and item.logprob_start_len == -1


def test_batch_of_texts_takes_per_prompt_sampling_params_and_rids():
    items, batch = parse_generate({
        "text": ["a", "b"],
        "sampling_params": [{"temperature": 0}, {"max_new_tokens": 3, "stop": "x"}],
        "rid": ["r1", "r2"],
    })
    assert batch and [i.text for i in items] == ["a", "b"] and [i.rid for i in items] == ["r1", "r2"]
    assert items[0].params.greedy and not items[1].params.greedy
    assert items[1].params.stop == ("x",) and items[1].params.max_new_tokens == 3


def test_one_sampling_params_object_applies_to_every_prompt_of_a_batch():
    items, _ = parse_generate({"input_ids": [[1], [2, 3]], "sampling_params": {"top_k": 5}})
    assert [i.params.top_k for i in items] == [5, 5]


@pytest.mark.parametrize("body, needle", [
    ({"text": "a", "input_ids": [1]}, "exactly one"),
    ({"sampling_params": {}}, "exactly one"),
    ({"input_ids": []}, "non-empty"),
    ({"input_ids": [1, -2]}, "token ids"),
    ({"input_ids": [1], "stream": True}, "stream"),
    ({"input_ids": [1], "surprise": 1}, "surprise"),
    ({"input_ids": [1], "sampling_params": {"frequency_penalty": 0.5}}, "not supported"),
    ({"input_ids": [1], "sampling_params": {"tempreature": 0.5}}, "unknown sampling parameter"),
    ({"input_ids": [1], "sampling_params": {"top_p": 0}}, "top_p"),
    ({"input_ids": [1], "sampling_params": {"temperature": -1}}, "temperature"),
    ({"input_ids": [1], "sampling_params": {"max_new_tokens": 2.5}}, "integer"),
    ({"input_ids": [[1], [2]], "rid": "one"}, "rid"),
])
def test_bad_requests_are_refused_with_a_reason(body, needle):
    with pytest.raises(ProtocolError, match=needle):
        parse_generate(body)


def test_neutral_values_of_unsupported_params_and_router_fields_are_accepted():
    # sglang-router adds model/no_logs/return_bytes/return_entropy to every request it forwards.
    items, _ = parse_generate({"input_ids": [1], "model": None, "no_logs": False, "return_bytes": False,
                               "return_entropy": False, "log_metrics": True,
                               "sampling_params": {"frequency_penalty": 0.0, "repetition_penalty": 1.0, "n": 1}})
    assert items[0].params == SamplingParams()


def test_sampling_params_survive_the_client_round_trip():
    params = SamplingParams(temperature=0.7, top_p=0.9, top_k=20, max_new_tokens=5, stop=("\n\n",),
                            stop_token_ids=(7,), sampling_seed=3)
    wire = params.to_json()
    assert wire["stop"] == ["\n\n"] and "min_p" not in wire  # only what differs from the defaults
    assert SamplingParams.from_json(wire) == params
    assert SamplingParams.from_json({"top_k": 0}).top_k == -1  # SGLang treats 0 as "no cut" too


def test_weight_update_bodies_follow_sglang():
    req = UpdateWeightsFromDistributed.from_json({"names": ["a", "b"], "dtypes": ["torch.float32", "bfloat16"],
                                                  "shapes": [[2, 3], [4]], "weight_version": 7})
    assert req.dtypes == ("float32", "bfloat16") and req.shapes == ((2, 3), (4,))
    assert req.weight_version == "7" and req.flush_cache and req.group_name == "weight_update_group"
    with pytest.raises(ProtocolError, match="differ in length"):
        UpdateWeightsFromDistributed.from_json({"names": ["a"], "dtypes": [], "shapes": [[1]]})
    init = InitWeightsUpdateGroup.from_json({"master_address": "127.0.0.1", "master_port": 29500,
                                             "rank_offset": 1, "world_size": 3, "backend": "gloo"})
    assert init.group_name == "weight_update_group" and init.backend == "gloo"
    with pytest.raises(ProtocolError, match="rank_offset"):
        InitWeightsUpdateGroup.from_json({"master_address": "x", "master_port": 1, "rank_offset": 0,
                                          "world_size": 2})


def test_pause_modes():
    assert parse_pause_mode(None) == "abort"
    assert parse_pause_mode({"mode": "retract"}) == "retract"
    with pytest.raises(ProtocolError, match="Invalid mode"):
        parse_pause_mode({"mode": "nap"})
