"""The model's own chat template, for OpenAI-style messages: prompts, and the tokens that follow a turn.

A session keeps the engine's tokens (session_record.py). When the harness answers an assistant turn
with tool results (or a user or system message), the tokens to append are the ones the template puts
between that assistant turn and the next generation prompt: its end-of-turn separator (ChatML's
`<|im_end|>\\n`, whose `\\n` the engine never generates: it stops at `<|im_end|>`), the new messages
and the generation prompt. They are worked out by rendering, never written per model family:

    template = ChatTemplate(tokenizer)
    prompt = template.prompt_ids(messages, tools=tools)                   # a new segment
    extra = template.append_ids(history, new_messages, completion_ids=engine_ids, tools=tools)

`append_ids` renders the whole conversation with the last assistant message's content swapped for a
marker, twice (ending at that message, and with the new messages and a generation prompt), and keeps
the text after the marker that the longer rendering adds. So a template that groups tool results
under one user turn (Qwen2.5, Qwen3) or drops earlier thinking (Qwen3) is followed as it is: only
text after the last assistant turn is tokenized, once. Of the end-of-turn separator, whatever the
engine's completion already ends with (its end-of-turn token) is not appended again; a completion
cut at its token limit gets the whole separator. Tested by tests/agent/test_chat_template.py.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

# Stands in for the last assistant turn's content: invisible, and in no real conversation.
MARKER = "\u2063rl360-turn\u2063"
# OpenAI's newer name for the system role; chat templates know "system".
_ROLE_ALIASES = {"developer": "system"}
# Prompts kept, tokenized, per template: a group's sessions start from the same messages (a session actor
# starts thousands of sessions of a few dozen groups at once). A reference prompt is ~2k tokens: 256 of them
# hold ~20 MB as Python ints at most.
NUM_CACHED_PROMPTS = 256


class TemplateError(ValueError):
    """Messages the chat template cannot render as asked (the endpoint answers 400 with this)."""


def content_text(content: Any) -> str:
    """OpenAI message content as one string: None is empty, text parts are joined by newlines (as vLLM
    does for string-content templates)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise TemplateError(f"message content part of type {kind!r}: only text parts are supported")
            texts.append(part["text"])
        return "\n".join(texts)
    raise TemplateError(f"message content is a {type(content).__name__}, not a string or a list of text parts")


def arguments_object(arguments: Any) -> Any:
    """Tool-call arguments as templates want them: OpenAI sends a JSON string, templates such as
    Qwen2.5's apply `tojson` (a string would be quoted twice), so a string holding an object is parsed."""
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except json.JSONDecodeError:
            return arguments
        return parsed if isinstance(parsed, dict) else arguments
    return arguments


def template_messages(messages: list[dict]) -> list[dict]:
    """OpenAI request messages as chat templates expect them (a new list; the input is not changed)."""
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise TemplateError(f"messages[{i}] is not an object with a role")
        role = _ROLE_ALIASES.get(m["role"], m["role"])
        if role not in ("system", "user", "assistant", "tool"):
            raise TemplateError(f"messages[{i}] has role {m['role']!r}; use system, user, assistant or tool")
        msg: dict[str, Any] = {"role": role, "content": content_text(m.get("content"))}
        if role == "assistant" and m.get("tool_calls"):
            msg["tool_calls"] = [_template_call(call, i) for call in m["tool_calls"]]
        for key in ("tool_call_id", "name", "reasoning_content"):
            if isinstance(m.get(key), str):
                msg[key] = m[key]
        out.append(msg)
    return out


def _template_call(call: Any, i: int) -> dict:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise TemplateError(f"messages[{i}] has a tool call without function.name")
    return {"id": call.get("id"), "type": "function",
            "function": {"name": function["name"], "arguments": arguments_object(function.get("arguments", {}))}}


