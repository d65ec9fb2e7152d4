"""`[trainer.lora]`: the torch trainer trains a LoRA adapter on frozen weights, and the weight sync sends the
targeted weights with the adapter merged in; a real engine server that loads them serves the trainer's policy.

On local-smoke's policy v0 (2 layers, 128 wide): the engine samples a GRPO batch at temperature 1, the trainer
takes one LoRA step on it (rank 4 on q_proj and v_proj), the broadcaster sends the merged weights over gloo,
and the engine's logprobs of a sequence then equal the trainer's (float32, 1e-4) and differ from policy v0's.
"""

from __future__ import annotations

import json
import re
import urllib.request

import numpy as np
import pytest
import torch

from rl360cli.config import load_recipe
from rl360cli.configload import ConfigError, parse_override
from rl360cli.errors import Rl360Error
from rl360cli.outcome import Outcome
from rl360cli.rl.batch import build_batch
from rl360cli.rl.config import GRPOConfig
from rl360cli.rl.trajectory import Trajectory
from rl360cli.trainer.broadcast import WeightBroadcaster
from rl360cli.trainer.config import LoraConfig, TrainerConfig
from rl360cli.trainer.lora import check_targets_of_folder
from rl360cli.trainer.torch_trainer import TorchTrainer
from tests.conftest import REPO
from tests.inference.conftest import EngineFactory, free_port
from tests.loop.conftest import LOCAL_SMOKE_V0

LORA = LoraConfig(rank=4, alpha=8.0, target_modules=("q_proj", "v_proj"))
PROMPTS = [[5, 6, 7], [9, 10, 11, 12], [20, 21], [30, 31, 32]]


