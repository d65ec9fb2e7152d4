"""Policy version 0: the tiny tokenizer and its chat template, prepare_policy, load_policy, the warm-up data."""

from __future__ import annotations

import json
import time

import pytest

from rl360cli.errors import Rl360Error
from rl360cli.agent.conversation import ConversationTokens, format_observation, observation_ids
from rl360cli.demo import arith
from rl360cli.trainer.config import ModelConfig
from tests.conftest import REPO

import torch

TASKS = REPO / "recipes" / "tasks" / "arith-32"
# Small enough to build in a second or two; the recipe's own model is tested in tests/demo/test_warmup.py.
SMALL = ModelConfig(kind="tiny", hidden_size=32, num_layers=1, num_heads=2, warmup_steps=3, warmup_batch_size=4)


@pytest.fixture(scope="module")
def tokenizer():
    from rl360cli.demo.tokenizer import train_tokenizer
    from rl360cli.demo.warmup import synthetic_corpus

    return train_tokenizer(synthetic_corpus(0, num_programs=300), vocab_size=400)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    from rl360cli.run.policy import prepare_policy

    out = tmp_path_factory.mktemp("policies") / "v0"
    return prepare_policy(SMALL, tasks_dir=TASKS, out_dir=out, seed=7)


def _messages(instruction: str) -> list[dict]:
    return [{"role": "user", "content": instruction},
            {"role": "assistant", "content": arith.action("x*3+1")},
            {"role": "tool", "content": format_observation(0, "")},
            {"role": "assistant", "content": arith.SUBMIT}]  # fmt: skip


def test_special_tokens_and_eos(tokenizer):
    assert tokenizer.pad_token_id == 0 and tokenizer.eos_token == "<|end|>" and tokenizer.eos_token_id == 1
    for role in ("system", "user", "assistant", "tool"):
        assert len(tokenizer.encode(f"<|{role}|>", add_special_tokens=False)) == 1
    assert tokenizer.encode("hello", add_special_tokens=False) == tokenizer.encode("hello")  # no BOS added


@pytest.mark.parametrize("text", ["x*3+1", "héllo ✓ 中文 \t\n\x00", "```bash\necho '(x-1)**2' > answer.py\n```"])
def test_every_text_round_trips(tokenizer, text):
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text


def test_the_chat_template_round_trips(tokenizer):
    messages = _messages(arith.instruction(arith.parse_program("mul 3, add 1")))
    rendered = tokenizer.apply_chat_template(messages, tokenize=False)
    assert rendered == "".join(f"<|{m['role']}|>{m['content']}<|end|>" for m in messages)
    ids = tokenizer.apply_chat_template(messages, tokenize=True)
    ids = list(ids["input_ids"]) if hasattr(ids, "keys") else list(ids)
    assert tokenizer.decode(ids) == rendered
    assert ids == tokenizer.encode(rendered, add_special_tokens=False)
    prompt = tokenizer.apply_chat_template(messages[:1], add_generation_prompt=True, tokenize=False)
    assert prompt.endswith("<|end|><|assistant|>")


def test_an_unknown_role_is_refused(tokenizer):
    with pytest.raises(Exception, match="unknown role"):
        tokenizer.apply_chat_template([{"role": "observer", "content": "x"}], tokenize=False)


def test_turn_by_turn_tokens_equal_the_rendered_conversation(tokenizer):
    """Token in, token out: built as the loop builds it, the conversation is the template's own tokens."""
    from rl360cli.demo.warmup import conversation

    instruction = arith.instruction(arith.parse_program("square, sub 2"))
    ids, mask = conversation(tokenizer, instruction, "x**2-2")
    messages = _messages(instruction)
    messages[1]["content"] = arith.action("x**2-2")
    rendered = tokenizer.apply_chat_template(messages, tokenize=False)
    assert ids == tokenizer.encode(rendered, add_special_tokens=False)
    # Loss only on the two assistant replies, each ending with EOS.
    trained = [tokenizer.decode([i]) for i, m in zip(ids, mask) if m]
    assert "".join(trained) == arith.action("x**2-2") + "<|end|>" + arith.SUBMIT + "<|end|>"
    assert observation_ids(tokenizer, "[exit code 0]")[-1] == tokenizer.convert_tokens_to_ids("<|assistant|>")


