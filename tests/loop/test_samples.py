"""samples.jsonl: a step's first trajectories decoded, and every infra failure with its detail; trajectories.jsonl:
the sessions a step keeps for the report's trajectories page (which, and their conversations as spans)."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import pytest

from rl360cli.inference.testing import build_tiny_test_model
from rl360cli.loop.samples import SampleKeeper, choose_sessions, conversation_spans
from rl360cli.outcome import InfraCause, Outcome
from rl360cli.rl.trajectory import Trajectory
from tests.agent.chat_fixtures import qwen_tokenizer
from tests.rl.factories import make_trajectory, text_trajectory


def test_every_masked_sample_is_kept_with_its_detail(tmp_path):
    keeper = SampleKeeper(tmp_path / "samples.jsonl", build_tiny_test_model(tmp_path / "tiny"), per_step=2)
    trajectories = [make_trajectory(group_id="g0", sample_index=i, seed=i) for i in range(5)]
    trajectories[1] = make_trajectory(group_id="g0", sample_index=1, reward=None, cause=InfraCause.SANDBOX_LOST,
                                      metadata={"detail": "container gone", "node": "n2"})
    trajectories[4] = make_trajectory(group_id="g0", sample_index=4, reward=None, cause=InfraCause.UNKNOWN,
                                      metadata={"detail": "the agent raised KeyError: 'x'", "node": "n1"})
    keeper(3, trajectories)
    rows = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert [(r["sample"], r["cause"], r["text"] is not None) for r in rows] == \
        [(0, None, True), (1, "sandbox_lost", True), (4, "unknown", False)]
    assert rows[2] == {**rows[2], "step": 3, "detail": "the agent raised KeyError: 'x'", "node": "n1",
                       "outcome": "infra_failure"}
    assert isinstance(rows[0]["text"], str)


# ----------------------------------------------------------------------------- trajectories.jsonl

PIECES = (  # (loss mask, text): a prompt, two model turns with a tool's output between them
    (0, "<|im_start|>system\nYou solve tasks with bash.<|im_end|>\n<|im_start|>user\nWrite hello.txt<|im_end|>\n"
        "<|im_start|>assistant\n"),
    (1, '<tool_call>\n{"name": "bash", "arguments": {"command": "echo hi > hello.txt"}}\n</tool_call><|im_end|>'),
    (0, "\n<|im_start|>user\n<tool_response>\nexit code 0\n</tool_response><|im_end|>\n<|im_start|>assistant\n"),
    (1, "The file is written.<|im_end|>"),
)


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory) -> Path:
    """A Qwen-templated tokenizer saved as a policy's folder holds it (what SampleKeeper loads)."""
    folder = tmp_path_factory.mktemp("qwen")
    qwen_tokenizer("qwen2.5-instruct").save_pretrained(folder)
    return folder


def test_the_conversation_splits_where_the_loss_mask_changes_each_model_turn_with_its_version(qwen_dir):
    keeper = SampleKeeper(qwen_dir / "samples.jsonl", qwen_dir)
    t = text_trajectory(keeper.tokenizer, PIECES)
    spans = conversation_spans(t.token_ids, t.loss_mask, t.versions, keeper.decode)
    # Special tokens kept: the chat template's framing is what the model saw.
    assert spans == [{"by": "env", "text": PIECES[0][1]}, {"by": "model", "text": PIECES[1][1], "version": 3},
                     {"by": "env", "text": PIECES[2][1]}, {"by": "model", "text": PIECES[3][1], "version": 4}]
    # A long text keeps its head and its tail, and says how much of it went.
    [prompt, *_] = conversation_spans(t.token_ids, t.loss_mask, t.versions, keeper.decode, max_chars=40)
    cut = len(PIECES[0][1]) - 40
    assert prompt == {"by": "env", "cut": cut, "text": f"{PIECES[0][1][:20]}\n[... {cut} characters left out ...]\n"
                                                       f"{PIECES[0][1][-20:]}"}
    assert conversation_spans([], [], (), keeper.decode) == []
    # A turn the versions do not cover (never from a session) says so rather than shifting the others.
    assert [s.get("version") for s in conversation_spans(t.token_ids, t.loss_mask, (7,), keeper.decode)] == \
        [None, 7, None, None]


def step_of_sessions() -> list[Trajectory]:
    """A step: group g0 of 6 valid sessions, a two-segment session in g1 (the best), 10 masked ones in g2."""
    step = [make_trajectory(group_id="g0", sample_index=i, reward=r, seed=i)
            for i, r in enumerate((0.5, 0.9, 0.0, 0.25, 0.0, 0.75))]
    step += [dataclasses.replace(make_trajectory(group_id="g1", sample_index=0, reward=1.0), segment=s) for s in (0, 1)]
    step += [make_trajectory(group_id="g2", sample_index=i, reward=None, cause=InfraCause.SANDBOX_START, seed=i)
             for i in range(10)]
    return step


