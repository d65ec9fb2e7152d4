"""Tool-call and reasoning parsing: the Hermes/Qwen `<tool_call>` format and `<think>` blocks."""

from __future__ import annotations

import json

import pytest

from rl360cli.agent.config import REASONING_PARSER_NAMES, TOOL_PARSER_NAMES
from rl360cli.agent.tool_parsers import (REASONING_PARSERS, TOOL_PARSERS, HermesToolParser, ThinkReasoningParser,
                                         get_tool_parser, parse_completion)

BASH_CALL = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls -la"}}\n</tool_call>'


def parse(text: str, **kw):
    return parse_completion(text, tool_parser="hermes", reasoning_parser="think", tool_names={"bash"}, **kw)


def test_a_bash_call():
    parsed = parse(BASH_CALL)
    assert parsed.content is None and parsed.reasoning_content is None and parsed.format_error is None
    [call] = parsed.tool_calls
    assert call.name == "bash" and json.loads(call.arguments) == {"command": "ls -la"}
    assert call.id.startswith("call_")
    assert call.to_openai() == {"id": call.id, "type": "function",
                                "function": {"name": "bash", "arguments": '{"command": "ls -la"}'}}


def test_two_calls():
    text = BASH_CALL + '\n<tool_call>\n{"name": "bash", "arguments": {"command": "cat a.py"}}\n</tool_call>'
    parsed = parse(text)
    assert [json.loads(c.arguments)["command"] for c in parsed.tool_calls] == ["ls -la", "cat a.py"]
    assert len({c.id for c in parsed.tool_calls}) == 2


def test_text_before_a_call_is_the_content():
    parsed = parse("Let me look at the files.\n\n" + BASH_CALL)
    assert parsed.content == "Let me look at the files."
    assert [c.name for c in parsed.tool_calls] == ["bash"]


@pytest.mark.parametrize("block,why", [
    ('{"name": "bash", "arguments": {"command": "ls"}', "not JSON"),
    ('{"arguments": {"command": "ls"}}', "no function name"),
    ('["bash"]', "not an object"),
    ('{"name": "bash", "arguments": ["ls"]}', "not an object"),
])
def test_a_malformed_call_is_plain_content_and_a_format_error(block, why):
    text = f"Running it.\n<tool_call>\n{block}\n</tool_call>"
    parsed = parse(text)
    assert parsed.tool_calls == ()
    assert parsed.content == text  # all of it, as the model wrote it
    assert why in parsed.format_error


def test_a_call_inside_think_is_no_call():
    text = f"<think>\nI could run {BASH_CALL} but I know the answer.\n</think>\n\nThe answer is 4."
    parsed = parse(text)
    assert parsed.tool_calls == () and parsed.format_error is None
    assert parsed.content == "The answer is 4."
    assert "<tool_call>" in parsed.reasoning_content


def test_no_action():
    parsed = parse("The answer is 4.")
    assert (parsed.content, parsed.reasoning_content, parsed.tool_calls, parsed.format_error) == \
        ("The answer is 4.", None, (), None)


def test_thinking_then_a_call():
    parsed = parse(f"<think>\nlist first\n</think>\n\n{BASH_CALL}")
    assert parsed.reasoning_content == "list first" and parsed.content is None
    assert [c.name for c in parsed.tool_calls] == ["bash"]


@pytest.mark.parametrize("text,reasoning,rest", [
    ("<think>\nwhy\n</think>\n\nanswer", "why", "answer"),
    ("why\n</think>\n\nanswer", "why", "answer"),        # the template opened the block in the prompt
    ("<think>\nstill thinking when cut", "still thinking when cut", ""),
    ("<think>\n\n</think>\n\nanswer", None, "answer"),    # an empty block (thinking off) is no reasoning
    ("no thinking at all", None, "no thinking at all"),
])
def test_reasoning_split(text, reasoning, rest):
    assert ThinkReasoningParser().split(text) == (reasoning, rest)


def test_a_final_unclosed_call_counts_if_its_json_is_whole():
    # A stop string `</tool_call>` is trimmed from the text the engine returns.
    parsed = HermesToolParser().parse('<tool_call>\n{"name": "bash", "arguments": {"command": "pwd"}}\n')
    assert [json.loads(c.arguments) for c in parsed.calls] == [{"command": "pwd"}]


def test_arguments_given_as_a_json_string_and_parameters_are_accepted():
    parsed = HermesToolParser().parse('<tool_call>{"name": "bash", "arguments": "{\\"command\\": \\"ls\\"}"}'
                                      '</tool_call><tool_call>{"name": "bash", "parameters": {"command": "id"}}'
                                      '</tool_call>')
    assert [json.loads(c.arguments)["command"] for c in parsed.calls] == ["ls", "id"]


def test_without_a_tool_parser_calls_stay_text():
    parsed = parse_completion(BASH_CALL, tool_parser=None, reasoning_parser=None)
    assert parsed.content == BASH_CALL and parsed.tool_calls == ()


def test_unknown_parser_names_the_known_ones():
    with pytest.raises(ValueError, match="hermes"):
        get_tool_parser("nope")


def test_the_recipe_knows_every_parser_by_name():
    """`[agent] tool_parser` / `reasoning_parser` are checked when the recipe loads, against names the config
    module keeps (configs import no part's code): they must be the registries' own."""
    assert set(TOOL_PARSER_NAMES) == set(TOOL_PARSERS) and set(REASONING_PARSER_NAMES) == set(REASONING_PARSERS)
