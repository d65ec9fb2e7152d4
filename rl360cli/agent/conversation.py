"""The agent's side of a conversation: what an action looks like, what an observation looks like,
and how both become tokens without ever re-tokenizing earlier turns.

An assistant turn whose answer (its thinking left out) holds a fenced ```bash or ```sh block is an
action: the block runs in the sandbox and its result comes back as the next (observation) message.
Fences are paired line by line, so neither prose between two blocks nor a block of another language is
ever taken for a command (`first_shell_block`). `ConversationTokens` keeps the token ids exactly as the
engine produced them and appends observations tokenized once, through the model's own chat template:
the demo family's in-process rollouts (rl360cli/demo/) use it; rollout sessions go through the session
endpoint (endpoint.py, builtin.py).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any, Literal

from rl360cli.agent.chat_template import covered_prefix

# The languages a fenced action may be in.
SHELL_FENCES = ("bash", "sh")
THINK = re.compile(r"<think>.*?</think>", re.DOTALL)


@dataclass(frozen=True, slots=True)
class Action:
    kind: Literal["bash", "submit"]
    command: str = ""


def parse_action(reply: str) -> Action:
    """The first fenced bash (or sh) block of the reply's answer, else a submit."""
    command = first_shell_block(without_thinking(reply))
    return Action("submit") if command is None else Action("bash", command)


def without_thinking(text: str) -> str:
    """`text` without its thinking (`<think>...</think>`, or all before a lone `</think>`), however the endpoint
    was told to read thinking: a command drafted while thinking is never run."""
    text = THINK.sub("", text)
    return text.split("</think>", 1)[1] if "</think>" in text else text.split("<think>", 1)[0]