class ChatTemplate:
    """A tokenizer's chat template, rendered for OpenAI messages (see the module docstring)."""

    def __init__(self, tokenizer: Any):
        if not getattr(tokenizer, "chat_template", None):
            raise TemplateError("the tokenizer has no chat template")
        self.tokenizer = tokenizer
        self._end_of_turn: dict[str, tuple[str, list[int]]] = {}
        self._prompts: OrderedDict[str, tuple[int, ...]] = OrderedDict()

    def render(self, messages: list[dict], *, tools: list[dict] | None = None,
               template_kwargs: Mapping[str, Any] | None = None, add_generation_prompt: bool = True) -> str:
        """The template's text for `messages` (OpenAI shape, normalised here)."""
        return self._render(template_messages(messages), tools, template_kwargs, add_generation_prompt)

    def prompt_ids(self, messages: list[dict], *, tools: list[dict] | None = None,
                   template_kwargs: Mapping[str, Any] | None = None) -> list[int]:
        """The messages and a generation prompt, tokenized: what a new segment starts from. The same messages,
        tools and arguments (as JSON, key order and all: a template's `tojson` keeps it) with the same template
        are rendered once; the last `NUM_CACHED_PROMPTS` are kept."""
        try:
            key = json.dumps([self.tokenizer.chat_template, messages, tools, dict(template_kwargs or {})],
                             ensure_ascii=False)
        except (TypeError, ValueError):  # values that are no JSON: rendered each time
            return self.encode(self.render(messages, tools=tools, template_kwargs=template_kwargs))
        ids = self._prompts.get(key)
        if ids is None:
            ids = tuple(self.encode(self.render(messages, tools=tools, template_kwargs=template_kwargs)))
            self._prompts[key] = ids
            if len(self._prompts) > NUM_CACHED_PROMPTS:
                self._prompts.popitem(last=False)
        else:
            self._prompts.move_to_end(key)
        return list(ids)

    def encode(self, text: str) -> list[int]:
        # No BOS or other added tokens: a template that wants a BOS writes it (as apply_chat_template does).
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def end_of_turn(self, template_kwargs: Mapping[str, Any] | None = None) -> tuple[str, list[int]]:
        """What the template writes after an assistant message's content (`<|im_end|>\\n`), as text and ids."""
        key = json.dumps(dict(template_kwargs or {}), sort_keys=True, default=str)
        if key not in self._end_of_turn:
            text = self._render([{"role": "user", "content": "x"}, {"role": "assistant", "content": MARKER}],
                                None, template_kwargs, False)
            if text.count(MARKER) != 1:
                raise TemplateError("the chat template does not render an assistant message's content once")
            end = text[text.index(MARKER) + len(MARKER):]
            self._end_of_turn[key] = (end, self.encode(end))
        return self._end_of_turn[key]

    def append_text(self, history: list[dict], new_messages: list[dict], *, tools: list[dict] | None = None,
                    template_kwargs: Mapping[str, Any] | None = None) -> str:
        """The text the template puts after the last assistant message's end-of-turn separator: the new
        messages and the next generation prompt. `history` ends with that assistant message."""
        if not history or history[-1].get("role") != "assistant":
            raise TemplateError("appends follow an assistant turn: the history must end with one")
        if not new_messages:
            raise TemplateError("nothing to append: no new messages")
        hist = template_messages(history)
        hist[-1] = {**hist[-1], "content": MARKER}
        new = template_messages(new_messages)
        closed = self._render(hist, tools, template_kwargs, False)
        longer = self._render(hist + new, tools, template_kwargs, True)
        closed_tail, longer_tail = _after_marker(closed), _after_marker(longer)
        end, _ = self.end_of_turn(template_kwargs)
        if not longer_tail.startswith(closed_tail) or not closed_tail.endswith(end):
            raise TemplateError("the chat template renders the last assistant turn differently once messages "
                                f"follow it ({closed_tail[-40:]!r} vs {longer_tail[:len(closed_tail)][-40:]!r})")
        return longer_tail[len(closed_tail):]

    def append_ids(self, history: list[dict], new_messages: list[dict], *, completion_ids: list[int],
                   tools: list[dict] | None = None, template_kwargs: Mapping[str, Any] | None = None) -> list[int]:
        """The tokens to append after the engine's completion `completion_ids` (the last assistant turn):
        what of the end-of-turn separator the completion lacks, the new messages, the generation prompt."""
        text = self.append_text(history, new_messages, tools=tools, template_kwargs=template_kwargs)
        return self.after_turn_ids(completion_ids, text, template_kwargs=template_kwargs)

    def after_turn_ids(self, completion_ids: list[int], text: str, *,
                       template_kwargs: Mapping[str, Any] | None = None) -> list[int]:
        """`text` (what follows the end-of-turn separator) as tokens after `completion_ids`, with the part of
        the separator the completion did not generate in front of it."""
        end, end_ids = self.end_of_turn(template_kwargs)
        done = covered_prefix(completion_ids, end_ids)
        ids = self.encode(end + text)
        if ids[:done] == end_ids[:done]:
            return ids[done:]
        # The separator's tokens merged with the text's: tokenize what is left of the separator with it.
        head = self.tokenizer.decode(end_ids[:done], skip_special_tokens=False)
        if not end.startswith(head):
            raise TemplateError(f"cannot split the end-of-turn separator {end!r} after {head!r}")
        return self.encode(end[len(head):] + text)

    def _render(self, messages: list[dict], tools: list[dict] | None, template_kwargs: Mapping[str, Any] | None,
                add_generation_prompt: bool) -> str:
        try:
            return self.tokenizer.apply_chat_template(messages, tools=tools, tokenize=False,
                                                      add_generation_prompt=add_generation_prompt,
                                                      **dict(template_kwargs or {}))
        except TemplateError:
            raise
        except Exception as e:  # jinja2's errors (raise_exception, an undefined attribute) and TypeErrors
            raise TemplateError(f"the chat template failed: {type(e).__name__}: {e}") from None


def covered_prefix(completion_ids: list[int], end_ids: list[int]) -> int:
    """How many tokens of the end-of-turn separator `end_ids` the completion already ends with: the
    engine stops on the end-of-turn token (ChatML: 1 of `<|im_end|>`, `\\n`); a cut completion has 0."""
    for k in range(min(len(end_ids), len(completion_ids)), 0, -1):
        if list(completion_ids[-k:]) == list(end_ids[:k]):
            return k
    return 0


def _after_marker(text: str) -> str:
    at = text.rfind(MARKER)
    if at < 0:
        raise TemplateError("the chat template does not render the last assistant message's content")
    return text[at + len(MARKER):]