def test_an_unfinished_turn_gets_its_end_of_turn_before_the_observation(tokenizer):
    conv = ConversationTokens(tokenizer, [{"role": "user", "content": "hi"}])
    conv.add_generated([10, 11], [-0.1, -0.2], 0)
    conv.add_observation("[exit code 0]")
    assert conv.token_ids[conv.num_prompt_tokens + 2] == tokenizer.eos_token_id


def test_warmup_examples_skip_the_excluded_instructions(tokenizer):
    from rl360cli.demo.warmup import examples

    excluded = [arith.instruction(arith.random_program(__import__("random").Random("warmup-3")))]
    stream = examples(tokenizer, 3, exclude=excluded)
    prompts = {tokenizer.decode(ids[: ids.index(tokenizer.convert_tokens_to_ids("<|assistant|>"))]) for ids, _ in
               (next(stream) for _ in range(50))}  # fmt: skip
    assert not any(excluded[0].strip() in p for p in prompts)
    # Both forms of the instruction occur: with and without its final newline.
    assert any(p.endswith("\n<|end|>") for p in prompts) and any(p.endswith(".<|end|>") for p in prompts)


def test_prepare_policy_writes_a_loadable_folder(prepared):
    from rl360cli.run.policy import MARKER
    from rl360cli.trainer.model import load_policy

    names = {p.name for p in prepared.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja", "generation_config.json",
            "warmup.json", MARKER} <= names  # fmt: skip
    assert not any(p.name.startswith(".v0.staging") for p in prepared.parent.iterdir())
    config = json.loads((prepared / "config.json").read_text())
    model, tok = load_policy(prepared)
    assert config["eos_token_id"] == tok.eos_token_id == 1 and config["vocab_size"] == len(tok)
    assert model.config.hidden_size == 32 and model.config.num_hidden_layers == 1
    report = json.loads((prepared / "warmup.json").read_text())
    assert report["num_steps"] == 3 and len(report["losses"]) == 1


def test_forward_logprobs_are_finite_and_normalised(prepared):
    from rl360cli.trainer.model import load_policy

    model, tok = load_policy(prepared)
    ids = tok.apply_chat_template([{"role": "user", "content": arith.instruction(((("add", 1),)))}],
                                  add_generation_prompt=True, tokenize=True)
    ids = torch.tensor([list(ids["input_ids"]) if hasattr(ids, "keys") else list(ids)])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits.float(), -1)
    assert torch.isfinite(logp).all()
    assert torch.allclose(logp.exp().sum(-1), torch.ones(logp.shape[:2]), atol=1e-4)


def test_prepare_policy_is_idempotent(prepared):
    from rl360cli.run.policy import MARKER, prepare_policy

    before = {p.name: p.stat().st_mtime_ns for p in prepared.iterdir()}
    started = time.perf_counter()
    again = prepare_policy(SMALL, tasks_dir=TASKS, out_dir=prepared, seed=7)
    assert again == prepared
    assert time.perf_counter() - started < 5  # not a timing goal: a rebuild would rewrite the files below
    assert {p.name: p.stat().st_mtime_ns for p in prepared.iterdir()} == before
    assert json.loads((prepared / MARKER).read_text())["recipe"]["seed"] == 7


def test_prepare_policy_refuses_a_folder_made_from_other_settings(prepared):
    from rl360cli.run.policy import prepare_policy

    with pytest.raises(Rl360Error, match="other settings"):
        prepare_policy(SMALL, tasks_dir=TASKS, out_dir=prepared, seed=8)
    with pytest.raises(Rl360Error, match="other settings"):
        prepare_policy(ModelConfig(kind="tiny", hidden_size=64, num_layers=1, num_heads=2, warmup_steps=3,
                                   warmup_batch_size=4), tasks_dir=TASKS, out_dir=prepared, seed=7)  # fmt: skip


