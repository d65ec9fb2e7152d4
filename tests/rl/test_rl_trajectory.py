"""Trajectory: validation, exact serialisation round trips, schema versions and compaction."""

import base64
import dataclasses

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.rl.factories import make_trajectory

from rl360cli.rl.compaction import log_cap, truncate_log
from rl360cli.outcome import InfraCause, Outcome
from rl360cli.rl.trajectory import SCHEMA_VERSION, Trajectory

FAST = settings(max_examples=60, deadline=None)


def test_lists_become_read_only_arrays():
    trajectory = Trajectory(
        task_id="t", group_id="g", sample_index=0,
        token_ids=[5, 6, 7, 8], loss_mask=[0, 0, 1, 1], logprobs=[0.0, 0.0, -0.5, -1.25],
        versions=[3], num_prompt_tokens=2, reward=1, outcome="ok",
    )  # fmt: skip
    assert trajectory.token_ids.dtype == np.int32 and trajectory.token_ids.tolist() == [5, 6, 7, 8]
    assert trajectory.loss_mask.dtype == np.uint8 and trajectory.logprobs.dtype == np.float32
    assert trajectory.outcome is Outcome.OK and trajectory.reward == 1.0 and isinstance(trajectory.reward, float)
    assert trajectory.policy_version == 3 and trajectory.is_valid
    assert trajectory.num_tokens == 4 and trajectory.num_generated_tokens == 2
    with pytest.raises(ValueError):
        trajectory.token_ids[0] = 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        trajectory.reward = 0.0


def test_policy_version_is_the_oldest_turn():
    assert make_trajectory(turns=((2, 1), (2, 1), (2, 0)), versions=(7, 5, 6)).policy_version == 5


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"loss_mask": [1, 0, 1, 1]}, "prompt"),
        ({"loss_mask": [0, 0, 2, 1]}, "only 0 and 1"),
        ({"loss_mask": [0, 0, 1]}, "one entry per token"),
        ({"logprobs": [0.0, -0.1, -0.5, -1.0]}, "0.0 where loss_mask is 0"),
        ({"logprobs": [0.0, 0.0, float("nan"), -1.0]}, "not finite"),
        ({"logprobs": [0.0, 0.0, None, -1.0]}, "not finite"),
        ({"token_ids": [5, -1, 7, 8]}, ">= 0"),
        ({"token_ids": [5, 2**40, 7, 8]}, "int32"),
        ({"num_prompt_tokens": 0}, "num_prompt_tokens"),
        ({"reward": None}, "reward is None"),
        ({"reward": float("inf")}, "finite"),
        ({"outcome": "crashed"}, "outcome must be one of"),
        ({"cause": InfraCause.OOM_NODE}, "cause must be set exactly when"),
        ({"outcome": Outcome.INFRA_FAILURE}, "cause must be set exactly when"),
        ({"versions": []}, "versions is empty"),
        ({"versions": [-1]}, "versions"),
        ({"sample_index": -2}, "sample_index"),
    ],
)
def test_invalid_trajectories_are_refused(change, message):
    fields = dict(
        task_id="t", group_id="g", sample_index=0, token_ids=[5, 6, 7, 8], loss_mask=[0, 0, 1, 1],
        logprobs=[0.0, 0.0, -0.5, -1.0], versions=[0], num_prompt_tokens=2, reward=1.0, outcome=Outcome.OK,
    )  # fmt: skip
    fields.update(change)
    with pytest.raises(ValueError, match=message):
        Trajectory(**fields)


def test_an_infra_failure_may_have_no_tokens_and_no_reward():
    failed = Trajectory(
        task_id="t", group_id="g", sample_index=1, token_ids=[], loss_mask=[], logprobs=[], versions=[],
        num_prompt_tokens=0, reward=None, outcome="infra_failure", cause="image_pull",
    )  # fmt: skip
    assert not failed.is_valid and failed.cause is InfraCause.IMAGE_PULL and failed.policy_version is None
    assert Trajectory.from_bytes(failed.to_bytes()) == failed


json_like = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False) | st.text(max_size=20)
    | st.binary(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)  # fmt: skip


@st.composite
def trajectories(draw):
    num_prompt = draw(st.integers(1, 6))
    generated = draw(st.lists(st.booleans(), max_size=40))
    mask = [0] * num_prompt + [int(g) for g in generated]
    n = len(mask)
    logprobs = [draw(st.floats(-30, 0, width=32)) if m else 0.0 for m in mask]
    cause = draw(st.none() | st.sampled_from(list(InfraCause)))
    outcome = Outcome.INFRA_FAILURE if cause else draw(st.sampled_from([Outcome.OK, Outcome.MODEL_FAILURE]))
    reward = draw(st.floats(-1e6, 1e6)) if cause is None else draw(st.none() | st.floats(-1, 1))
    return Trajectory(
        task_id=draw(st.text(max_size=10)),
        group_id=draw(st.text(max_size=10)),
        sample_index=draw(st.integers(0, 1000)),
        token_ids=draw(st.lists(st.integers(0, 2**31 - 1), min_size=n, max_size=n)),
        loss_mask=mask,
        logprobs=logprobs,
        versions=draw(st.lists(st.integers(0, 10**6), min_size=1, max_size=5)),
        num_prompt_tokens=num_prompt,
        reward=reward,
        outcome=outcome,
        cause=cause,
        timings=draw(st.dictionaries(st.text(max_size=8), st.floats(0, 1e4), max_size=4)),
        metadata=draw(st.dictionaries(st.text(max_size=8), json_like, max_size=4)),
    )


