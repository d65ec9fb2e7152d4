"""recipes/tasks/shell-train and shell-heldout (recipes/smollm2-agent.toml's pools): the committed folders are what
recipes/tasks/generate_shell.py writes, the two pools share no task, program or argument, and each verifier
passes its oracle's result and fails a no-op and a near miss (run here, on a copy of the task's /app; the
sandboxed check is `rl360 tasks check`, docs/recipes.md)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.conftest import REPO

TASKS = REPO / "recipes" / "tasks"
GENERATOR = TASKS / "generate_shell.py"
POOLS = {"train": TASKS / "shell-train", "heldout": TASKS / "shell-heldout"}


@pytest.mark.parametrize("pool", ["train", "heldout"])
def test_the_committed_tasks_are_what_the_generator_writes(pool):
    proc = subprocess.run([sys.executable, str(GENERATOR), "--check", *(["--heldout"] if pool == "heldout" else [])],
                          capture_output=True, text=True, timeout=60, cwd=REPO, check=False)
    assert proc.returncode == 0, proc.stderr


def _programs(folder: Path) -> dict[str, str]:
    return {d.name: tomllib.loads((d / "task.toml").read_text())["metadata"]["program"]
            for d in sorted(folder.iterdir()) if d.is_dir()}


def test_the_pools_share_no_task_program_or_word():
    train, held = _programs(POOLS["train"]), _programs(POOLS["heldout"])
    assert len(train) == 45 and len(held) == 18
    assert not set(train) & set(held)
    assert not set(train.values()) & set(held.values())
    # No word or file name of one pool's programs is in the other's (the commands' own words aside).
    words = lambda programs: {w for p in programs.values() for w in re.findall(r"[a-z]{4,}", p)}
    shared = words(train) & words(held)
    assert shared <= {"echo", "print", "mkdir"}, shared
    # No instruction shows another pool's answer: its hint is its own call or command, or an example's.
    for folder in POOLS.values():
        for task in folder.iterdir():
            text = (task / "instruction.md").read_text()
            others = held if folder == POOLS["train"] else train
            assert not [p for p in others.values() if p in text], task.name


def verdict(task: Path, tmp_path: Path, command: str | None) -> str:
    """Reward of `task`'s verifier after `command` (None: nothing) ran in a copy of its /app."""
    app = tmp_path / task.name / "app"
    shutil.rmtree(app.parent, ignore_errors=True)
    app.mkdir(parents=True)
    for f in (task / "environment").glob("*"):
        if f.name != "Dockerfile":
            shutil.copy(f, app / f.name)
    if command:
        subprocess.run(["bash", "-c", command], cwd=app, capture_output=True, timeout=10, check=False)
    reward = app.parent / "reward.txt"
    env = {"RL360_APP_DIR": str(app), "RL360_REWARD_FILE": str(reward), "PATH": "/usr/bin:/bin"}
    subprocess.run(["bash", str(task / "tests" / "test.sh")], env=env, capture_output=True, timeout=30, check=True)
    return reward.read_text().strip()


def test_each_kind_of_task_passes_its_oracle_and_fails_a_no_op_and_a_near_miss(tmp_path):
    seen = set()
    for task in sorted(POOLS["train"].iterdir()):
        kind = task.name.rsplit("-", 1)[0]
        if kind in seen:
            continue
        seen.add(kind)
        command = tomllib.loads((task / "task.toml").read_text())["metadata"]["program"]
        assert verdict(task, tmp_path, command) == "1", task.name
        assert verdict(task, tmp_path, None) == "0", task.name
        # The right file with a wrong word, or the word in another file: exact content is checked.
        near = re.sub(r"(\w+)(\.(?:txt|py))(?!.*\.(?:txt|py))", r"\1x\2", command) if "mkdir" not in command \
            else command + "x"  # the last file named (where the result goes) moved, or another directory
        assert verdict(task, tmp_path, near) == "0", (task.name, near)
    assert len(seen) == 9
