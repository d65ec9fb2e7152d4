"""The coding-32 task set: exactly what recipes/tasks/generate_coding.py writes; 32 Harbor tasks that
load; each task's oracle reaches reward 1 and a no-op does not (`rl360 tasks check`, process provider:
a sample here, all 32 in a slow test, a sample on the dev Docker nodes); and the verifier scores 0,
as a model failure and never an infrastructure failure, the ways model-written code can misbehave.

    .venv/bin/python -m pytest tests/recipes/test_coding_tasks.py -q            # the normal suite
    .venv/bin/python -m pytest tests/recipes/test_coding_tasks.py -q -m slow    # all 32 tasks, the hang
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections import Counter
from pathlib import Path

import pytest

from rl360cli.sandbox.task import load_task_set
from tests.conftest import REPO, need

TASKS = REPO / "recipes" / "tasks" / "coding-32"
GENERATOR = REPO / "recipes" / "tasks" / "generate_coding.py"
IMAGE = "127.0.0.1:5000/rl360/python:3.11"
# Two written from scratch (prebuilt image), two bug fixes (environment/Dockerfile), mixed difficulty.
SAMPLE = ("run-length-encoding", "expression-evaluator", "fix-binary-search", "fix-deep-merge")
DOCKER_SAMPLE = ("word-wrap", "fix-chunks")


def _check(cli, *task_ids: str, provider: str = "process", profile: str | None = None) -> dict:
    args = ["tasks", "check", str(TASKS), "--provider", provider, "--json"]
    for task_id in task_ids:
        args += ["--include", task_id]
    if profile:
        args += ["--profile", profile]
    proc = cli(*args, timeout=600)
    assert proc.stdout.strip(), proc.stderr
    return json.loads(proc.stdout) | {"returncode": proc.returncode}


def _assert_all_pass(report: dict, expected: set[str]) -> None:
    rows = {row["task"]: row for row in report["tasks"]}
    assert set(rows) == expected
    failed = {task: row["problems"] for task, row in rows.items() if not row["passed"]}
    assert not failed and report["passed"] and report["returncode"] == 0, failed
    for task, row in rows.items():
        assert row["oracle"]["rewards"] == {"reward": 1.0, "pass_fraction": 1.0}, task
        assert row["noop"]["outcome"] == "ok" and row["noop"]["reward"] == 0.0, task
        fraction = row["noop"]["rewards"]["pass_fraction"]
        if task.startswith("fix-"):
            # The buggy starting module runs and passes some tests, not all: the bug is real and partial.
            assert 0.0 < fraction < 1.0, (task, fraction)
        else:
            assert fraction == 0.0, (task, fraction)


@pytest.fixture(scope="module")
def isolation():
    need(shutil.which("bwrap") is not None, "bubblewrap missing: apt-get install bubblewrap")
    has_pytest = subprocess.run(["/usr/bin/python3", "-c", "import pytest"], capture_output=True).returncode == 0
    need(has_pytest, "the host python3 has no pytest: apt-get install python3-pytest")


# ----------------------------------------------------------------------------- the folder


def test_folder_is_what_the_generator_writes():
    proc = subprocess.run([sys.executable, str(GENERATOR), "--check"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"rerun {GENERATOR.relative_to(REPO)}:\n{proc.stderr}"


def test_all_32_tasks_load():
    tasks = load_task_set(TASKS)
    assert len(tasks) == 32 and len({t.name for t in tasks}) == 32
    difficulties = Counter(t.metadata["difficulty"] for t in tasks)
    assert set(difficulties) == {"easy", "medium", "hard"} and min(difficulties.values()) >= 4
    bug_fixes = [t for t in tasks if t.dockerfile is not None]
    assert len(bug_fixes) == 8
    for task in tasks:
        assert task.has_solution and task.workdir == "/app" and not task.network, task.id
        assert "coding-32" in task.metadata["tags"], task.id
        module = Path(task.metadata["module"]).name
        if task.dockerfile is None:
            assert task.docker_image == IMAGE, task.id
        else:
            # Harbor ignores the Dockerfile when docker_image is set: a task with starting files has none.
            assert task.docker_image is None, task.id
            assert task.dockerfile.read_text().splitlines()[1] == f"FROM {IMAGE}", task.id
            assert (task.dockerfile.parent / module).is_file(), task.id
        tests = (task.tests_dir / f"test_{module.removesuffix('.py')}.py").read_text()
        num_tests = len(re.findall(r"^def test_", tests, flags=re.MULTILINE))
        assert num_tests == task.metadata["num_tests"] >= 3, task.id
        assert f'"$status" {num_tests} <<' in (task.tests_dir / "test.sh").read_text(), task.id
        assert f"/app/{module}" in task.instruction, task.id
        assert os.access(task.tests_dir / "test.sh", os.X_OK) and os.access(task.solution_dir / "solve.sh", os.X_OK)


# ----------------------------------------------------------------------------- tasks check


def test_tasks_check_sample_process(cli, isolation):
    _assert_all_pass(_check(cli, *SAMPLE), set(SAMPLE))


@pytest.mark.slow
def test_tasks_check_all_process(cli, isolation):
    report = _check(cli)
    _assert_all_pass(report, {t.id for t in load_task_set(TASKS)})


@pytest.mark.docker
def test_tasks_check_sample_docker(cli, docker_nodes):
    report = _check(cli, *DOCKER_SAMPLE, provider="docker", profile=str(REPO / "cluster" / "dev-docker.toml"))
    _assert_all_pass(report, set(DOCKER_SAMPLE))
    assert all(row["oracle"]["node"] in {"n1", "n2", "n3"} for row in report["tasks"])


# ----------------------------------------------------------------------------- the verifier under attack


def _attempts(agents: dict[str, dict[str, str]], *, provider: str = "process",
              task_id: str = "run-length-encoding") -> dict:
    """Run one attempt per agent concurrently; each agent writes its files (relative paths: into /app)."""
    from rl360cli.config import load_profile
    from rl360cli.sandbox.attempt import run_attempt
    from rl360cli.sandbox.config import SandboxConfig

    (task,) = load_task_set(TASKS, include=(task_id,))
    # Not pytest's tmp_path: it is 0700 and the process sandboxes' own uids could not enter it.
    root = Path(tempfile.gettempdir()) / "rl360-test-sandboxes" / uuid.uuid4().hex[:12]
    root.mkdir(parents=True)
    os.chmod(root.parent, 0o711)

    def writes(files: dict[str, str]):
        async def agent(sandbox) -> None:
            for name, text in files.items():
                path = name if name.startswith("/") else f"/app/{name}"
                result = await sandbox.exec(f"cat > {path} <<'EOF'\n{text}\nEOF", timeout_s=10)
                assert result.exit_code == 0, result.output

        return agent

    def make_provider():
        run_id = f"t-{uuid.uuid4().hex[:8]}"
        if provider == "docker":
            from rl360cli.sandbox.docker_provider import DockerProvider

            nodes = load_profile(REPO / "cluster" / "dev-docker.toml").nodes
            return DockerProvider(nodes, config=SandboxConfig(provider="docker"), run_id=run_id)
        from rl360cli.sandbox.process import ProcessProvider

        return ProcessProvider(SandboxConfig(provider="process"), run_id=run_id, root=root)

    async def run() -> dict:
        sandboxes = make_provider()
        try:
            results = await asyncio.gather(*(run_attempt(sandboxes, task, writes(files), attempt_id=name)
                                             for name, files in agents.items()))
        finally:
            await sandboxes.close()
        return dict(zip(agents, results))

    try:
        return asyncio.run(run())
    finally:
        shutil.rmtree(root, ignore_errors=True)


RIGHT = '''
def encode(text):
    out, i = [], 0
    while i < len(text):
        j = i
        while j < len(text) and text[j] == text[i]:
            j += 1
        out.append(f"{j - i}{text[i]}")
        i = j
    return "".join(out)

def decode(data):
    out, count = [], ""
    for ch in data:
        if ch.isdigit():
            count += ch
        else:
            out.append(ch * int(count))
            count = ""
    return "".join(out)
'''
FORCE_PASS = '''
import pytest

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    outcome.get_result().outcome = "passed"
'''


def _assert_misbehaviour_scores_zero(results: dict) -> None:
    right = results.pop("right")
    assert (right.outcome.value, right.rewards) == ("ok", {"reward": 1.0, "pass_fraction": 1.0})
    for name, result in results.items():
        # Reward 0 with the verifier's own verdict: the attempt is trained on, not masked as infra.
        assert result.outcome.value == "ok", (name, result.outcome, result.detail)
        assert result.reward == 0.0, name
    assert results["exits-early"].rewards["pass_fraction"] == 0.0
    assert results["memory-bomb"].rewards["pass_fraction"] == 0.0
    assert 0.0 < results["half-right"].rewards["pass_fraction"] < 1.0


MISBEHAVING = {
    "right": {"rle.py": RIGHT},
    # Ends the interpreter with status 0 while pytest imports it: no JUnit report, no reward.
    "exits-early": {"rle.py": "import os\nos._exit(0)\n"},
    # A memory blow-up meets the verifier's own address-space limit (MemoryError), not the sandbox's.
    "memory-bomb": {"rle.py": RIGHT + "\nhog = bytearray(2 ** 31)\n"},
    # Files that would make every test pass if pytest loaded them from /app.
    "rigs-pytest": {"rle.py": "def encode(text):\n    return ''\n", "conftest.py": FORCE_PASS,
                    "pytest.ini": "[pytest]\naddopts = -p conftest\n"},
    # Half right: reward 0, and the pass fraction says how close it came.
    "half-right": {"rle.py": RIGHT.replace("out.append(ch * int(count))", "out.append(ch)")},
}


def test_verifier_scores_misbehaving_code_zero(isolation):
    _assert_misbehaviour_scores_zero(_attempts(MISBEHAVING))


@pytest.mark.docker
def test_verifier_scores_misbehaving_code_zero_docker(docker_nodes):
    """The same in containers, where the agent (root) can also write beside /tests: /conftest.py, /pytest.ini."""
    agents = {**MISBEHAVING, "rigs-pytest-at-root": {"rle.py": "def encode(text):\n    return ''\n",
                                                     "/conftest.py": FORCE_PASS,
                                                     "/pytest.ini": "[pytest]\naddopts = -p conftest\n"}}
    _assert_misbehaviour_scores_zero(_attempts(agents, provider="docker"))


@pytest.mark.slow
def test_verifier_scores_a_hang_zero_without_infra_failure(isolation):
    result = _attempts({"hangs": {"rle.py": "while True:\n    pass\n"}})["hangs"]
    assert result.outcome.value == "ok" and result.reward == 0.0
    assert result.rewards["pass_fraction"] == 0.0