def first_shell_block(text: str) -> str | None:
    """The body of the first fenced block in `text` whose language is bash or sh; None when there is none.

    Fences are paired line by line (an opening ``` with its language, up to the next line that is only ```),
    so the prose between two blocks is never taken for a block, nor a block of another language for a command.
    """
    lines = text.split("\n")
    at = 0
    while at < len(lines):
        opening = lines[at].strip()
        if not opening.startswith("```"):
            at += 1
            continue
        language = opening[3:].strip().lower()
        end = next((i for i in range(at + 1, len(lines)) if lines[i].strip() == "```"), None)
        if end is None:
            return None  # an unclosed block: not an action
        if language in SHELL_FENCES:
            return "\n".join(lines[at + 1:end]).strip() or None
        at = end + 1
    return None


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
    Each observation is rendered through the template — the observation
    message and the next generation prompt, as they follow a finished
    assistant turn — then tokenized once and appended (loss mask 0).
    """

    def __init__(self, tokenizer: Any, messages: list[dict], *, observation_role: str = "tool",
                 template_kwargs: dict[str, Any] | None = None):
        self.tokenizer = tokenizer
        self.observation_role = observation_role
        self.template_kwargs = dict(template_kwargs or {})
        self.token_ids: list[int] = list(prompt_ids(tokenizer, messages, template_kwargs=self.template_kwargs))
        self.num_prompt_tokens = len(self.token_ids)
        self.loss_mask: list[int] = [0] * len(self.token_ids)
        self.logprobs: list[float] = [0.0] * len(self.token_ids)
        self.turn_versions: list[int] = []
        end_of_turn = _frame(tokenizer, observation_role, self.template_kwargs).end_of_turn
        self._end_of_turn = list(tokenizer.encode(end_of_turn, add_special_tokens=False))
        self._last_output: list[int] = []

    def add_generated(self, output_ids: list[int], logprobs: list[float], version: int) -> None:
        if len(output_ids) != len(logprobs):
            raise ValueError(f"{len(output_ids)} tokens but {len(logprobs)} logprobs")
        self._last_output = list(output_ids)
        self.token_ids += output_ids
        self.loss_mask += [1] * len(output_ids)
        self.logprobs += logprobs
        self.turn_versions.append(version)

    def add_observation(self, text: str) -> None:
        """Append an observation after the last generated turn, with what the template puts after an assistant
        turn that the engine did not emit: the separator after its stop token (ChatML's `\n` after
        `<|im_end|>`: engines stop at the token), or the whole end of turn after a reply cut at its limit."""
        covered = covered_prefix(self._last_output, self._end_of_turn)
        ids = self._end_of_turn[covered:] + self.observation_ids(text)
        self.token_ids += ids
        self.loss_mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)

    def observation_ids(self, text: str) -> list[int]:
        return observation_ids(self.tokenizer, text, role=self.observation_role, template_kwargs=self.template_kwargs)

    def __len__(self) -> int:
        return len(self.token_ids)


def prompt_ids(tokenizer: Any, messages: list[dict], *, template_kwargs: dict[str, Any] | None = None) -> tuple[int, ...]:
    """The chat template's rendering of `messages` and the generation prompt, as token ids.

    Every sample of a group starts from the same prompt, so a session actor renders each one once
    (a small cache: a group's sessions arrive together); messages or arguments that cannot be a cache
    key (a list of content parts, a list of tools) are rendered each time.
    """
    kwargs = dict(template_kwargs or {})
    try:
        return _cached_prompt(tokenizer, tokenizer.chat_template, tuple(tuple(sorted(m.items())) for m in messages),
                              tuple(sorted(kwargs.items())))
    except TypeError:
        return _prompt_of(tokenizer, messages, kwargs)


# A prompt of the reference recipe is ~2k tokens: 256 of them hold ~20 MB as Python ints, at most.
@functools.lru_cache(maxsize=256)
def _cached_prompt(tokenizer: Any, template: str, messages: tuple, kwargs: tuple) -> tuple[int, ...]:
    return _prompt_of(tokenizer, [dict(m) for m in messages], dict(kwargs))


def _prompt_of(tokenizer: Any, messages: list[dict], kwargs: dict[str, Any]) -> tuple[int, ...]:
    return tuple(_ids(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, **kwargs)))


# Stands in for an assistant message when the template's own text around messages is worked out.
_PLACEHOLDER = "\u2063rl360-turn\u2063"
# Observations the template's framing is checked with: padded, multi-line, with characters templates escape.
_PROBES = (" \n[exit code 0]\n  out\t\n", "<b>&'\"{{ x }}\n")


def observation_ids(tokenizer: Any, text: str, *, role: str = "tool",
                    template_kwargs: dict[str, Any] | None = None) -> list[int]:
    """The tokens that follow a finished assistant turn: the observation message, then the next
    generation prompt, as the chat template renders them.

    Templates may render earlier turns differently once more follow (Qwen3 drops an empty think
    block from all but the last assistant turn), so this takes what comes after the assistant
    message's own end-of-turn text in the longer rendering, not the difference of two renderings.
    """
    kwargs = dict(template_kwargs or {})
    frame = _frame(tokenizer, role, kwargs)
    if frame.before is not None:
        rest = frame.before + text + frame.after
    else:
        rest = _after_assistant(tokenizer, text, role, kwargs, frame.end_of_turn)
    return list(tokenizer.encode(rest, add_special_tokens=False))


@dataclass(frozen=True, slots=True)
class _Frame:
    """What a chat template puts around messages, worked out once per tokenizer, role and arguments.

    `end_of_turn` follows an assistant message (e.g. `<|im_end|>\\n`). An observation renders as
    `before + text + after` (its message, then the next generation prompt) when the template places
    the text as it is; `before` is None for templates that change it (trim, escape), which are then
    rendered for every observation. The check is two probe renderings: a template that looks at what
    an observation says, rather than placing it, would need probes that trigger it.
    """

    end_of_turn: str
    before: str | None
    after: str


def _frame(tokenizer: Any, role: str, kwargs: dict[str, Any]) -> _Frame:
    try:
        return _cached_frame(tokenizer, tokenizer.chat_template, role, tuple(sorted(kwargs.items())))
    except TypeError:  # an argument that cannot be a cache key (a list of tools): work it out each time
        return _frame_of(tokenizer, role, kwargs)


@functools.lru_cache(maxsize=64)
def _cached_frame(tokenizer: Any, template: str, role: str, kwargs: tuple) -> _Frame:
    # `template` is part of the key so that a tokenizer given another template is worked out again.
    return _frame_of(tokenizer, role, dict(kwargs))


def _frame_of(tokenizer: Any, role: str, kwargs: dict[str, Any]) -> _Frame:
    conversation = [{"role": "user", "content": "x"}, {"role": "assistant", "content": _PLACEHOLDER}]
    rendered = tokenizer.apply_chat_template(conversation, tokenize=False, **kwargs)
    end_of_turn = rendered[rendered.rfind(_PLACEHOLDER) + len(_PLACEHOLDER):]
    probes = [_after_assistant(tokenizer, probe, role, kwargs, end_of_turn) for probe in _PROBES]
    at = probes[0].find(_PROBES[0])
    if at >= 0:
        before, after = probes[0][:at], probes[0][at + len(_PROBES[0]):]
        if probes[1] == before + _PROBES[1] + after:
            return _Frame(end_of_turn=end_of_turn, before=before, after=after)
    return _Frame(end_of_turn=end_of_turn, before=None, after="")


def _after_assistant(tokenizer: Any, text: str, role: str, kwargs: dict[str, Any], end_of_turn: str) -> str:
    """The rendering of an observation after a finished assistant turn, from the template itself."""
    conversation = [{"role": "user", "content": "x"}, {"role": "assistant", "content": _PLACEHOLDER},
                    {"role": role, "content": text}]
    rendered = tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False, **kwargs)
    at = rendered.rfind(_PLACEHOLDER)
    if at < 0:
        raise ValueError("the chat template does not render the assistant's message content")
    rest = rendered[at + len(_PLACEHOLDER):]
    if not rest.startswith(end_of_turn):
        raise ValueError(f"the chat template ends an assistant turn with {rest[:20]!r}, not {end_of_turn!r}")
    return rest[len(end_of_turn):]


def _ids(rendered: Any) -> list[int]:
    # transformers 5 returns a BatchEncoding-like mapping from apply_chat_template(tokenize=True).
    if isinstance(rendered, dict) or hasattr(rendered, "keys"):
        return list(rendered["input_ids"])
    return list(rendered)
