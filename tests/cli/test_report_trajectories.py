"""`rl360 report`'s trajectories page: what the agent did, opened in headless Chromium.

The samples come the way a run's do: a real mini-swe-agent session (tests/agent/sessions.py: rl360's session
endpoint in front of a scripted stand-in engine, a process sandbox, the task's real verifier), written to the
run folder's trajectories.jsonl by the loop's `SampleKeeper`, beside conversations written by hand (model
text that tries to run a script, a session whose harness rewrote its history, a masked one). The page is
built by `rl360 report` and read back from Chromium's `--dump-dom`, its search and filter driven by the
`?q=` and `?outcome=` URL parameters its script reads.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

from rl360cli.agent.config import AgentConfig
from rl360cli.loop.samples import TRAJECTORIES, SampleKeeper
from rl360cli.outcome import InfraCause, Outcome
from rl360cli.stages.report.trajectories import embedded_json, read_kept
from rl360cli.state.store import StateFile
from tests.agent.sessions import HELLO, attempt, builtin, call
from tests.agent.sessions import engine, served  # noqa: F401 - the fixtures
from tests.cli.test_report import CHROMIUM, make_run, open_in_chromium
from tests.conftest import need, run_cli
from tests.rl.factories import text_trajectory
from tests.sandbox.conftest import bwrap, process_config, process_provider, sandbox_root  # noqa: F401 - fixtures

HOSTILE = '<script>document.body.dataset.pwned = "1"</script><img src=x onerror="document.body.dataset.pwned=2">'
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


def listed(dom: str) -> str:
    """The samples the page shows, in its DOM."""
    return dom.split('<div id="list">')[1].split('<button id="more"')[0]


def hand_written(tokenizer) -> list:
    """Sessions of another task: a model failure whose text is HTML, a two-segment session, a masked one."""
    prompt = (0, "<|im_start|>user\nMake the tests pass.<|im_end|>\n<|im_start|>assistant\n")
    return [
        text_trajectory(tokenizer, [prompt, (1, f"Try this: {HOSTILE}<|im_end|>")], task_id="python-bugfix",
                        group_id="g1", sample_index=0, reward=0.0, versions=(0,), outcome=Outcome.MODEL_FAILURE),
        *[text_trajectory(tokenizer, [prompt, (1, f"{call('pytest -q')}<|im_end|>"),
                                      (0, "\n<|im_start|>user\n<tool_response>\n2 passed\n</tool_response><|im_end|>\n"
                                          "<|im_start|>assistant\n"), (1, "Fixed.<|im_end|>")],
                          task_id="python-bugfix", group_id="g1", sample_index=1, reward=1.0, segment=segment,
                          versions=(0, 0)) for segment in (0, 1)],
        text_trajectory(tokenizer, [prompt], task_id="python-bugfix", group_id="g1", sample_index=2, reward=None,
                        versions=(), cause=InfraCause.SANDBOX_START,
                        metadata={"detail": "the container did not start", "harness": "mini-swe-agent"}),
    ]


def test_the_trajectories_page_shows_a_mini_swe_agent_sessions_tool_calls_and_outputs_and_filters(
        served, engine, process_provider, state_path, tmp_path):
    need(CHROMIUM.is_file(), f"{CHROMIUM} is missing: apt-get install chromium (cluster/dev/test.sh does)")
    need(importlib.util.find_spec("minisweagent") is not None, "mini-swe-agent is not installed: pip install "
         "rl360[agents] (cluster/dev/bootstrap.sh all does)")
    engine.say("I will write the file.\n" + call(HELLO))
    engine.say("Submitting.\n" + call(SUBMIT))
    agent = AgentConfig(harness="mini-swe-agent", action_format="tool")
    [session] = attempt(served, builtin(agent), agent=agent, provider=process_provider())
    assert (session.outcome, session.reward, session.metadata["harness"]) == (Outcome.OK, 1.0, "mini-swe-agent")

    run_dir = make_run(StateFile(state_path), tmp_path / "runs", "agent-run", [], status="running")
    policy = tmp_path / "policy"
    served.tokenizer.save_pretrained(policy)
    keeper = SampleKeeper(run_dir / "samples.jsonl", policy, trajectories_path=run_dir / TRAJECTORIES, seed=7)
    keeper(0, [session, *hand_written(keeper.tokenizer)])
    report = json.loads(run_cli("report", "--json", state=state_path, check=True).stdout)
    page = run_dir / "report" / "trajectories.html"
    assert (report["trajectories"], report["trajectory_samples"], report["trajectory_steps"]) == (str(page), 5, [0])
    assert 'href="trajectories.html"' in (run_dir / "report" / "report.html").read_text()

    dom, shot = open_in_chromium(page, tmp_path)
    assert 'data-rendered="1"' in dom and 'data-shown="5" data-matching="5"' in dom, dom[:2000]
    # mini-swe-agent's own prompt, its bash tool calls (highlighted) and its observations of them.
    assert "You are a helpful assistant that can interact with a computer." in dom
    tool_calls = re.findall(r'<mark class="call">(.*?)</mark>', dom, re.S)
    assert f'&lt;tool_call&gt;\n{{"name": "bash", "arguments": {{"command": "{SUBMIT}"}}}}\n&lt;/tool_call&gt;' \
        in tool_calls, tool_calls
    assert any("printf 'Hello, world!" in c and "&gt; hello.txt" in c for c in tool_calls)
    assert '"returncode": 0' in dom
    # Each model turn with its policy version and what the session recorded of it; the framing dimmed.
    assert "model · turn 2 · policy v0 · finish tool_calls · calls bash" in dom
    assert '<span class="tok">&lt;|im_start|&gt;</span>' in dom
    # Model text is shown, never run.
    assert "data-pwned" not in dom and "&lt;script&gt;document.body.dataset.pwned" in dom
    # The outcome, the masked one's cause and detail, the rewritten history.
    assert "infra_failure: sandbox_start" in dom and "detail: the container did not start" in dom
    assert "segment 1 of 2: the harness rewrote its history" in dom
    png = shot.read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000

    searched, _ = open_in_chromium(page, tmp_path, "?q=HELLO")  # a task id substring, any case
    assert 'data-shown="1" data-matching="1"' in searched and SUBMIT in searched
    assert "python-bugfix" not in listed(searched) and "showing 1 of 1 matching samples" in searched
    masked, _ = open_in_chromium(page, tmp_path, "?outcome=infra_failure")
    assert 'data-shown="1" data-matching="1"' in masked and "the container did not start" in masked
    assert SUBMIT not in listed(masked)
    none, _ = open_in_chromium(page, tmp_path, "?q=hello&outcome=model_failure")
    assert 'data-shown="0" data-matching="0"' in none


def test_a_running_runs_report_writes_the_page_of_the_steps_kept_so_far(state_path, tmp_path):
    need(CHROMIUM.is_file(), f"{CHROMIUM} is missing: apt-get install chromium (cluster/dev/test.sh does)")
    state = StateFile(state_path)
    running = make_run(state, tmp_path / "runs", "live-run", [], status="running")
    rows = [{"step": step, "task": f"task-{step}-{i}", "group": f"g{i}", "sample": 0, "segment": 0, "segments": 1,
             "chosen": "random", "outcome": "ok", "cause": None, "reward": 0.5, "harness": "bash",
             "versions": [step], "num_tokens": 3, "spans": [{"by": "env", "text": "prompt"},
                                                            {"by": "model", "text": "done", "version": step}]}
            for step in (0, 1) for i in range(2)]
    torn = json.dumps({**rows[0], "step": 2})[:40]  # the line the trainer is writing now
    (running / TRAJECTORIES).write_text("".join(json.dumps(r) + "\n" for r in rows) + torn)
    report = json.loads(run_cli("report", "--json", state=state_path, check=True).stdout)
    assert report["status"] == "running" and report["trajectory_steps"] == [0, 1]
    page = Path(report["trajectories"])
    text = page.read_text()
    assert "this page is a snapshot" in text and "1 lines did not read" in text
    dom, _ = open_in_chromium(page, tmp_path)
    assert 'data-shown="4" data-matching="4"' in dom
    # Newest step first.
    assert [int(s) for s in re.findall(r'data-step="(\d+)"', dom)] == [1, 1, 0, 0]

    # A run with nothing kept yet (or from before trajectories.jsonl) gets the page too, saying so.
    (running / TRAJECTORIES).unlink()
    report = json.loads(run_cli("report", "--json", state=state_path, check=True).stdout)
    assert report["trajectory_samples"] == 0 and "the run folder has no trajectories.jsonl" in page.read_text()


def test_a_page_holds_the_newest_steps_that_fit_and_embeds_its_data_safely(tmp_path):
    path = tmp_path / TRAJECTORIES
    rows = [{"step": step, "task": "t", "spans": [{"by": "model", "text": "x" * 1000}]} for step in range(5)
            for _ in range(2)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    kept = read_kept(path, max_chars=3000)  # two steps' lines (2 x 2 x ~1060 chars) pass it: the second is whole
    assert (kept.steps(), kept.num_steps_left_out) == ([3, 4], 3)
    assert "older steps only in trajectories.jsonl" in kept.describe()
    assert read_kept(path, max_chars=10).steps() == [4]  # one step at least
    assert read_kept(tmp_path / "none.jsonl").found is False
    text = embedded_json({"text": "</script><!-- & -->"})
    assert "<" not in text and ">" not in text and "&" not in text.replace("\\u0026", "")
    assert json.loads(text) == {"text": "</script><!-- & -->"}
