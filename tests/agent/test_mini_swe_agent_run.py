"""mini-swe-agent, unchanged, drives a whole run: `rl360 up` for three steps with `[agent] harness =
"mini-swe-agent"` (its DefaultAgent, its text-based model class through litellm, its format-error handling),
on local-smoke's policy and tasks. Its prompts and action pattern are set through its own config
(`[agent.harness_config]`), as a user would set them: the tiny policy knows the arith tasks' instruction and
```bash blocks, not mini-swe-agent's long prompt (recipes/mini-swe-agent-local.toml runs its own prompts on
SmolLM2; docs/agents.md has what that run shows).

What it checks: every step trains and syncs, no infra failure, mini-swe-agent's own format-error turns
reached the model, and a reply it drops from its history (a malformed one) makes a new segment, counted in
metrics.jsonl as a tito break.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tests.conftest import need, run_cli
from tests.loop.conftest import LOCAL_SMOKE_V0, write_run_files

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

NUM_STEPS = 3
AGENT = r'''
[model]
kind = "huggingface"
path = "{policy}"
[agent]
harness = "mini-swe-agent"
action_format = "fence"
[agent.harness_config.agent]
system_template = "You solve tasks with bash."
instance_template = "{{{{task}}}}"
[agent.harness_config.model]
action_regex = "```bash\\s*\\n(.*?)\\n```"
observation_template = "[exit code {{{{output.returncode}}}}]{{% if output.output %}}\n{{{{ output.output }}}}{{% endif %}}"
[rollout]
max_turns = 3
max_new_tokens = 48
max_total_tokens = 2048
[grpo]
filter_zero_std = false
[loop]
num_steps = {steps}
num_tasks_per_step = 4
num_samples_per_task = 4
max_generation_rounds = 1
overlap = false
'''


def test_mini_swe_agent_drives_three_steps_of_a_run(run_folder, state_path):
    need(importlib.util.find_spec("minisweagent") is not None,
         "mini-swe-agent is not installed: pip install rl360[agents] (cluster/dev/bootstrap.sh all does)")
    recipe = write_run_files(run_folder, recipe_body=AGENT.format(policy=LOCAL_SMOKE_V0, steps=NUM_STEPS))
    up = run_cli("up", "--recipe", str(recipe), state=state_path, cwd=run_folder, timeout=900)
    assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
    rows = [json.loads(line) for line in Path(json.loads(state_path.read_text())["runs"][
        json.loads(state_path.read_text())["current_run"]]["metrics_path"]).read_text().splitlines()]
    rows = [row for row in rows if "reward_mean" in row]
    assert len(rows) == NUM_STEPS and all(row["infra_failures"] == 0 for row in rows), rows
    assert all(row["sessions"] == 16 and row["batch"]["kept"] >= row["sessions"] for row in rows)
    # mini-swe-agent leaves a reply it cannot parse out of its history: the next request starts a segment.
    assert sum(row["tito_breaks"] for row in rows) > 0
    doc = json.loads(state_path.read_text())
    run = doc["runs"][doc["current_run"]]
    assert run["status"] == "finished" and run["policy_version"] == NUM_STEPS
    assert set(run["engine_versions"].values()) == {NUM_STEPS}
    texts = [json.loads(line)["text"] or "" for line in (Path(run["run_dir"]) / "samples.jsonl").open()]
    assert any("Expected exactly 1 action" in text for text in texts)  # its own format-error template
    assert any("[exit code 0]" in text for text in texts)  # its observation template, as the recipe set it
