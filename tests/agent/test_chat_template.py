"""Appends after an engine's turn equal the chat template's own rendering, token for token.

Real templates (SmolLM2-135M-Instruct's from its GGUF, Qwen2.5-Instruct's and Qwen3's as published)
on a real BPE (chat_fixtures.py). The engine's completion of each assistant turn is taken to be the
canonical one (the tokens of what the template writes for that message, up to the end-of-turn token,
where the engine stops), so the prompt, the completions and the appends must add up to the template's
rendering of the whole conversation.
"""

from __future__ import annotations

import json

import pytest

from rl360cli.agent.chat_template import ChatTemplate, TemplateError, covered_prefix, template_messages
from tests.agent.chat_fixtures import BASH_TOOL, tokenizer_named

TEMPLATES = ["smollm2", "qwen2.5-instruct", "qwen3"]


def call(command: str, id_: str) -> dict:
    return {"id": id_, "type": "function", "function": {"name": "bash", "arguments": json.dumps({"command": command})}}


def agent_conversation(tool_calls: bool) -> list[dict]:
    """A task, two turns of tool use (the second with two calls, answered by two tool messages), an answer.
    Every assistant turn thinks (Qwen3 keeps the thinking of turns after the last user query)."""
    def assistant(content: str, *calls: dict) -> dict:
        msg = {"role": "assistant", "content": content, "reasoning_content": f"plan for {content or 'calls'}"}
        return {**msg, "tool_calls": list(calls)} if calls and tool_calls else msg
    return [
        {"role": "system", "content": "You are a careful engineer."},
        {"role": "user", "content": "Make the tests pass."},
        assistant("" if tool_calls else "ls", call("ls", "c1")),
        {"role": "tool", "tool_call_id": "c1", "content": "a.py\ntest_a.py"},
        assistant("Two at once." if tool_calls else "cat", call("cat a.py", "c2"), call("cat test_a.py", "c3")),
        {"role": "tool", "tool_call_id": "c2", "content": "def f():\n    return 1\n"},
        {"role": "tool", "tool_call_id": "c3", "content": "assert f() == 2"},
        assistant("Fixed: f returns 2 now."),
    ]


def canonical_completion(tok, messages: list[dict], i: int, tools) -> str:
    """What the engine generates for assistant message i: the template's text for it after the generation
    prompt, up to its end-of-turn token (the `\\n` after `<|im_end|>` is the template's, not the model's)."""
    before = tok.apply_chat_template(messages[:i], tools=tools, tokenize=False, add_generation_prompt=True)
    upto = tok.apply_chat_template(messages[:i + 1], tools=tools, tokenize=False)
    assert upto.startswith(before), "the conversation must render append-only for this check"
    text = upto[len(before):]
    assert text.endswith("<|im_end|>\n")
    return text[:-1]


# SmolLM2's template renders no tool calls: its conversation is the plain one only.
@pytest.mark.parametrize("name,tool_calls", [(name, calls) for name in TEMPLATES for calls in (True, False)
                                             if not (name == "smollm2" and calls)])
def test_prompt_completions_and_appends_are_the_templates_rendering(name, tool_calls):
    tok = tokenizer_named(name)
    template = ChatTemplate(tok)
    tools = [BASH_TOOL] if tool_calls else None
    messages = agent_conversation(tool_calls)
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    ids = template.prompt_ids(messages[:turns[0]], tools=tools)
    newline = tok.encode("\n", add_special_tokens=False)
    for n, i in enumerate(turns):
        completion = tok.encode(canonical_completion(tok, messages, i, tools), add_special_tokens=False)
        assert completion[-1] == tok.convert_tokens_to_ids("<|im_end|>")
        ids += completion
        if n + 1 < len(turns):
            appended = template.append_ids(messages[:i + 1], messages[i + 1:turns[n + 1]], completion_ids=completion,
                                           tools=tools)
            # The engine stopped at <|im_end|>: the template's newline after it comes first.
            assert appended[:len(newline)] == newline
            ids += appended
    whole = tok.apply_chat_template(messages, tools=tools, tokenize=False)
    assert whole.endswith("<|im_end|>\n")  # the last turn's newline: nothing follows it, nothing appends it
    assert ids == tok.encode(whole[:-1], add_special_tokens=False)


@pytest.mark.parametrize("name", TEMPLATES)
def test_a_turn_cut_at_its_token_limit_gets_the_whole_end_of_turn(name):
    tok = tokenizer_named(name)
    template = ChatTemplate(tok)
    history = [{"role": "user", "content": "Count to ten."}, {"role": "assistant", "content": "1 2 3 4"}]
    follow = [{"role": "user", "content": "Go on."}]
    prompt = template.prompt_ids(history[:1])
    cut = tok.encode("1 2 3 4", add_special_tokens=False)  # no <|im_end|>: max_tokens ran out
    appended = template.append_ids(history, follow, completion_ids=cut)
    assert tok.decode(appended[:2], skip_special_tokens=False) == "<|im_end|>\n"
    whole = tok.apply_chat_template(history + follow, tokenize=False, add_generation_prompt=True)
    if name == "qwen3":  # the last assistant turn of a rendering gets an empty think block; ours had none
        whole = whole.replace("<think>\n\n</think>\n\n1 2 3 4", "1 2 3 4")
    assert prompt + cut + appended == tok.encode(whole, add_special_tokens=False)


