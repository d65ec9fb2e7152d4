"""The policy's version 0: a complete Hugging Face folder the engines and the trainer both load.

    path = prepare_policy(recipe.model, tasks_dir=Path(recipe.tasks.path), out_dir=run_dir / "policy-v0", seed=0)
    model, tokenizer = load_policy(path)

`prepare_policy` writes `out_dir` (config, safetensors weights, tokenizer with a chat template,
generation config) once; a marker file records what it was made from, so a second call with the
same inputs returns at once and a call with different inputs is refused rather than silently
mixing policies. The folder is built beside `out_dir` and renamed into place, so a crash never
leaves a half-written policy. By `ModelConfig.kind`:
- `tiny`: a byte-level BPE tokenizer trained here (`tokenizer.py`) on synthetic arith
  conversations and the task set's instructions, a small Llama from scratch, and a supervised
  warm-up (`warmup.py`); deterministic for a seed, so built once per machine under
  `$RL360_CACHE_DIR` (`cache.py`) and linked. `warmup.json` records the warm-up.
- `gguf-package`: a GGUF file shipped in a pip package, dequantised once into a cache
  (`gguf.py`) and linked here.
- `huggingface`: a saved Hugging Face folder, validated and linked here (hard links where the
  filesystem allows, else symbolic links).

Tests: tests/trainer/test_model*.py.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

from rl360cli.errors import Rl360Error
from rl360cli.trainer.cache import DONE, built_once, cache_root
from rl360cli.trainer.config import ModelConfig

MARKER = "rl360-policy.json"
FORMAT = 1
# What a loadable Hugging Face policy folder must hold (besides weights).
_REQUIRED = ("config.json",)
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")


def prepare_policy(model: ModelConfig, *, tasks_dir: Path, out_dir: Path, seed: int) -> Path:
    """Write policy version 0 to `out_dir` (once) and return `out_dir`."""
    out_dir = Path(out_dir)
    tasks_dir = Path(tasks_dir)
    recipe = {"format": FORMAT, "model": dataclasses.asdict(model), "seed": seed,
              "tasks": _tasks_digest(tasks_dir) if model.kind == "tiny" else None}  # fmt: skip
    marker = out_dir / MARKER
    if marker.is_file():
        try:
            made_from = json.loads(marker.read_text()).get("recipe")
        except (OSError, ValueError):
            made_from = None
        if made_from == recipe:
            return out_dir
        raise Rl360Error(
            f"{out_dir} holds a policy prepared from other settings (model, seed or tasks changed)",
            fix="start a new run (another run folder) or delete that folder",
        )
    if out_dir.exists() and any(out_dir.iterdir()):
        raise Rl360Error(f"{out_dir} exists and is not a prepared policy", fix="delete it or pick another folder")

    staging = out_dir.with_name(f".{out_dir.name}.staging-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        if model.kind == "tiny":
            # Deterministic for its settings and the code that builds it (one thread, a seed):
            # built once per machine, then linked.
            key = hashlib.sha256(json.dumps([recipe, _tiny_code_digest()], sort_keys=True).encode()).hexdigest()[:16]
            source, details = built_once(cache_root() / "models" / f"tiny-{key}",
                                         lambda staging: _prepare_tiny(model, tasks_dir=tasks_dir, out=staging, seed=seed))
            _link_files(source, staging, fallback="copy")
        elif model.kind == "gguf-package":
            from rl360cli.trainer.gguf import cached_hf_folder

            source = cached_hf_folder(model.package, model.gguf_file)
            _link_files(source, staging, fallback="copy")
            details = {"source": str(source)}
        else:
            source = validate_hf_folder(Path(model.path).expanduser())
            _link_files(source, staging, fallback="symlink")
            details = {"source": str(source)}
        (staging / MARKER).write_text(json.dumps({"recipe": recipe, "details": details}, indent=2) + "\n")
        if out_dir.exists():
            out_dir.rmdir()  # empty, checked above
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        staging.rename(out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out_dir


def load_policy(path: Path, *, dtype: str | None = None) -> tuple[Any, Any]:
    """(model, tokenizer) from a Hugging Face folder; the model in eval mode, on the CPU."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = validate_hf_folder(Path(path))
    kwargs = {"dtype": getattr(torch, dtype)} if dtype else {}
    model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model.eval()
    return model, tokenizer