def test_a_step_keeps_the_best_the_worst_the_masked_up_to_a_cap_and_a_seeded_random_few():
    step = step_of_sessions()
    chosen = choose_sessions(step, seed=7, step=3)
    named = [(why, t.group_id, t.sample_index, [s.segment for s in segments])
             for why, segments in chosen for t in segments[:1]]
    # The best is the two-segment session, both its segments; the worst the first of the two 0.0 rewards.
    assert named[:2] == [("best", "g1", 0, [0, 1]), ("worst", "g0", 2, [0])]
    assert named[2:10] == [("masked", "g2", i, [0]) for i in range(8)]
    drawn = [(g, i) for why, g, i, _ in named[10:]]
    assert [why for why, *_ in named[10:]] == ["random"] * 4 and len(set(drawn)) == 4
    rest = {("g0", i) for i in (0, 1, 3, 4, 5)} | {("g2", 8), ("g2", 9)}
    assert set(drawn) <= rest
    # The same run seed and step draw the same sessions; other steps draw others.
    assert choose_sessions(step, seed=7, step=3) == chosen
    draws = {tuple((t.group_id, t.sample_index) for why, [t, *_] in choose_sessions(step, seed=7, step=k)
                   if why == "random") for k in range(8)}
    assert len(draws) > 1
    # Fewer sessions than the quota: all of them, none twice.
    assert [why for why, _ in choose_sessions(step[:2], seed=0, step=0)] == ["best", "worst"]
    assert choose_sessions([], seed=0, step=0) == []


def test_the_keeper_writes_a_line_per_kept_segment_to_trajectories_jsonl(qwen_dir, tmp_path):
    keeper = SampleKeeper(tmp_path / "samples.jsonl", qwen_dir, trajectories_path=tmp_path / "trajectories.jsonl",
                          seed=7)
    tok = keeper.tokenizer
    meta = {"harness": "mini-swe-agent", "detail": None, "node": "n1",
            "session": {"turns": 2, "segments": 2, "tito_breaks": 1, "format_errors": 0, "engine_errors": 0,
                        "endpoint_errors": 0},
            "turns": [{"segment": 0, "tokens": 9, "finish": "tool_calls", "version": 3, "tool_calls": ["bash"]},
                      {"segment": 1, "tokens": 4, "finish": "stop", "version": 4}]}
    step = [text_trajectory(tok, PIECES, sample_index=0, reward=1.0, metadata=meta),
            text_trajectory(tok, PIECES, sample_index=0, reward=1.0, segment=1, metadata=meta),
            text_trajectory(tok, PIECES, sample_index=1, reward=0.0, outcome=Outcome.MODEL_FAILURE),
            text_trajectory(tok, PIECES, sample_index=2, reward=None, cause=InfraCause.ENGINE_ERROR,
                    metadata={"detail": "the harness raised APIError"}),
            Trajectory(task_id="task-g0", group_id="g0", sample_index=3, token_ids=[], loss_mask=[], logprobs=[],
                       versions=(), num_prompt_tokens=0, reward=None, outcome=Outcome.INFRA_FAILURE,
                       cause=InfraCause.SANDBOX_START)]
    keeper(5, step)
    rows = [json.loads(line) for line in (tmp_path / "trajectories.jsonl").read_text().splitlines()]
    assert [(r["sample"], r["segment"], r["segments"], r["chosen"], r["outcome"], r["cause"]) for r in rows] == [
        (0, 0, 2, "best", "ok", None), (0, 1, 2, "best", "ok", None), (1, 0, 1, "worst", "model_failure", None),
        (2, 0, 1, "masked", "infra_failure", "engine_error"), (3, 0, 1, "masked", "infra_failure", "sandbox_start")]
    best = rows[0]
    assert best == {**best, "step": 5, "task": "task-g0", "group": "g0", "reward": 1.0, "harness": "mini-swe-agent",
                    "node": "n1", "session": meta["session"], "turns": meta["turns"], "versions": [3, 4],
                    "num_tokens": len(step[0].token_ids)}
    assert [(s["by"], s.get("version")) for s in best["spans"]] == [("env", None), ("model", 3), ("env", None),
                                                                    ("model", 4)]
    assert rows[3]["detail"] == "the harness raised APIError" and rows[3]["reward"] is None
    assert rows[4]["spans"] == [] and rows[4]["num_tokens"] == 0
    # samples.jsonl is as it was: the first four decoded, the masked ones with their cause.
    kept = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert [(r["sample"], r["text"] is not None) for r in kept] == [(0, True), (0, True), (1, True), (2, True),
                                                                    (3, False)]


def test_keeping_a_large_step_takes_a_small_part_of_a_step(qwen_dir, tmp_path):
    """64 sessions of 8k tokens (16 turns): the keeper decodes the ~14 it keeps; well under a second here."""
    keeper = SampleKeeper(tmp_path / "samples.jsonl", qwen_dir, trajectories_path=tmp_path / "trajectories.jsonl")
    step = [make_trajectory(group_id=f"g{i // 8}", sample_index=i % 8, reward=(i % 5) / 4, seed=i,
                            num_prompt_tokens=400, turns=((200, 300),) * 16) for i in range(64)]
    step = [dataclasses.replace(t, token_ids=t.token_ids % 40_000) for t in step]  # ids the tokenizer has
    started = time.perf_counter()
    keeper(0, step)
    took = time.perf_counter() - started
    assert len((tmp_path / "trajectories.jsonl").read_text().splitlines()) == 6
    assert took < 2.0, f"keeping a step's samples took {took:.2f}s"