@FAST
@given(trajectories())
def test_serialisation_round_trips_exactly(trajectory):
    data = trajectory.to_bytes()
    back = Trajectory.from_bytes(data)
    assert back == trajectory
    assert back.logprobs.tobytes() == trajectory.logprobs.tobytes()
    assert back.reward == trajectory.reward and type(back.reward) is type(trajectory.reward)
    assert back.to_bytes() == data


def test_a_newer_schema_is_refused_with_the_fix():
    payload = msgpack.unpackb(make_trajectory().to_bytes(), raw=False)
    payload["schema"] = SCHEMA_VERSION + 1
    with pytest.raises(ValueError, match=f"schema {SCHEMA_VERSION + 1} is newer .* upgrade rl360"):
        Trajectory.from_bytes(msgpack.packb(payload, use_bin_type=True))


@pytest.mark.parametrize("data", [b"", b"\x93\x01\x02\x03", msgpack.packb({"task_id": "x"}), b"\xc1"])
def test_garbage_is_not_a_trajectory(data):
    with pytest.raises(ValueError, match="not a serialised trajectory"):
        Trajectory.from_bytes(data)


def test_unserialisable_metadata_is_named():
    with pytest.raises(ValueError, match="msgpack cannot store"):
        make_trajectory(metadata={"routing": np.zeros(3)}).to_bytes()


def test_repr_does_not_print_the_metadata():
    text = repr(make_trajectory(metadata={"raw_response": "x" * 10_000}))
    assert len(text) < 300 and "num_tokens=12" in text


def test_compaction_drops_provider_data_and_keeps_the_rest():
    routing = base64.b64encode(np.arange(9 * 48 * 8, dtype=np.int32).tobytes()).decode()
    metadata = {
        "turns": [
            {"finish_reason": "stop", "routed_experts": routing, "raw_response": {"choices": ["..."]}},
            {"finish_reason": "length", "routed_experts": routing, "cached_tokens": 7},
        ],
        "sandbox": {"node": "n3", "logs": {"setup": "a" * 100, "test": "ok"}, "stdout": ["b" * 50, "short"]},
        "logs": "c" * 30 + "ERROR at the end",
        "note": "d" * 100,  # not a log: kept whole
    }
    original = make_trajectory(metadata=metadata)
    # Log lengths 100, 2, 50, 5, 46 share 60 chars: 2 and 5 fit whole, the other three get 17 each.
    compacted, report = original.compact(max_log_chars=60)

    assert report.num_dropped == 3 and report.num_truncated == 3
    assert report.bytes_before == len(original.to_bytes()) and report.bytes_after == len(compacted.to_bytes())
    assert report.bytes_after < report.bytes_before and report.ratio > 1
    turns = compacted.metadata["turns"]
    assert turns == [{"finish_reason": "stop"}, {"finish_reason": "length", "cached_tokens": 7}]
    sandbox = compacted.metadata["sandbox"]
    assert sandbox["node"] == "n3" and sandbox["logs"]["test"] == "ok" and sandbox["stdout"][1] == "short"
    assert sandbox["logs"]["setup"] == truncate_log("a" * 100, 17) and sandbox["stdout"][0] == truncate_log("b" * 50, 17)
    assert compacted.metadata["logs"].endswith("the end")
    assert compacted.metadata["note"] == "d" * 100
    # Everything training and analysis use is unchanged; the original keeps its metadata.
    for name in ("task_id", "group_id", "sample_index", "versions", "num_prompt_tokens", "reward", "outcome", "timings"):
        assert getattr(compacted, name) == getattr(original, name)
    for name in ("token_ids", "loss_mask", "logprobs"):
        assert np.array_equal(getattr(compacted, name), getattr(original, name))
    assert original.metadata["turns"][0]["routed_experts"] == routing
    assert Trajectory.from_bytes(compacted.to_bytes()) == compacted


def test_truncated_log_keeps_head_and_tail():
    text = "HEAD" + "x" * 1000 + "TAIL"
    cut = truncate_log(text, 10)
    assert cut.startswith("HEADx") and cut.endswith("xTAIL") and "998 chars cut" in cut  # 1008 - 10
    assert truncate_log("short", 10) == "short"


def test_log_cap_by_hand():
    assert log_cap([10, 10, 100], 60) == 40  # 10 + 10 + 40
    assert log_cap([10, 10, 100], 120) is None
    assert log_cap([30, 30], 40) == 20


@FAST
@given(st.lists(st.integers(0, 500), max_size=12), st.integers(0, 2000))
def test_log_cap_is_the_largest_that_fits(lengths, budget):
    cap = log_cap(lengths, budget)
    if cap is None:
        assert sum(lengths) <= budget
    else:
        assert sum(min(n, cap) for n in lengths) <= budget < sum(min(n, cap + 1) for n in lengths)
