"""The policy's version 0: a complete Hugging Face folder the engines and the trainer both load.

    path = prepare_policy(recipe.model, tasks_dir=Path(recipe.tasks.path), out_dir=run_dir / "policy-v0", seed=0)
    model, tokenizer = load_policy(path)

`prepare_policy` writes `out_dir` (config, safetensors weights, tokenizer with a chat template,
generation config) once; a marker file records what it was made from, so a second call with the
same inputs returns at once and a call with different inputs is refused rather than silently
mixing policies. The folder is built beside `out_dir` and renamed into place, so a crash never
leaves a half-written policy. By `ModelConfig.kind`:
- `tiny`: the demo task family's tiny policy (`rl360cli.demo.tiny_policy`: a byte-level BPE
  tokenizer, a small Llama from scratch, a supervised warm-up); deterministic for a seed, so built
  once per machine under `$RL360_CACHE_DIR` (`cache.py`) and linked. `warmup.json` records the warm-up.
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
from rl360cli.demo import tiny_policy
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
    # `seed` is the one the policy is built with: where it came from (`warmup_seed` or the run's) does
    # not change the policy, so it stays out of the marker and the cache key.
    settings = {name: value for name, value in dataclasses.asdict(model).items() if name != "warmup_seed"}
    recipe = {"format": FORMAT, "model": settings, "seed": seed,
              "tasks": tiny_policy.tasks_digest(tasks_dir) if model.kind == "tiny" else None}  # fmt: skip
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
            code = tiny_policy.code_digest()
            key = hashlib.sha256(json.dumps([recipe, code], sort_keys=True).encode()).hexdigest()[:16]
            source, details = built_once(cache_root() / "models" / f"tiny-{key}",
                                         lambda staging: tiny_policy.build(model, tasks_dir=tasks_dir, out=staging,
                                                                           seed=seed))
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
