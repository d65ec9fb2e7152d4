"""The policy's version 0: a complete Hugging Face folder the engines and the trainer both load.

    path = prepare_policy(recipe.model, tasks_dir=Path(recipe.tasks.path), out_dir=run_dir / "policy-v0", seed=0)
    model, tokenizer = load_policy(path)   # rl360cli.trainer.model

`prepare_policy` writes `out_dir` (config, safetensors weights, tokenizer with a chat template,
generation config) once; a marker file records what it was made from, so a second call with the
same inputs returns at once and a call with different inputs is refused rather than silently
mixing policies. The folder is built beside `out_dir` and renamed into place, so a crash never
leaves a half-written policy. By `ModelConfig.kind`:
- `tiny`: the demo task family's tiny policy (`rl360cli.demo.tiny_policy`: a byte-level BPE
  tokenizer, a small Llama from scratch, a supervised warm-up); deterministic for a seed, so built
  once per machine under `$RL360_CACHE_DIR` (`trainer/cache.py`) and linked. `warmup.json` records
  the warm-up.
- `gguf-package`: a GGUF file shipped in a pip package, dequantised once into a cache
  (`trainer/gguf.py`) and linked here.
- `huggingface`: a saved Hugging Face folder, validated and linked here (hard links where the
  filesystem allows, else symbolic links).

It sits in the run's layer, above the trainer and the demo, because it is where the two meet: the
trainer loads a policy folder and knows nothing of the demo that may have built it.

Tests: tests/trainer/test_model*.py.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
from pathlib import Path

from rl360cli.demo import tiny_policy
from rl360cli.errors import Rl360Error
from rl360cli.trainer.cache import DONE, built_once, cache_root
from rl360cli.trainer.config import ModelConfig
from rl360cli.trainer.gguf import cached_hf_folder
from rl360cli.trainer.model import validate_hf_folder

MARKER = "rl360-policy.json"
FORMAT = 1


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