def validate_hf_folder(path: Path) -> Path:
    """`path` if it holds a config, weights and a tokenizer with a chat template; else a one-line error."""
    if not path.is_dir():
        raise Rl360Error(f"model folder {path} does not exist", fix="set [model] path to a saved Hugging Face model")
    missing = [name for name in _REQUIRED if not (path / name).is_file()]
    if not any(path.glob("*.safetensors")) and not any(path.glob("pytorch_model*.bin")):
        missing.append("weights (*.safetensors)")
    if not any((path / name).is_file() for name in _TOKENIZER_FILES):
        missing.append("a tokenizer (tokenizer.json)")
    if missing:
        raise Rl360Error(f"model folder {path} lacks {', '.join(missing)}",
                         fix="save it with model.save_pretrained() and tokenizer.save_pretrained()")  # fmt: skip
    if not (path / "chat_template.jinja").is_file() and "chat_template" not in _read_json(path / "tokenizer_config.json"):
        raise Rl360Error(f"model folder {path} has no chat template",
                         fix="use an instruct/chat model, or set tokenizer.chat_template before save_pretrained()")  # fmt: skip
    return path


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


def _prepare_tiny(model: ModelConfig, *, tasks_dir: Path, out: Path, seed: int) -> dict:
    import torch

    from rl360cli.trainer import arith, warmup
    from rl360cli.trainer.tokenizer import train_tokenizer

    instructions = _instructions(tasks_dir)
    if model.warmup_steps and not all(text.startswith(arith.TASK_PREFIX) for text in instructions):
        raise Rl360Error(
            f"the tiny policy's warm-up knows only arith tasks, and {tasks_dir} holds others",
            fix="set [model] warmup_steps = 0, or use tasks written by recipes/tasks/generate_arith.py",
        )
    tokenizer = train_tokenizer([*warmup.synthetic_corpus(seed), *instructions], vocab_size=model.vocab_size)
    # One thread: the result is then the same on every machine (no thread-count-dependent float
    # reductions), and on a small shared machine two spinning OpenMP threads run several times slower.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        llama = build_tiny_model(model, tokenizer, seed)
        report = warmup.supervised_warmup(llama, tokenizer, num_steps=model.warmup_steps, lr=model.warmup_lr,
                                          batch_size=model.warmup_batch_size, seed=seed,
                                          exclude=instructions)  # fmt: skip
    finally:
        torch.set_num_threads(threads)
    if model.dtype == "bfloat16":
        llama = llama.to(torch.bfloat16)
    llama.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "warmup.json").write_text(json.dumps(dataclasses.asdict(report), indent=2) + "\n")
    return {"vocab_size": len(tokenizer), "num_parameters": sum(p.numel() for p in llama.parameters()),
            "warmup_seconds": round(report.seconds, 2)}  # fmt: skip


def _instructions(tasks_dir: Path) -> list[str]:
    if not tasks_dir.is_dir():
        raise Rl360Error(f"task folder {tasks_dir} does not exist", fix="set [tasks] path to a Harbor dataset folder")
    texts = [p.read_text() for p in sorted(tasks_dir.glob("*/instruction.md"))]
    if not texts:
        raise Rl360Error(f"{tasks_dir} holds no tasks (no */instruction.md)", fix="point [tasks] path at a Harbor dataset")
    return texts


def _tasks_digest(tasks_dir: Path) -> str:
    digest = hashlib.sha256()
    for text in _instructions(tasks_dir):
        digest.update(text.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def _tiny_code_digest() -> str:
    """A digest of the modules that build the tiny policy: a change to any of them rebuilds it."""
    from rl360cli.rl import agent
    from rl360cli.trainer import arith, tokenizer, warmup

    digest = hashlib.sha256()
    for module in (agent, arith, tokenizer, warmup):
        digest.update(Path(module.__file__).read_bytes())
    digest.update(Path(__file__).read_bytes())
    return digest.hexdigest()[:16]


def _link_files(source: Path, dest: Path, *, fallback: str) -> None:
    """Hard-link every file of `source` into `dest`; across filesystems copy or symlink instead."""
    for item in sorted(source.iterdir()):
        if not item.is_file() or item.name in (MARKER, DONE):
            continue
        target = dest / item.name
        try:
            os.link(item, target)
        except OSError:
            if fallback == "copy":
                shutil.copy2(item, target)
            else:
                target.symlink_to(item.resolve())


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
