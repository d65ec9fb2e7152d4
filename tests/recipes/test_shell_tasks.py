"""recipes/tasks/shell-train and shell-heldout (recipes/smollm2-agent.toml's pools): the committed folders are what
recipes/tasks/generate_shell.py writes, the two pools share no task, program or argument (and `--check` refuses a
training task that repeats a held-out one), the training pool has every kind at every hint level and
difficulty, and each verifier passes its oracle's result and fails a no-op and a near miss (run here, on a copy
of the task's /app; the sandboxed check is `rl360 tasks check`, docs/recipes.md)."""

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
    assert len(train) == 261 and len(held) == 18
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


def _metadata(task: Path) -> dict:
    return tomllib.loads((task / "task.toml").read_text())["metadata"]


def test_the_training_pool_has_every_kind_at_every_hint_level_and_difficulty():
    found: dict[tuple[str, str, str], int] = {}
    for task in POOLS["train"].iterdir():
        meta = _metadata(task)
        kind, level = meta["tags"][1], meta["tags"][2]
        assert meta["tags"][3] == f"difficulty-{meta['difficulty']}", task.name
        found[kind, level, meta["difficulty"]] = found.get((kind, level, meta["difficulty"]), 0) + 1
        if level == "hint-none":  # the instruction alone: nothing of the command is shown
            assert (task / "instruction.md").read_text().count("\n") == 1 and meta["program"] not in \
                (task / "instruction.md").read_text(), task.name
    kinds = {key[0] for key in found}
    assert len(kinds) == 9
    wanted = {(k, f"hint-{level}", d) for k in kinds for level in ("call", "command", "example", "none", "template")
              for d in ("easy", "medium", "hard")}
    assert set(found) == wanted
    # Several tasks of each harder (kind, level, difficulty): a pool has more than one to learn each from.
    assert min(n for (_, _, d), n in found.items() if d != "easy") == 2


def test_check_refuses_a_training_task_that_repeats_a_held_out_one(tmp_path):
    copy = tmp_path / "shell-train"
    shutil.copytree(POOLS["train"], copy)

    def check() -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(GENERATOR), "--check", "--out", str(copy)], capture_output=True,
                              text=True, timeout=60, cwd=REPO, check=False)

    assert check().returncode == 0
    # A held-out task put into the training pool under a training name, its hint changed to the command's.
    held = POOLS["heldout"] / "heldout-copy-file-00"
    shutil.copytree(held, copy / "copy-file-99")
    program = _metadata(held)["program"]
    ask = (held / "instruction.md").read_text().split("\n", 1)[0]
    (copy / "copy-file-99" / "instruction.md").write_text(f"{ask}\nThe command is: {program}\n")
    proc = check()
    assert proc.returncode == 1
    assert f"overlaps the held-out pool: copy-file-99: duplicates held-out task heldout-copy-file-00 (the same " \
           f"program: {program})" in proc.stderr
    # The same program in a training task of its own name, with its ask reworded, is refused too.
    shutil.rmtree(copy / "copy-file-99")
    toml = (copy / "copy-file-00" / "task.toml").read_text()
    (copy / "copy-file-00" / "task.toml").write_text(toml.replace(_metadata(copy / "copy-file-00")["program"], program))
    proc = check()
    assert proc.returncode == 1 and "copy-file-00: duplicates held-out task heldout-copy-file-00" in proc.stderr


def verdict(task: Path, tmp_path: Path, command: str | None) -> str:
    """Reward of `task`'s verifier after `command` (None: nothing) ran in a copy of its /app."""
    app = tmp_path / task.name / "app"
    shutil.rmtree(app.parent, ignore_errors=True)
    app.mkdir(parents=True)
    for f in (task / "environment").rglob("*"):
        if f.is_file() and f.name != "Dockerfile":  # a start file may be in a folder (a directory that exists)
            (app / f.relative_to(task / "environment")).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(f, app / f.relative_to(task / "environment"))
    if command:
        subprocess.run(["bash", "-c", command], cwd=app, capture_output=True, timeout=10, check=False)
    reward = app.parent / "reward.txt"
    env = {"RL360_APP_DIR": str(app), "RL360_REWARD_FILE": str(reward), "PATH": "/usr/bin:/bin"}
    subprocess.run(["bash", str(task / "tests" / "test.sh")], env=env, capture_output=True, timeout=30, check=True)
    return reward.read_text().strip()


def test_each_kind_of_task_passes_its_oracle_and_fails_a_no_op_and_a_near_miss(tmp_path):
    seen = set()
    for task in sorted(POOLS["train"].iterdir()):
        kind = task.name.rsplit("-", 1)[0]  # a kind at a difficulty: copy-file, copy-file-medium, ...
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
    assert len(seen) == 27
