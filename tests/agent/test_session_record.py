"""The session record: segments continue on appended messages, break (counted) on anything else."""

from __future__ import annotations

import json

import pytest

from rl360cli.agent.chat_template import ChatTemplate
from rl360cli.agent.session_record import SessionRecord, message_key
from rl360cli.outcome import Outcome
from rl360cli.rl.trajectory import Trajectory
from tests.agent.chat_fixtures import BASH_TOOL, qwen_tokenizer

TASK = [{"role": "system", "content": "Fix the bug."}, {"role": "user", "content": "Tests fail."}]


@pytest.fixture(scope="module")
def tok():
    return qwen_tokenizer("qwen2.5-instruct")


def engine_turn(tok, text: str, *, eot: bool = True) -> list[int]:
    return tok.encode(text + ("<|im_end|>" if eot else ""), add_special_tokens=False)


def reply_with_call(command: str) -> dict:
    return {"role": "assistant", "content": None, "reasoning_content": "think",
            "tool_calls": [{"id": "call_1", "type": "function",
                            "function": {"name": "bash", "arguments": json.dumps({"command": command})}}]}


def run_turn(record, tok, messages, text, reply, *, version=0, tools=(BASH_TOOL,)):
    prepared = record.prepare(messages, tools=list(tools))
    out = engine_turn(tok, text)
    record.commit(prepared, output_ids=out, logprobs=[-0.25] * len(out), version=version, reply=reply,
                  finish_reason="tool_calls")
    return prepared, out


