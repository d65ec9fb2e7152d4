"""Loading a policy: a Hugging Face folder (config, weights, a tokenizer with a chat template) as a
model and its tokenizer, checked first so a folder that lacks something fails in one line.

    model, tokenizer = load_policy(path)

Policy version 0 is written by `rl360cli.run.policy.prepare_policy` (the demo's tiny policy, a GGUF
file, a saved folder); this module loads what it wrote and knows nothing of how it was made.

Tests: tests/trainer/test_model*.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rl360cli.errors import Rl360Error

# What a loadable Hugging Face policy folder must hold (besides weights).
_REQUIRED = ("config.json",)
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")


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


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
