"""One-machine weight hand-over (rl360cli/trainer/handoff.py) against the real local engine process: the
trainer's tensors reach the engine by reference (shared-memory files on the CPU, CUDA IPC handles on a
GPU: the same code), the engine then generates exactly what the trainer's own weights generate, its
KV cache can be released and resumed around a training step, and a pickle naming anything but torch's
tensor parts is refused unread."""

from __future__ import annotations

import base64
import io
import pickle

import pytest
import torch

from rl360cli.trainer.broadcast import WeightSyncError
from rl360cli.trainer.handoff import TensorHandoff, serialize
from tests.inference.conftest import API_KEY
from tests.inference.test_weight_sync import perturb, trainer_greedy

PROMPT = [5, 9, 14, 3, 27]


@pytest.fixture(scope="module")
def keyed(module_engines, tiny_model):
    return module_engines(tiny_model, "--api-key", API_KEY)[0].url


@pytest.fixture
def policy(tiny_model):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()


def test_the_engine_serves_the_trainers_weights_after_a_hand_over(keyed, policy):
    before = greedy_with_key(keyed)
    perturb(policy, seed=7)
    sync = TensorHandoff([keyed], bucket_mb=0.05, api_key=API_KEY)  # several buckets
    sync.connect()
    stats = sync.broadcast(policy.named_parameters(), version=3)
    assert stats.version == 3 and stats.buckets > 1
    assert stats.bytes == sum(p.numel() * p.element_size() for p in policy.parameters())
    name, param = next(iter(policy.named_parameters()))
    assert torch.equal(engine_param_with_key(keyed, name), param.detach()[:4])
    after = greedy_with_key(keyed)
    assert after.weight_version == 3
    assert after.output_ids == trainer_greedy(policy, PROMPT) != before.output_ids


def test_release_and_resume_around_a_training_step(keyed, policy):
    sync = TensorHandoff([keyed], api_key=API_KEY)
    sync.broadcast(policy.named_parameters(), version=4)
    sync.release_engine_memory(weights=True)   # on a CPU engine the weights stay put; generation pauses
    sync.resume_engine_memory(weights=True)
    assert greedy_with_key(keyed).output_ids == trainer_greedy(policy, PROMPT)


def test_a_hand_over_without_the_key_is_refused(keyed, policy):
    with pytest.raises(WeightSyncError, match="401"):
        TensorHandoff([keyed]).broadcast(policy.named_parameters(), version=9)


def test_a_pickle_naming_anything_else_is_refused_unread(keyed, policy):
    class Boom:
        def __reduce__(self):
            return (print, ("this must never run in the engine",))

    buffer = io.BytesIO()
    pickle.dump([("model.embed_tokens.weight", Boom())], buffer)
    evil = base64.b64encode(buffer.getvalue()).decode()
    sync = TensorHandoff([keyed], api_key=API_KEY)
    answer = sync._post(keyed, "/update_weights_from_tensor", {"serialized_named_tensors": [evil]})
    assert answer["success"] is False and "builtins.print" in answer["message"]
    # A real payload still goes through afterwards: nothing was loaded from the refused one.
    kept = [(name, p.detach()) for name, p in list(policy.named_parameters())[:1]]
    answer = sync._post(keyed, "/update_weights_from_tensor", {"serialized_named_tensors": [serialize(kept)]})
    assert answer["success"] is True


def greedy_with_key(url):
    import asyncio

    from rl360cli.inference.client import EngineClient

    async def go():
        async with EngineClient(url, api_key=API_KEY) as client:
            return await client.generate(PROMPT, {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True})
    return asyncio.run(go())


def engine_param_with_key(url, name):
    import json
    import urllib.request

    request = urllib.request.Request(url + "/get_weights_by_name", data=json.dumps({"name": name, "truncate_size": 4})
                                     .encode(), headers={"Authorization": f"Bearer {API_KEY}"})
    with urllib.request.urlopen(request) as reply:
        return torch.tensor(json.load(reply))