def test_a_conversation_continued_by_tool_results_is_one_segment(tok):
    record = SessionRecord(ChatTemplate(tok))
    call_text = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'
    first, out1 = run_turn(record, tok, TASK, call_text, reply_with_call("ls"), version=3)
    assert first.segment is None and first.break_reason == ""
    # The harness sends the reply back its own way: no reasoning, no content key, arguments re-serialised.
    echoed = {"role": "assistant", "tool_calls": [{"id": "other", "type": "function", "function": {
        "name": "bash", "arguments": '{ "command" :"ls" }'}}]}
    second_messages = TASK + [echoed, {"role": "tool", "tool_call_id": "other", "content": "a.py"}]
    second, out2 = run_turn(record, tok, second_messages, "Done.", {"role": "assistant", "content": "Done."}, version=4)
    assert second.segment == 0 and second.break_reason is None
    [seg] = record.segments
    assert second.input_ids == first.input_ids + out1 + second.added
    assert seg.token_ids == first.input_ids + out1 + second.added + out2
    assert seg.loss_mask == [0] * len(first.input_ids) + [1] * len(out1) + [0] * len(second.added) + [1] * len(out2)
    assert [lp for lp, m in zip(seg.logprobs, seg.loss_mask) if m] == [-0.25] * (len(out1) + len(out2))
    assert all(lp == 0.0 for lp, m in zip(seg.logprobs, seg.loss_mask) if not m)
    assert seg.versions == [3, 4] and seg.num_prompt_tokens == len(first.input_ids)
    assert tok.decode(second.added, skip_special_tokens=False) == (
        "\n<|im_start|>user\n<tool_response>\na.py\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    # What the model saw: the messages, with the replies as the endpoint returned them.
    assert [m["role"] for m in seg.messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert seg.messages[2]["reasoning_content"] == "think"
    assert record.stats() == {"turns": 2, "segments": 1, "tito_breaks": 0, "format_errors": 0, "engine_errors": 0,
                              "endpoint_errors": 0}


@pytest.mark.parametrize("rewrite,why", [
    (lambda m: [m[0], {"role": "user", "content": "Summary: we listed files."}] + m[2:], "messages[1]"),
    (lambda m: m[:2] + [{**m[2], "tool_calls": [{"type": "function", "function": {
        "name": "bash", "arguments": '{"command": "pwd"}'}}]}] + m[3:], "messages[2]"),
    (lambda m: m + [{"role": "assistant", "content": "I am done."}, {"role": "user", "content": "ok"}],
     "new assistant message"),
    (lambda m: m[:3], "no more than"),
])
def test_anything_but_an_append_starts_a_new_segment_and_counts_a_break(tok, rewrite, why):
    record = SessionRecord(ChatTemplate(tok))
    run_turn(record, tok, TASK, "<tool_call>...</tool_call>", reply_with_call("ls"))
    history = TASK + [reply_with_call("ls"), {"role": "tool", "tool_call_id": "call_1", "content": "a.py"}]
    messages = rewrite(history)
    prepared, out = run_turn(record, tok, messages, "Again.", {"role": "assistant", "content": "Again."}, version=1)
    assert prepared.segment is None and why in prepared.break_reason
    # The new segment is the request's messages rendered afresh: all prompt, then the engine's turn.
    assert prepared.input_ids == ChatTemplate(tok).prompt_ids(messages, tools=[BASH_TOOL])
    assert len(record.segments) == 2 and record.num_tito_breaks == 1 and record.break_reasons == [prepared.break_reason]
    samples = record.samples()
    assert [s.versions for s in samples] == [(0,), (1,)]
    assert samples[1].token_ids == prepared.input_ids + out and samples[1].num_prompt_tokens == len(prepared.input_ids)


def test_other_tools_start_a_new_segment(tok):
    record = SessionRecord(ChatTemplate(tok))
    run_turn(record, tok, TASK, "x", reply_with_call("ls"))
    other = {"type": "function", "function": {"name": "python", "parameters": {"type": "object"}}}
    prepared = record.prepare(TASK + [reply_with_call("ls"), {"role": "tool", "content": "a"}], tools=[other])
    assert "tools" in prepared.break_reason


def test_a_failed_generation_records_nothing_and_the_retry_continues(tok):
    record = SessionRecord(ChatTemplate(tok))
    run_turn(record, tok, TASK, "x", reply_with_call("ls"))
    follow = TASK + [reply_with_call("ls"), {"role": "tool", "content": "a.py"}]
    lost = record.prepare(follow, tools=[BASH_TOOL])  # the engine fails this one: no commit
    record.note_engine_error("disconnected: connection lost")
    retry, _ = run_turn(record, tok, follow, "y", {"role": "assistant", "content": "y"})
    assert retry.input_ids == lost.input_ids and retry.segment == 0
    assert record.stats()["engine_errors"] == 1 and record.num_turns == 2


def test_a_segment_becomes_a_trajectory(tok):
    record = SessionRecord(ChatTemplate(tok))
    run_turn(record, tok, TASK, "x", reply_with_call("ls"), version=2)
    [sample] = record.samples()
    trajectory = Trajectory(task_id="t", group_id="g", sample_index=0, reward=1.0, outcome=Outcome.OK,
                            metadata={"messages": sample.messages}, **sample.trajectory_fields())
    assert trajectory.num_generated_tokens == sum(sample.loss_mask) and trajectory.versions == (2,)


def test_commit_checks_its_inputs(tok):
    record = SessionRecord(ChatTemplate(tok))
    prepared = record.prepare(TASK)
    with pytest.raises(ValueError, match="logprobs"):
        record.commit(prepared, output_ids=[1, 2], logprobs=[0.0], version=0, reply={}, finish_reason="stop")
    run_turn(record, tok, TASK, "x", reply_with_call("ls"))
    first = record.prepare(TASK + [reply_with_call("ls"), {"role": "tool", "content": "a"}], tools=[BASH_TOOL])
    second = record.prepare(TASK + [reply_with_call("ls"), {"role": "tool", "content": "b"}], tools=[BASH_TOOL])
    record.commit(first, output_ids=[5], logprobs=[0.0], version=0, reply={"role": "assistant"}, finish_reason="stop")
    with pytest.raises(RuntimeError, match="overlap"):
        record.commit(second, output_ids=[5], logprobs=[0.0], version=0, reply={}, finish_reason="stop")


def test_message_key_is_about_meaning():
    a = {"role": "assistant", "content": "ok ", "reasoning_content": "r", "tool_calls": [
        {"id": "1", "type": "function", "function": {"name": "bash", "arguments": '{"a": 1, "b": [2]}'}}]}
    b = {"role": "assistant", "content": [{"type": "text", "text": "ok"}], "tool_calls": [
        {"id": "2", "function": {"name": "bash", "arguments": {"b": [2], "a": 1}}}]}
    assert message_key(a) == message_key(b)
    assert message_key(a) != message_key({**b, "content": "not ok"})
    assert message_key({"role": "developer", "content": "x"}) == message_key({"role": "system", "content": "x"})
    # Thinking sent back inside the content, instead of as reasoning_content, is the same reply.
    assert message_key({"role": "assistant", "content": "<think>\nr\n</think>\n\nok"}) == message_key(
        {"role": "assistant", "content": "ok", "reasoning_content": "r"})