def test_a_tiny_policy_is_deterministic_built_once_per_cache_and_linked(prepared, tmp_path, monkeypatch):
    from rl360cli.run.policy import prepare_policy

    monkeypatch.setenv("RL360_CACHE_DIR", str(tmp_path / "cache"))  # empty: built again, not linked
    first = prepare_policy(SMALL, tasks_dir=TASKS, out_dir=tmp_path / "run1" / "v0", seed=7)
    second = prepare_policy(SMALL, tasks_dir=TASKS, out_dir=tmp_path / "run2" / "v0", seed=7)
    other_seed = prepare_policy(SMALL, tasks_dir=TASKS, out_dir=tmp_path / "run3" / "v0", seed=8)
    for name in ("model.safetensors", "tokenizer.json", "config.json"):  # the same bytes as the fixture's build
        assert (first / name).read_bytes() == (prepared / name).read_bytes(), name
    assert (other_seed / "model.safetensors").read_bytes() != (first / "model.safetensors").read_bytes()
    cached = list((tmp_path / "cache" / "models").glob("tiny-*"))
    assert len(cached) == 2  # one per seed
    assert (first / "model.safetensors").stat().st_ino == (second / "model.safetensors").stat().st_ino
    assert (other_seed / "model.safetensors").stat().st_ino != (first / "model.safetensors").stat().st_ino
    assert json.loads((second / "warmup.json").read_text())["num_steps"] == SMALL.warmup_steps


def test_prepare_policy_refuses_missing_or_foreign_tasks(tmp_path):
    from rl360cli.run.policy import prepare_policy

    with pytest.raises(Rl360Error, match="does not exist"):
        prepare_policy(SMALL, tasks_dir=tmp_path / "nowhere", out_dir=tmp_path / "a", seed=0)
    foreign = tmp_path / "foreign" / "t1"
    foreign.mkdir(parents=True)
    (foreign / "instruction.md").write_text("Fix the bug in main.c\n")
    with pytest.raises(Rl360Error, match="warmup_steps = 0"):
        prepare_policy(SMALL, tasks_dir=foreign.parent, out_dir=tmp_path / "b", seed=0)
    assert not (tmp_path / "b").exists()


def test_a_huggingface_folder_is_validated_and_linked(prepared, tmp_path):
    import shutil

    from rl360cli.run.policy import prepare_policy
    from rl360cli.trainer.model import load_policy

    source = tmp_path / "saved"
    shutil.copytree(prepared, source)
    model = ModelConfig(kind="huggingface", path=str(source))
    out = prepare_policy(model, tasks_dir=TASKS, out_dir=tmp_path / "v0", seed=0)
    assert (out / "model.safetensors").read_bytes() == (source / "model.safetensors").read_bytes()
    load_policy(out)
    (source / "chat_template.jinja").unlink()
    with pytest.raises(Rl360Error, match="no chat template"):
        prepare_policy(model, tasks_dir=TASKS, out_dir=tmp_path / "v0b", seed=0)
    with pytest.raises(Rl360Error, match="does not exist"):
        prepare_policy(ModelConfig(kind="huggingface", path=str(tmp_path / "missing")), tasks_dir=TASKS,
                       out_dir=tmp_path / "v0c", seed=0)  # fmt: skip


@pytest.mark.parametrize("fields, message", [
    ({"vocab_size": 100}, "vocab_size"), ({"warmup_batch_size": 0}, "warmup_batch_size"),
    ({"warmup_lr": 0.0}, "warmup_lr"), ({"hidden_size": 30, "num_heads": 4}, "multiple"),
])  # fmt: skip
def test_model_config_rejects_bad_values(fields, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig(**fields)


def test_sampling_logprobs_match_a_full_forward_pass(prepared):
    """The in-process sampler's KV-cached, left-padded logprobs are the model's own."""
    from rl360cli.trainer.model import load_policy
    from rl360cli.demo.sampling import sample

    model, tok = load_policy(prepared)
    prompts = [[3, 40, 41, 42, 4], [3, 50, 4]]
    outs = sample(model, prompts, max_new_tokens=6, eos_token_id=tok.eos_token_id,
                  generator=torch.Generator().manual_seed(0))  # fmt: skip
    for prompt, out in zip(prompts, outs):
        assert 1 <= len(out.token_ids) <= 6 and out.finished == (out.token_ids[-1] == tok.eos_token_id)
        ids = torch.tensor([prompt + out.token_ids])
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=ids).logits.float(), -1)[0, len(prompt) - 1 : -1]
        expected = logp.gather(-1, torch.tensor(out.token_ids)[:, None])[:, 0]
        assert torch.allclose(torch.tensor(out.logprobs), expected, atol=1e-4)