def generate(url: str, body: dict) -> list[dict]:
    request = urllib.request.Request(url + "/generate", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as reply:
        answer = json.load(reply)
    return answer if isinstance(answer, list) else [answer]


def engine_logprobs(url: str, sequence: list[int]) -> tuple[torch.Tensor, int]:
    """The engine's log pi(token t+1 | tokens <= t) of `sequence` (prompt logprobs, temperature 1), its version."""
    answer = generate(url, {"input_ids": sequence, "return_logprob": True, "logprob_start_len": 0,
                            "sampling_params": {"temperature": 0, "max_new_tokens": 1}})[0]
    logprobs = [entry[0] for entry in answer["meta_info"]["input_token_logprobs"][1:]]
    return torch.tensor(logprobs), int(answer["meta_info"]["weight_version"])


def trainer_logprobs(trainer: TorchTrainer, sequence: list[int]) -> torch.Tensor:
    ids = torch.tensor([sequence])
    with torch.no_grad():
        return trainer.logprobs(ids, torch.ones_like(ids))[0]


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    factory = EngineFactory(tmp_path_factory.mktemp("lora-engine"))
    yield factory(LOCAL_SMOKE_V0)[0].url
    factory.stop_all()


def sampled_batch(url: str):
    """Four groups of four samples the engine drew at temperature 1, rewarded by their length's parity."""
    trajectories = []
    for g, prompt in enumerate(PROMPTS):
        for i in range(4):
            answer = generate(url, {"input_ids": prompt, "return_logprob": True, "sampling_params": {
                "temperature": 1.0, "max_new_tokens": 12, "sampling_seed": 10 * g + i}})[0]
            output = answer["output_ids"]
            logprobs = [entry[0] for entry in answer["meta_info"]["output_token_logprobs"]]
            trajectories.append(Trajectory(
                task_id=f"t{g}", group_id=f"g{g}", sample_index=i,
                token_ids=np.array(prompt + output, dtype=np.int32),
                loss_mask=np.array([0] * len(prompt) + [1] * len(output), dtype=np.uint8),
                logprobs=np.array([0.0] * len(prompt) + logprobs, dtype=np.float32), versions=(0,),
                num_prompt_tokens=len(prompt), reward=float(i % 2), outcome=Outcome.OK))
    batch, _ = build_batch(trajectories, **GRPOConfig().batch_kwargs())
    return batch, [t.token_ids.tolist() for t in trajectories]


def test_a_lora_step_and_sync_leave_the_engine_serving_the_trainers_policy(engine):
    batch, sequences = sampled_batch(engine)
    trainer = TorchTrainer(LOCAL_SMOKE_V0, TrainerConfig(lr=1e-3, lora=LORA), GRPOConfig())
    params = dict(trainer.model.named_parameters())
    adapter = {n for n, p in params.items() if p.requires_grad}
    assert adapter and all(".lora_A." in n or ".lora_B." in n for n in adapter)
    before = {n: p.detach().clone() for n, p in params.items()}
    # The optimizer holds the adapter alone.
    assert {id(p) for group in trainer.optimizer.param_groups for p in group["params"]} == {id(params[n]) for n in adapter}
    sequence = sequences[0]
    v0 = trainer_logprobs(trainer, sequence)
    assert torch.allclose(v0, engine_logprobs(engine, sequence)[0], atol=1e-4, rtol=0)  # B = 0: policy v0

    trainer.train_step(batch)
    assert trainer.version == 1
    # B moved and nothing but the adapter did. A did not yet: its gradient goes through B, zero at the start.
    for name, param in trainer.model.named_parameters():
        assert torch.equal(before[name], param.detach()) == ("lora_B" not in name), name
    named = list(trainer.named_tensors())
    targeted = [n for n, _ in named]
    assert targeted == [f"model.layers.{i}.self_attn.{m}.weight" for i in range(2) for m in ("q_proj", "v_proj")]

    with WeightBroadcaster([engine], master_port=free_port(), timeout_s=60) as sync:
        sync.connect()
        stats = sync.broadcast(named, trainer.version)
    full = sum(p.numel() * p.element_size() for n, p in before.items() if n not in adapter)  # a full sync's
    assert stats.failed == {} and stats.bytes == 4 * 128 * 128 * 4  # four 128 x 128 float32 weights
    assert stats.bytes < full / 5

    mine = trainer_logprobs(trainer, sequence)
    theirs, version = engine_logprobs(engine, sequence)
    assert version == 1
    assert torch.allclose(mine, theirs, atol=1e-4, rtol=0), (mine - theirs).abs().max()
    assert (mine - v0).abs().max() > 1e-3  # the step changed the policy the engine now serves


def test_a_lora_checkpoint_holds_the_adapter_and_its_optimizer_and_resumes_exactly(tmp_path, engine):
    batch, _ = sampled_batch(engine)
    trainer = TorchTrainer(LOCAL_SMOKE_V0, TrainerConfig(lr=1e-3, lora=LORA), GRPOConfig(), seed=3)
    trainer.train_step(batch)
    trainer.save_checkpoint(tmp_path / "step_1", {"next_step": 1})
    assert sorted(p.name for p in (tmp_path / "step_1" / "adapter").iterdir()) == [
        "adapter_config.json", "adapter_model.safetensors"]
    assert not (tmp_path / "step_1" / "model").exists()

    resumed = TorchTrainer(LOCAL_SMOKE_V0, TrainerConfig(lr=1e-3, lora=LORA), GRPOConfig(), seed=4)  # another A
    assert resumed.load_checkpoint(tmp_path / "step_1") == {"next_step": 1, "version": 1}
    assert resumed.version == 1
    for (name, mine), (_, theirs) in zip(trainer.named_tensors(), resumed.named_tensors(), strict=True):
        assert torch.equal(mine, theirs), name
    # The same next step from both: the adapter and AdamW's moments came back. (B is not zero now: A moves too.)
    a_before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_A" in n}
    trainer.train_step(batch)
    resumed.train_step(batch)
    assert all(not torch.equal(a, dict(trainer.model.named_parameters())[n]) for n, a in a_before.items())
    for (name, mine), (_, theirs) in zip(trainer.named_tensors(), resumed.named_tensors(), strict=True):
        assert torch.allclose(mine, theirs, atol=1e-6), name

    other = TorchTrainer(LOCAL_SMOKE_V0, TrainerConfig(lora=LoraConfig(rank=8, alpha=8.0, target_modules=("q_proj",))),
                         GRPOConfig())
    with pytest.raises(Rl360Error, match=r"adapter is rank 4, alpha 8 on q_proj, v_proj; \[trainer.lora\] asks for "
                                         r"rank 8, alpha 8 on q_proj"):
        other.load_checkpoint(tmp_path / "step_1")
    with pytest.raises(Rl360Error, match="holds a LoRA adapter; the recipe trains every weight"):
        TorchTrainer(LOCAL_SMOKE_V0, TrainerConfig(), GRPOConfig()).load_checkpoint(tmp_path / "step_1")


def test_lora_is_checked_when_the_recipe_loads():
    smoke = REPO / "recipes" / "local-smoke.toml"
    lora = parse_override('trainer.lora={rank = 8, alpha = 16, target_modules = ["q_proj", "v_proj"]}')
    assert load_recipe(smoke, overrides=[lora]).trainer.lora == LoraConfig(rank=8, alpha=16.0,
                                                                           target_modules=("q_proj", "v_proj"))
    for text, message in [("{rank = 0, alpha = 16, target_modules = ['q_proj']}", "rank must be at least 1 (got 0)"),
                          ("{rank = 8, alpha = 0, target_modules = ['q_proj']}", "alpha must be positive (got 0.0)"),
                          ("{rank = 8, alpha = 16, target_modules = []}", "target_modules must name at least one"),
                          ("{rank = 8, target_modules = ['q_proj']}", "trainer.lora.alpha: missing")]:
        with pytest.raises(ConfigError, match=re.escape(message)):
            load_recipe(smoke, overrides=[parse_override(f"trainer.lora={text}")])
    with pytest.raises(ValueError, match="lora is the torch trainer's; the megatron trainer trains every weight"):
        TrainerConfig(kind="megatron", lora=LORA)


def test_a_target_the_policy_lacks_is_refused_in_one_line_naming_what_it_has():
    with pytest.raises(Rl360Error) as e:
        check_targets_of_folder(LOCAL_SMOKE_V0, ["q_proj", "qkv_proj"])
    assert str(e.value) == (
        "[trainer.lora] target_modules: 'qkv_proj' is not a linear layer of the policy; its LlamaForCausalLM has "
        "down_proj, gate_proj, k_proj, o_proj, q_proj, up_proj, v_proj; set target_modules to some of those "
        '(e.g. ["q_proj", "v_proj"])')
    with pytest.raises(Rl360Error, match="'lm_head' cannot be adapted: lm_head shares its weight with "
                                         r"model.embed_tokens \(tied embeddings\)"):
        check_targets_of_folder(LOCAL_SMOKE_V0, ["lm_head"])
    check_targets_of_folder(LOCAL_SMOKE_V0, ["self_attn.q_proj", "mlp.down_proj"])  # a longer suffix is fine
