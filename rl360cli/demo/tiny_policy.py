"""The local recipe's tiny policy: a tokenizer trained on the arith task family, a small Llama from
scratch, and a supervised warm-up, written as a Hugging Face folder.

`rl360cli.run.policy.prepare_policy` calls `build` for `[model] kind = "tiny"` once per machine
for given settings, seed, task set (`tasks_digest`) and code (`code_digest`), and links the folder
into each run.

The same seed gives the same policy on every x86-64 machine. The warm-up is chaotic (one rounding
difference in one step changes the policy it ends with), and the kernels torch and MKL pick depend
on the CPU: from the same seed an AVX-512 and an AVX2 build passed 0.61 and 0.54 of the tasks. So
the build runs in a child process whose kernels are pinned (`REPRODUCIBLE_ENV`: torch's portable
kernels, MKL's conditional-numerical-reproducibility mode, one thread, no oneDNN).

    details = build(ModelConfig(kind="tiny", warmup_steps=140), tasks_dir=Path("recipes/tasks/arith-32"),
                    out=Path("/tmp/tiny"), seed=2)
    python -m rl360cli.demo.tiny_policy '{"model": {...}, "tasks_dir": ..., "out": ..., "seed": 2}'   # the child

Tests: tests/trainer/test_model.py, tests/demo/test_warmup.py.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from rl360cli.agent import conversation
from rl360cli.errors import Rl360Error
from rl360cli.demo import arith, tokenizer, warmup
from rl360cli.trainer.config import ModelConfig


# Read by torch and MKL when they load, hence set for a child process rather than in this one.
REPRODUCIBLE_ENV = {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE", "OMP_NUM_THREADS": "1",
                    "MKL_NUM_THREADS": "1"}


def build(model: ModelConfig, *, tasks_dir: Path, out: Path, seed: int) -> dict:
    """Write the tiny policy (weights, tokenizer with its chat template, warmup.json) to `out`, in a child
    process with `REPRODUCIBLE_ENV`; returns what the warm-up did."""
    instructions = instructions_of(tasks_dir)
    if model.warmup_steps and not all(text.startswith(arith.TASK_PREFIX) for text in instructions):
        raise Rl360Error(
            f"the tiny policy's warm-up knows only arith tasks, and {tasks_dir} holds others",
            fix="set [model] warmup_steps = 0, or use tasks written by recipes/tasks/generate_arith.py",
        )
    request = {"model": dataclasses.asdict(model), "tasks_dir": str(tasks_dir), "out": str(out), "seed": seed}
    child = subprocess.run([sys.executable, "-m", __name__, json.dumps(request)], capture_output=True, text=True,
                           env={**os.environ, **REPRODUCIBLE_ENV})
    if child.returncode != 0:
        raise RuntimeError(f"building the tiny policy failed (exit {child.returncode}): {child.stderr[-2000:]}")
    return json.loads(child.stdout.splitlines()[-1])


def _build_here(model: ModelConfig, *, tasks_dir: Path, out: Path, seed: int) -> dict:
    import torch

    torch.backends.mkldnn.enabled = False  # oneDNN picks its kernels by CPU too
    torch.set_num_threads(1)
    instructions = instructions_of(tasks_dir)
    tok = tokenizer.train_tokenizer([*warmup.synthetic_corpus(seed), *instructions], vocab_size=model.vocab_size)
    llama = build_tiny_model(model, tok, seed)
    report = warmup.supervised_warmup(llama, tok, num_steps=model.warmup_steps, lr=model.warmup_lr,
                                      batch_size=model.warmup_batch_size, seed=seed, exclude=instructions)
    if model.dtype == "bfloat16":
        llama = llama.to(torch.bfloat16)
    llama.save_pretrained(out)
    tok.save_pretrained(out)
    (out / "warmup.json").write_text(json.dumps(dataclasses.asdict(report), indent=2) + "\n")
    return {"vocab_size": len(tok), "num_parameters": sum(p.numel() for p in llama.parameters()),
            "warmup_seconds": round(report.seconds, 2)}  # fmt: skip


def build_tiny_model(model: ModelConfig, tokenizer: Any, seed: int) -> Any:
    """A freshly initialised small Llama sized by `model`, over `tokenizer`'s vocabulary."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=model.hidden_size,
        intermediate_size=4 * model.hidden_size,
        num_hidden_layers=model.num_layers,
        num_attention_heads=model.num_heads,
        num_key_value_heads=model.num_heads,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    llama = LlamaForCausalLM(config)
    llama.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                                               bos_token_id=None, do_sample=True, temperature=1.0, top_k=0, top_p=1.0)  # fmt: skip
    return llama


def instructions_of(tasks_dir: Path) -> list[str]:
    """The instruction.md texts of a task set, in folder order."""
    if not tasks_dir.is_dir():
        raise Rl360Error(f"task folder {tasks_dir} does not exist", fix="set [tasks] path to a Harbor dataset folder")
    texts = [p.read_text() for p in sorted(tasks_dir.glob("*/instruction.md"))]
    if not texts:
        raise Rl360Error(f"{tasks_dir} holds no tasks (no */instruction.md)", fix="point [tasks] path at a Harbor dataset")
    return texts


def tasks_digest(tasks_dir: Path) -> str:
    """A digest of the task set's instructions: the tokenizer and the warm-up depend on them."""
    digest = hashlib.sha256()
    for text in instructions_of(tasks_dir):
        digest.update(text.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def code_digest() -> str:
    """A digest of the modules that build the tiny policy: a change to any of them rebuilds it."""
    digest = hashlib.sha256()
    for module in (conversation, arith, tokenizer, warmup):
        digest.update(Path(module.__file__).read_bytes())
    digest.update(Path(__file__).read_bytes())
    return digest.hexdigest()[:16]


if __name__ == "__main__":
    request = json.loads(sys.argv[1])
    print(json.dumps(_build_here(ModelConfig(**request["model"]), tasks_dir=Path(request["tasks_dir"]),
                                 out=Path(request["out"]), seed=request["seed"])))
