"""Verifier probes (`rl360 tasks check --probe`): attempts a verifier must not pass, on real sandboxes."""

from __future__ import annotations

import json

import pytest

from rl360cli.sandbox.check import check_tasks
from rl360cli.sandbox.probes import PROBES
from rl360cli.sandbox.task_loader import load_task
from tests.sandbox.conftest import run, write_task

SOLVE = "mkdir -p /app/out && echo 42 > /app/out/answer.txt\n"
VERIFIERS = {
    # Reads the answer: no probe passes it.
    "sound": '[ "$(cat /app/out/answer.txt 2>/dev/null)" = 42 ] && r=1 || r=0',
    # Passes any non-empty file: noise and the echoed instruction pass it.
    "non_empty": "[ -s /app/out/answer.txt ] && r=1 || r=0",
    # Passes any file at all, even an empty one.
    "exists": "[ -e /app/out/answer.txt ] && r=1 || r=0",
    # Reads no output: it checks a trace solve.sh leaves in /tmp, which a probe never writes.
    "no_output": "[ -e /tmp/solved ] && r=1 || r=0",
}


def probe_task(tmp_path, verifier: str):
    return load_task(write_task(tmp_path, verifier.replace("_", "-"), solve_sh=SOLVE + "touch /tmp/solved\n",
                                test_sh=VERIFIERS[verifier] + "; echo $r > /logs/verifier/reward.txt\n"))


@pytest.mark.parametrize("verifier, fooled", [
    ("sound", set()),
    ("non_empty", {"garbage", "echo"}),
    ("exists", {"empty", "garbage", "echo"}),
    ("no_output", {"moved"}),
])
def test_each_probe_catches_the_verifier_it_is_for(process_provider, tmp_path, verifier, fooled):
    (row,) = run(check_tasks(process_provider(), [probe_task(tmp_path, verifier)], run_id="probe", probe=True))
    assert row.outputs == ("/app/out/answer.txt",)
    assert set(row.probes) == set(PROBES) and row.oracle.reward == 1.0 and row.noop.reward == 0.0
    scored_one = {name for name, result in row.probes.items() if result.reward == 1.0}
    assert scored_one == fooled, {k: (v.reward, v.detail) for k, v in row.probes.items()}
    assert row.passed == (not fooled)
    for name in fooled:  # the report names the probe and what the verifier passed
        assert any(p.startswith(f"probe {name} scored 1: the verifier passes") for p in row.problems), row.problems


def test_a_verifier_that_scores_any_non_empty_file_is_caught_on_docker(docker_provider, tmp_path):
    (row,) = run(check_tasks(docker_provider(), [probe_task(tmp_path, "non_empty")], run_id="probe", probe=True))
    assert not row.passed and {p.split(" scored")[0] for p in row.problems} == {"probe garbage", "probe echo"}
    assert row.to_dict()["probes"]["garbage"]["reward"] == 1.0


def test_without_probe_no_probe_runs_and_an_oracle_that_writes_nothing_is_not_probed(process_provider, tmp_path):
    task = probe_task(tmp_path, "non_empty")
    (plain,) = run(check_tasks(process_provider(), [task], run_id="plain"))
    assert plain.probes == {} and plain.passed and "probes" not in plain.to_dict()
    silent = load_task(write_task(tmp_path, "silent", solve_sh="echo 42\n", test_sh="echo 1 > /logs/verifier/r\n"
                                  "echo 1 > /logs/verifier/reward.txt\n"))
    (row,) = run(check_tasks(process_provider(), [silent], run_id="silent", probe=True))
    assert row.outputs == () and row.probes == {}


def test_tasks_check_probe_names_the_task_and_the_probe_that_scored_1(cli, bwrap, sandbox_root, tmp_path):
    sound, fooled = probe_task(tmp_path, "sound"), probe_task(tmp_path, "non_empty")
    env = {"RL360_SANDBOX_ROOT": str(sandbox_root)}
    proc = cli("tasks", "check", str(sound.path), str(fooled.path), "--probe", env=env, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    rows = {line.split()[1]: line for line in proc.stdout.splitlines() if line.startswith("│ ")}
    assert "ok" in rows["sound"] and "0 0 0 0" in rows["sound"]
    assert "probe garbage scored 1" in rows["non-empty"] and "probe echo scored 1" in rows["non-empty"]
    assert "1/2 tasks pass" in proc.stdout
    data = json.loads(cli("tasks", "check", str(fooled.path), "--probe", "--json", env=env, timeout=300).stdout)
    (row,) = data["tasks"]
    assert row["task"] == "non-empty" and {k: v["reward"] for k, v in row["probes"].items()} == {
        "empty": 0.0, "garbage": 1.0, "echo": 1.0, "moved": 0.0}
    assert row["outputs"] == ["/app/out/answer.txt"]


def test_tasks_check_force_build_builds_what_it_would_pull(cli, bwrap, sandbox_root, tmp_path):
    """`--force-build` (Harbor's): the docker_image is never looked for; the Dockerfile beside it is built."""
    from tests.sandbox.test_harbor_semantics import FORCE_DOCKERFILE

    folder = write_task(tmp_path, "force", image="127.0.0.1:5000/rl360/never-pushed:1", workdir=None,
                        files={"environment/Dockerfile": FORCE_DOCKERFILE}, solve_sh="touch done\n",
                        test_sh='[ "$(cat marker)" = from-the-dockerfile ] && [ -e done ] && r=1 || r=0\n'
                                "echo $r > /logs/verifier/reward.txt\n")
    env = {"RL360_SANDBOX_ROOT": str(sandbox_root)}
    pulled = json.loads(cli("tasks", "check", str(folder), "--json", env=env).stdout)
    assert pulled["tasks"][0]["oracle"]["reward"] == 0.0  # the host stood in for the image: no marker
    built = cli("tasks", "check", str(folder), "--force-build", "--json", env=env)
    assert built.returncode == 0 and json.loads(built.stdout)["passed"], built.stdout + built.stderr


def test_the_check_keeps_what_the_oracles_solve_sh_printed(process_provider, tmp_path):
    # An oracle that dies half-way: the verifier's failures alone do not say why (Terminal-Bench 2.0's rows).
    broken = load_task(write_task(tmp_path, "broken", solve_sh="echo fetching the data; echo 'no route' >&2; exit 7\n",
                                  test_sh="echo 0 > /logs/verifier/reward.txt\n"))
    for probe in (False, True):
        (row,) = run(check_tasks(process_provider(), [broken], run_id=f"solve-{probe}", probe=probe))
        shown = row.to_dict()["oracle"]["solve_output"]
        assert "[solve.sh exit 7]" in shown and "fetching the data" in shown and "no route" in shown, shown
        assert row.oracle.reward == 0.0 and not row.passed
