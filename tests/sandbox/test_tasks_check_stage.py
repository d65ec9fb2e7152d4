"""The `tasks check` stage (rl360cli/stages/tasks_check.py) called as a function: the typed report `rl360 tasks
check` renders, on real process sandboxes. tests/sandbox/test_cli.py runs the command itself."""

from __future__ import annotations

import pytest

from rl360cli.config import load_profile
from rl360cli.errors import Rl360Error
from rl360cli.stages.base import Context
from rl360cli.stages.tasks_check import TasksCheck, check, load_tasks
from rl360cli.state.store import StateFile
from tests.conftest import REPO
from tests.sandbox.conftest import write_task

OK_TEST = "[ -f /app/done ] && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n"


def test_the_stage_returns_a_row_per_task_refused_ones_included(bwrap, sandbox_root, tmp_path, monkeypatch):
    monkeypatch.setenv("RL360_SANDBOX_ROOT", str(sandbox_root))
    write_task(tmp_path / "set", "good", test_sh=OK_TEST, solve_sh="touch /app/done\n")
    write_task(tmp_path / "set", "needs-key", toml='[environment.env]\nKEY = "${RL360_TEST_UNSET_KEY}"\n',
               solve_sh="true\n")
    loaded = load_tasks([tmp_path / "set"], include=())
    assert [t.id for t in loaded.tasks] == ["good"] and list(loaded.refused) == ["needs-key"]
    profile = REPO / "cluster" / "local.toml"
    ctx = Context(state=StateFile(tmp_path / "state.json"), profile=load_profile(profile), profile_path=profile)

    report = check(ctx, loaded, provider="process", concurrency=2)
    assert isinstance(report, TasksCheck) and report.provider == "process" and report.profile == "local"
    assert [r.task for r in report.rows] == ["good", "needs-key"]
    assert [r.task for r in report.failed] == ["needs-key"] and report.rows[0].oracle.reward == 1
    # `good` wants the internet (Harbor's default) and the local profile's [egress] gives sandboxes none.
    assert report.offline == ("good",)
    assert report.to_dict()["passed"] is False and len(report.to_dict()["tasks"]) == 2


def test_the_stage_refuses_what_it_cannot_check(tmp_path):
    write_task(tmp_path / "a", "same")
    write_task(tmp_path / "b", "same")
    with pytest.raises(Rl360Error, match="task ids appear twice: same"):
        load_tasks([tmp_path / "a", tmp_path / "b"], include=())
    loaded = load_tasks([tmp_path / "a"], include=())
    profile = REPO / "cluster" / "local.toml"
    ctx = Context(state=StateFile(tmp_path / "state.json"), profile=load_profile(profile), profile_path=profile)
    with pytest.raises(Rl360Error, match="--concurrency must be at least 1"):
        check(ctx, loaded, provider="process", concurrency=0)
    with pytest.raises(Rl360Error, match="lists no Docker nodes"):
        check(ctx, loaded, provider="docker", concurrency=1)
    # A Slurm profile whose sandboxes run on each rollout node's own daemon: none is reached from here.
    slurm_docker = REPO / "cluster" / "dev-slurm-docker.toml"
    ctx = Context(state=StateFile(tmp_path / "state.json"), profile=load_profile(slurm_docker),
                  profile_path=slurm_docker)
    with pytest.raises(Rl360Error, match="reaches Docker only on each rollout node") as refused:
        check(ctx, loaded, provider="docker", concurrency=1)
    assert "srun -N1 rl360 tasks check" in str(refused.value)
