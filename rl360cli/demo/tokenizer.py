"""A byte-level BPE tokenizer trained locally (about a second) for tiny policies, with a chat template.

Every byte has a token, so any text round-trips; the merges come from the given corpus. Special
tokens: `<|pad|>` (id 0, what batches pad with), `<|end|>` (id 1: the end of every message and
the EOS, so an engine stops on it), and one token per role (`<|system|>`, `<|user|>`,
`<|assistant|>`, `<|tool|>`). The chat template renders a message as `<|role|>content<|end|>`
with nothing in between, so that an assistant turn the engine ended with EOS is exactly what the
template renders, and `add_generation_prompt` appends `<|assistant|>`.

    tok = train_tokenizer(["some text", ...], vocab_size=512)
    tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

PAD = "<|pad|>"
END = "<|end|>"
ROLES = ("system", "user", "assistant", "tool")
SPECIAL_TOKENS = (PAD, END, *(f"<|{role}|>" for role in ROLES))

CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] not in ['system', 'user', 'assistant', 'tool'] -%}"
    "{{ raise_exception('unknown role ' + message['role'] + '; use system, user, assistant or tool') }}"
    "{%- endif -%}"
    "<|{{ message['role'] }}|>{{ message['content'] }}<|end|>"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|assistant|>{%- endif -%}"
)


def train_tokenizer(corpus: Iterable[str], *, vocab_size: int = 512) -> Any:
    """A `PreTrainedTokenizerFast` trained on `corpus`, with the special tokens and the chat template.

    Deterministic for a given corpus (order included) and vocab_size.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if vocab_size < 256 + len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size must be at least {256 + len(SPECIAL_TOKENS)} (got {vocab_size}): "
                         "every byte needs a token")  # fmt: skip
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(corpus, trainer=trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD,
        eos_token=END,
        extra_special_tokens=[t for t in SPECIAL_TOKENS if t not in (PAD, END)],
        chat_template=CHAT_TEMPLATE,
        model_max_length=4096,
    )
    tok.padding_side = "left"
    return tok
