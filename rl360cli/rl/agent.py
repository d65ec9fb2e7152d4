"""The agent's side of a conversation: what an action looks like, what an observation looks like,
and how both become tokens without ever re-tokenizing earlier turns.

An assistant turn that holds a fenced ```bash block is an action: the block
runs in the sandbox and its result comes back as the next (observation)
message. A turn with no block submits. `ConversationTokens` keeps the token
ids exactly as the engine produced them and appends observations tokenized
once, through the model's own chat template.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

FENCE = re.compile(r"```(?:bash|sh)?[ \t]*\n(.*?)(?:\n)?```", re.DOTALL)


@dataclass(frozen=True, slots=True)
class Action:
    kind: Literal["bash", "submit"]
    command: str = ""


def parse_action(reply: str) -> Action:
    """The first fenced bash block of the reply, else a submit."""
    m = FENCE.search(reply)
    if m is None:
        return Action("submit")
    return Action("bash", m.group(1).strip())


def format_observation(exit_code: int | None, output: str, *, timed_out: bool = False, max_chars: int = 2000) -> str:
    """What the agent sees after its command ran."""
    if timed_out:
        head = "[timed out]"
    else:
        head = f"[exit code {exit_code}]"
    output = output.rstrip("\n")
    if len(output) > max_chars:
        output = output[:max_chars] + f"\n[... {len(output) - max_chars} more characters]"
    return f"{head}\n{output}" if output else head


class ConversationTokens:
    """Token ids of a multi-turn conversation, built turn by turn from the engine's own tokens.

    The prompt comes from the chat template once. Each generated turn is
    appended as the engine returned it (loss mask 1, with its logprobs).
    Each observation is rendered through the template as the difference
    between a conversation that ends after an assistant turn and the same
    conversation with the observation and the next generation prompt, then
    tokenized once and appended (loss mask 0).
    """

    def __init__(self, tokenizer: Any, messages: list[dict], *, observation_role: str = "tool"):
        self.tokenizer = tokenizer
        self.observation_role = observation_role
        self.token_ids: list[int] = list(_ids(tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                                             tokenize=True)))
        self.num_prompt_tokens = len(self.token_ids)
        self.loss_mask: list[int] = [0] * len(self.token_ids)
        self.logprobs: list[float] = [0.0] * len(self.token_ids)
        self.turn_versions: list[int] = []
        self._end_of_turn = _end_of_turn_ids(tokenizer)

    def add_generated(self, output_ids: list[int], logprobs: list[float], version: int) -> None:
        if len(output_ids) != len(logprobs):
            raise ValueError(f"{len(output_ids)} tokens but {len(logprobs)} logprobs")
        self.token_ids += output_ids
        self.loss_mask += [1] * len(output_ids)
        self.logprobs += logprobs
        self.turn_versions.append(version)

    def add_observation(self, text: str, *, finished_turn: bool) -> None:
        """Append an observation; `finished_turn` says whether the engine already emitted end-of-turn."""
        ids = self.observation_ids(text)
        if not finished_turn:
            ids = self._end_of_turn + ids
        self.token_ids += ids
        self.loss_mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)

    def observation_ids(self, text: str) -> list[int]:
        return observation_ids(self.tokenizer, text, role=self.observation_role)

    def __len__(self) -> int:
        return len(self.token_ids)


def observation_ids(tokenizer: Any, text: str, *, role: str = "tool") -> list[int]:
    """The tokens that follow a finished assistant turn: the observation message, then the next
    generation prompt, as the chat template renders them."""
    base = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
    before = tokenizer.apply_chat_template(base, tokenize=False)
    after = tokenizer.apply_chat_template(base + [{"role": role, "content": text}], add_generation_prompt=True,
                                          tokenize=False)
    if not after.startswith(before):
        raise ValueError("the chat template renders earlier turns differently once a turn is added")
    return list(tokenizer.encode(after[len(before):], add_special_tokens=False))


def _end_of_turn_ids(tokenizer: Any) -> list[int]:
    """What the template puts after an assistant message (e.g. `<|im_end|>\\n`), as tokens."""
    base = [{"role": "user", "content": "x"}]
    with_reply = tokenizer.apply_chat_template(base + [{"role": "assistant", "content": "y"}], tokenize=False)
    prompt = tokenizer.apply_chat_template(base, add_generation_prompt=True, tokenize=False)
    tail = with_reply[len(prompt):]
    return list(tokenizer.encode(tail[tail.index("y") + 1:], add_special_tokens=False)) if "y" in tail else []


def _ids(rendered: Any) -> list[int]:
    # transformers 5 returns a BatchEncoding-like mapping from apply_chat_template(tokenize=True).
    if isinstance(rendered, dict) or hasattr(rendered, "keys"):
        return list(rendered["input_ids"])
    return list(rendered)
