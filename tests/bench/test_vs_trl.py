"""The pure parts of bench/bench_vs_trl.py, without TRL: the command a completion runs (its first bash block, or
its first tool call as rl360's built-in agent reads it), the clock read from rl360's metrics rows, the per-level
table and summary, and what the SmolLM2 mode gives each side."""

from __future__ import annotations

from bench.bench_vs_trl import (
    MODES,
    bash_block,
    first_command,
    first_messages,
    first_reaching,
    level_table,
    rl360_curve,
    split_line,
    summary,
)


def test_the_first_bash_block_is_the_command():
    assert bash_block("```bash\necho 'x-5' > answer.py\n```") == "echo 'x-5' > answer.py"
    assert bash_block("sure\n```sh\necho 'x' > answer.py\n```\n```bash\nls\n```") == "echo 'x' > answer.py"
    # Only bash and sh blocks act, as for rl360's agent: an untagged fence is no command.
    assert bash_block("```\necho 1\n```") is None


def test_no_block_runs_nothing():
    assert bash_block("done") is None
    assert bash_block("```bash echo 'x' > answer.py```") is None  # no newline after the tag: not a block
    assert bash_block("```bash\necho 'x' > answer.py") is None  # never closed (cut at max new tokens)


def curve(rewards: list[float | None], step_s: float = 10.0) -> list[dict]:
    return [{"step": i, "reward": r, "wall_s": step_s * (i + 1), "samples": 256} for i, r in enumerate(rewards)]


def test_the_level_table_gives_the_first_step_at_or_above_each_level():
    fast, slow = curve([0.4, 0.55, 0.72, 0.71, 0.77], step_s=7.0), curve([0.4, None, 0.6, 0.8, 0.9, 0.95], 16.0)
    assert first_reaching(fast, 0.7)["step"] == 2 and first_reaching(fast, 0.8) is None
    assert first_reaching(slow, 0.5)["step"] == 2  # a step without a reward never counts
    rows = level_table({"TRL": fast, "rl360": slow})
    assert rows[:2] == ["| reward level | TRL | rl360 |", "|---|---|---|"]
    assert rows[2] == "| 0.50 | 14 s (step 1) | 48 s (step 2) |"
    assert rows[4] == "| 0.70 | 21 s (step 2) | 64 s (step 3) |"
    assert rows[6] == "| 0.90 | never | 80 s (step 4) |"


def test_the_summary_counts_samples_over_the_whole_clock():
    s = summary(curve([0.3, 0.92, 0.85], step_s=8.0))
    assert s["first_step_090"] == 1 and s["wall_s_090"] == 16.0
    assert s["levels"]["0.80"] == 16.0 and s["reward_best"] == 0.92 and s["reward_last"] == 0.85
    assert s["samples_per_s"] == 3 * 256 / 24.0 and s["step_s_mean"] == 8.0


def test_rl360s_clock_starts_when_step_0_begins():
    rows = [{"step": 0, "time": 1000.0, "step_s": 20.0, "reward_mean": 0.35, "samples": 344, "train_s": 9.0},
            {"step": 1, "time": 1016.0, "step_s": 16.0, "reward_mean": 0.41, "samples": 296, "train_s": 8.0}]
    got = rl360_curve(rows)
    assert [(r["step"], r["wall_s"], r["reward"], r["samples"]) for r in got] == [(0, 20.0, 0.35, 344),
                                                                                  (1, 36.0, 0.41, 296)]
    assert got[1]["split"]["train_s"] == 8.0


def test_the_split_line_names_each_part_of_a_step():
    trl = [{"step": 0, "reward": 0.4, "wall_s": 7.0, "samples": 256, "step_s": 7.0, "generate_s": 2.0,
            "verify_s": 3.0, "updates": 2}]
    assert split_line(trl) == ("step 7.0 s = generation 2.0 s + sandboxes and verifier 3.0 s + "
                               "old logprobs and 2 updates 2.0 s")
    rows = [{"step": 0, "time": 30.0, "step_s": 16.0, "reward_mean": 0.4, "samples": 300, "wait_for_generation_s": 8.0,
             "generation_s": 12.0, "generation_rounds": 2, "train_s": 7.5, "weight_sync_s": 0.05, "eval/s": 4.0,
             "overlap_ratio": 1.0}]
    assert split_line(rl360_curve(rows)) == (
        "step 16.0 s: waiting for generation 8.0 s (generation 12.0 s over 2.0 rounds, overlapping the previous "
        "update), update 7.5 s, weight sync 0.05 s; 1 held-out evaluations, 4 s")
    # The synchronous loop (overlap = false) reports no overlap ratio: its generation follows the update.
    rows[0].update(overlap_ratio=None, wait_for_generation_s=12.0)
    assert "(generation 12.0 s over 2.0 rounds, after the previous update)" in split_line(rl360_curve(rows))