def test_qwen3_appends_after_a_new_user_query_keep_the_engines_thinking():
    """Qwen3 drops the thinking of turns before the last user query when it renders a conversation again,
    so a later rendering is no extension of an earlier one; the appends are only what follows the turn."""
    tok = tokenizer_named("qwen3")
    template = ChatTemplate(tok)
    history = [{"role": "user", "content": "2+2?"},
               {"role": "assistant", "content": "4", "reasoning_content": "two and two"}]
    follow = [{"role": "user", "content": "And 3+3?"}]
    assert template.append_text(history, follow) == "<|im_start|>user\nAnd 3+3?<|im_end|>\n<|im_start|>assistant\n"
    again = tok.apply_chat_template(history + follow, tokenize=False, add_generation_prompt=True)
    assert "two and two" not in again  # what re-rendering would have trained on instead of the engine's tokens


def test_qwen3_enable_thinking_false_appends_the_empty_think_block():
    tok = tokenizer_named("qwen3")
    template = ChatTemplate(tok)
    history = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "", "tool_calls": [call("ls", "c")]}]
    text = template.append_text(history, [{"role": "tool", "content": "a.py"}], tools=[BASH_TOOL],
                                template_kwargs={"enable_thinking": False})
    assert text == ("<|im_start|>user\n<tool_response>\na.py\n</tool_response><|im_end|>\n"
                    "<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_tool_call_arguments_reach_the_template_as_objects():
    # Qwen2.5's template applies `tojson` to the arguments: a JSON string would come out quoted twice.
    tok = tokenizer_named("qwen2.5-instruct")
    messages = [{"role": "user", "content": "go"},
                {"role": "assistant", "content": None, "tool_calls": [call("ls -a", "c1")]}]
    text = ChatTemplate(tok).render(messages, tools=[BASH_TOOL], add_generation_prompt=False)
    assert '<tool_call>\n{"name": "bash", "arguments": {"command": "ls -a"}}\n</tool_call><|im_end|>' in text


def test_message_normalisation():
    msgs = template_messages([
        {"role": "developer", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": None, "reasoning_content": "r", "tool_calls": [call("ls", "c1")]},
        {"role": "tool", "tool_call_id": "c1", "content": "out"},
    ])
    assert msgs == [{"role": "system", "content": "a\nb"},
                    {"role": "assistant", "content": "", "reasoning_content": "r", "tool_calls": [
                        {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": {"command": "ls"}}}]},
                    {"role": "tool", "content": "out", "tool_call_id": "c1"}]


@pytest.mark.parametrize("messages,match", [
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], "image_url"),
    ([{"role": "critic", "content": "x"}], "critic"),
    (["hello"], "not an object"),
])
def test_messages_a_template_cannot_take(messages, match):
    with pytest.raises(TemplateError, match=match):
        template_messages(messages)


def test_appends_need_an_assistant_turn_before_them():
    template = ChatTemplate(tokenizer_named("smollm2"))
    with pytest.raises(TemplateError, match="assistant"):
        template.append_ids([{"role": "user", "content": "x"}], [{"role": "user", "content": "y"}], completion_ids=[])


@pytest.mark.parametrize("completion,covered", [([5, 2], 1), ([5, 2, 198], 2), ([5, 6], 0), ([], 0), ([198], 0)])
def test_covered_prefix(completion, covered):
    assert covered_prefix(completion, [2, 198]) == covered


def test_a_prompt_is_rendered_once_per_messages_tools_and_template(monkeypatch):
    """A group's sessions start from the same messages: the endpoint renders and tokenizes each prompt once."""
    tok = tokenizer_named("qwen2.5-instruct")
    template = ChatTemplate(tok)
    renders = []
    render = template.render
    monkeypatch.setattr(template, "render", lambda *a, **k: renders.append(1) or render(*a, **k))
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Fix test_a.py."}]
    first = template.prompt_ids(messages, tools=[BASH_TOOL])
    first.append(-1)  # a caller's list is its own
    again = template.prompt_ids([dict(m) for m in messages], tools=[BASH_TOOL])
    assert again == first[:-1] == tok.encode(render(messages, tools=[BASH_TOOL]), add_special_tokens=False)
    assert len(renders) == 1
    # Other tools, the same tools' keys in another order (a template's `tojson` keeps the order), other
    # arguments, another template: rendered again.
    reordered = {"function": BASH_TOOL["function"], "type": "function"}
    template.prompt_ids(messages, tools=[reordered])
    template.prompt_ids(messages)
    template.prompt_ids(messages, template_kwargs={"add_vision_id": True})
    tok.chat_template = tokenizer_named("qwen3").chat_template
    assert template.prompt_ids(messages) == tok.encode(render(messages), add_special_tokens=False)
    assert len(renders) == 5
