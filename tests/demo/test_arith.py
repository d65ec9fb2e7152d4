"""The arith task family and the arith-32 task set: generator, verifier, oracle, in-process stand-ins."""

from __future__ import annotations

import importlib.util
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from rl360cli.demo import arith
from rl360cli.demo.arith_rollout import emulate_command, load_tasks
from tests.conftest import REPO

TASKS = REPO / "recipes" / "tasks" / "arith-32"


def _generator():
    spec = importlib.util.spec_from_file_location("generate_arith", REPO / "recipes" / "tasks" / "generate_arith.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_verifier(task: Path, answer: str | None, tmp_path: Path) -> tuple[str, str]:
    """(reward.txt, stdout) of the task's real tests/test.sh on `answer` (None: no answer file)."""
    answer_file = tmp_path / "app" / "answer.py"
    reward_file = tmp_path / "logs" / "verifier" / "reward.txt"
    answer_file.parent.mkdir(parents=True, exist_ok=True)
    answer_file.unlink(missing_ok=True)
    reward_file.unlink(missing_ok=True)
    if answer is not None:
        answer_file.write_text(answer)
    env = {"PATH": "/usr/bin:/bin", "RL360_ANSWER_FILE": str(answer_file), "RL360_REWARD_FILE": str(reward_file)}
    done = subprocess.run(["bash", str(task / "tests" / "test.sh")], env=env, capture_output=True, text=True,
                          timeout=30)
    return reward_file.read_text().strip(), done.stdout


def test_committed_tasks_are_exactly_what_the_generator_writes():
    files = _generator().all_files()
    assert len(files) == 32 * 4
    on_disk = {str(p.relative_to(TASKS)) for p in TASKS.rglob("*") if p.is_file()}
    assert on_disk == set(files)
    for rel, text in files.items():
        assert (TASKS / rel).read_text() == text, f"{rel} differs: rerun recipes/tasks/generate_arith.py"


def test_the_task_set_has_distinct_functions_of_one_to_three_steps():
    programs = _generator().programs()
    lengths = [len(p) for p in programs]
    assert (lengths.count(1), lengths.count(2), lengths.count(3)) == tuple(_generator().NUM_BY_LENGTH.values())
    outputs = {tuple(y for _, y in arith.cases(p)) for p in programs}
    assert len(outputs) == 32
    assert all(len(set(o)) > 1 for o in outputs)


def test_the_sandbox_loader_reads_every_task():
    from rl360cli.sandbox.task_loader import load_task_set

    tasks = load_task_set(TASKS)
    assert [t.id for t in tasks] == [f"arith-{i:02d}" for i in range(32)]
    assert {t.workdir for t in tasks} == {"/app"} and all(t.has_solution for t in tasks)
    assert {t.docker_image for t in tasks} == {"127.0.0.1:5000/rl360/python:3.11"}


@pytest.mark.parametrize("seed", range(5))
def test_the_canonical_expression_computes_the_program(seed):
    rng = random.Random(seed)
    for _ in range(300):
        program = arith.random_program(rng)
        expr = arith.expression(program)
        for x in range(-30, 31):
            assert eval(expr, {}, {"x": x}) == arith.evaluate(program, x), (program, expr, x)
        assert arith.parse_program(arith.program_text(program)) == program


def test_the_canonical_expression_reads_left_to_right():
    assert arith.expression(arith.parse_program("add 2, mul 3")) == "(x+2)*3"
    assert arith.expression(arith.parse_program("add 4, mul 4, sub 9")) == "((x+4)*4)-9"
    assert arith.expression(arith.parse_program("neg, div 3")) == "(x*-1)//3"
    assert arith.expression(arith.parse_program("div 3, neg")) == "(x//3)*-1"
    assert arith.expression(arith.parse_program("square")) == "x**2"


@pytest.mark.parametrize("answer, ok", [
    ("x*6", True), ("6*x", True), ("x + x + x + x + x + x\n", True), ("(x*6)", True),
    ("x*6; import os", False),  # junk after ';' (a def-wrapping verifier would accept it)
    ("x*6\nx", False), ("", False), ("   \n", False), ("x*7", False), ("x*6.5", False),
    ("__import__('os').getpid()", False), ("x**99", False), ("9**9**9", False), ("x if x else 0", False),
    ("lambda: x", False), ("y*6", False), ("x/0", False),
])  # fmt: skip
def test_check_answer(answer, ok):
    assert arith.check_answer(answer, arith.cases(arith.parse_program("mul 6"))) is ok


def test_the_verifier_script_gives_1_only_to_right_answers(tmp_path):
    task = TASKS / "arith-00"
    program = _generator().programs()[0]
    right = arith.expression(program)
    equivalent = f"0+{right}"
    assert run_verifier(task, right + "\n", tmp_path)[0] == "1"
    assert run_verifier(task, equivalent, tmp_path)[0] == "1"
    for wrong in (f"{right}; echo hacked", f"{right}+1", "", "echo hi", f"{right} )", "x"):
        reward, out = run_verifier(task, wrong, tmp_path)
        assert reward == "0", (wrong, out)
    reward, out = run_verifier(task, None, tmp_path)
    assert reward == "0" and "no answer" in out


def test_every_oracle_answer_passes_the_verifier_script_and_no_other_tasks_does(tmp_path):
    programs = _generator().programs()
    rewards = {}
    for index in (0, 9, 13, 21, 31):
        solve = (TASKS / f"arith-{index:02d}" / "solution" / "solve.sh").read_text()
        answer = solve.split("echo '", 1)[1].split("'", 1)[0]
        assert answer == arith.expression(programs[index])
        for other in (index, (index + 1) % 32):
            rewards[index, other] = run_verifier(TASKS / f"arith-{other:02d}", answer + "\n", tmp_path)[0]
    assert all(r == "1" for (i, j), r in rewards.items() if i == j)
    assert all(r == "0" for (i, j), r in rewards.items() if i != j)


def test_oracles_pass_and_noops_fail_in_the_real_process_sandbox(cli):
    import shutil

    from tests.conftest import need

    need(shutil.which("bwrap") is not None, "bubblewrap missing: apt-get install bubblewrap")
    done = cli("tasks", "check", str(TASKS), "--json", "-j", "2", timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["passed"] is True and len(report["tasks"]) == 32
    assert all(row["oracle"]["outcome"] == "ok" and row["oracle"]["reward"] == 1.0 for row in report["tasks"])
    assert all(row["noop"]["outcome"] == "ok" and row["noop"]["reward"] == 0.0 for row in report["tasks"])


def test_load_tasks_reads_the_cases_from_the_program():
    tasks = load_tasks(TASKS)
    assert len(tasks) == 32
    programs = _generator().programs()
    assert [t.cases for t in tasks] == [tuple(arith.cases(p)) for p in programs]
    assert tasks[0].instruction == (TASKS / "arith-00" / "instruction.md").read_text()


@pytest.mark.parametrize("command, result", [
    ("echo 'x*3+1' > answer.py", (0, "", "x*3+1\n")),
    ('echo "x-2" > /app/answer.py', (0, "", "x-2\n")),
    ("echo 'x' > other.py", (0, "", None)),
    ("echo 'x*3+1 > answer.py", (127, None, None)),
    ("cat answer.py", (127, None, None)),
])  # fmt: skip
def test_emulate_command(command, result):
    code, output, written = emulate_command(command)
    assert code == result[0] and written == result[2]
    if result[1] is not None:
        assert output == result[1]


def test_generator_check_mode_accepts_the_committed_tasks():
    done = subprocess.run([sys.executable, str(REPO / "recipes" / "tasks" / "generate_arith.py"), "--check"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