# ----------------------------------------------------------------------------- the SmolLM2 agent's single-turn form


def tool_agent(**kwargs):
    from rl360cli.agent.config import AgentConfig

    return AgentConfig(action_format="tool", tool_parser="hermes", **kwargs)


def test_the_first_tool_call_is_the_command_as_the_builtin_agent_reads_it():
    agent = tool_agent()
    call = '<tool_call>{"name": "bash", "arguments": {"command": "cp a.txt b.txt"}}</tool_call>'
    assert first_command(call, agent) == "cp a.txt b.txt"
    # Prose around it, a second call: the first call runs, as the agent runs calls[0].
    second = '<tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>'
    assert first_command("Sure.\n" + call + "\n" + second, agent) == "cp a.txt b.txt"
    # A block left open (cut at max_new_tokens) whose JSON is whole still counts (the hermes parser).
    assert first_command(call.removesuffix("</tool_call>"), agent) == "cp a.txt b.txt"
    # Arguments written as a JSON string, or under "parameters", as the parser accepts them.
    assert first_command('<tool_call>{"name": "bash", "arguments": "{\\"command\\": \\"pwd\\"}"}</tool_call>',
                         agent) == "pwd"  # fmt: skip
    assert first_command('<tool_call>{"name": "bash", "parameters": {"command": "pwd"}}</tool_call>', agent) == "pwd"


def test_no_call_a_malformed_call_or_another_tool_runs_nothing():
    agent = tool_agent()
    assert first_command("cp a.txt b.txt", agent) is None  # no call: the agent's final answer
    assert first_command('<tool_call>{"name": "bash", "arguments": {"command": "ls"</tool_call>', agent) is None
    assert first_command('<tool_call>{"name": "python", "arguments": {"code": "1"}}</tool_call>', agent) is None
    assert first_command('<tool_call>{"name": "bash", "arguments": {"command": "  "}}</tool_call>', agent) is None
    # A bash block is no action when the agent acts by tool calls.
    assert first_command("```bash\nls\n```", agent) is None


def test_a_call_made_while_thinking_is_not_run():
    call = '<tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>'
    assert first_command(f"<think>{call}</think>done", tool_agent(reasoning_parser="think")) is None
    assert first_command(f"<think>hm</think>{call}", tool_agent(reasoning_parser="think")) == "ls"


def test_a_fence_agent_runs_its_first_bash_block():
    from rl360cli.agent.config import AgentConfig

    agent = AgentConfig(action_format="fence")
    assert first_command("```bash\necho 1 > answer.py\n```", agent) == "echo 1 > answer.py"
    assert first_command('<tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>', agent) is None


def test_the_first_messages_are_the_system_prompt_and_the_instruction():
    from rl360cli.agent.config import AgentConfig

    assert first_messages(AgentConfig(), "Do x.") == [{"role": "user", "content": "Do x."}]
    assert first_messages(AgentConfig(system_prompt="You act."), "Do x.") == [
        {"role": "system", "content": "You act."}, {"role": "user", "content": "Do x."}]


def test_the_smollm2_mode_runs_rl360_in_the_single_turn_form_trl_runs():
    from rl360cli.config import load_recipe

    mode = MODES["smollm2-agent"]
    assert "rollout.max_turns=1" in mode.rl360_set and mode.section != MODES["local-smoke"].section
    assert mode.results != MODES["local-smoke"].results
    recipe = load_recipe(mode.recipe, base_dir=mode.recipe.parent)
    # What TRL is given from it: the tool-call form, the LoRA adapter, the manifest's two tasks.
    assert recipe.agent.action_format == "tool" and recipe.trainer.lora is not None
    assert len(recipe.tasks.include) == recipe.loop.num_tasks_per_step == 2


def test_the_summary_and_table_take_the_modes_levels():
    rows = curve([0.3, 0.45, 1.0])
    assert summary(rows, (0.4, 1.0))["levels"] == {"0.40": 20.0, "1.00": 30.0}
    assert level_table({"TRL": rows}, (0.4, 1.0))[2:] == ["| 0.40 | 20 s (step 1) |", "| 1.00 | 30 s (step 2) |"]


def test_one_update_a_step_has_no_old_logprob_pass():
    trl = [{"step": 0, "reward": 0.4, "wall_s": 9.0, "samples": 32, "step_s": 9.0, "generate_s": 2.0,
            "verify_s": 1.0, "updates": 1}]
    assert split_line(trl) == "step 9.0 s = generation 2.0 s + sandboxes and verifier 1.0 s + the update 6.0 s"
