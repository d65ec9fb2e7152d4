"""Write the shell task sets of recipes/smollm2-agent.toml: shell-train (the training pool, 45 tasks) and
shell-heldout (the held-out pool, 18 tasks), Harbor tasks a 135M instruct model can do in one or two
bash tool calls: write a word to a file, create a file, append a line, copy, rename or upper-case a file,
make a directory, write or fix a one-line Python script.

    .venv/bin/python recipes/tasks/generate_shell.py            # (re)write recipes/tasks/shell-train
    .venv/bin/python recipes/tasks/generate_shell.py --check    # exit 1 if the committed tasks differ
    .venv/bin/python recipes/tasks/generate_shell.py --heldout [--check]   # the same for shell-heldout

Deterministic (fixed seeds), like generate_arith.py: the committed folders are exactly what this script
writes (tests/recipes/test_shell_tasks.py checks it). The two pools draw their words and file names from
disjoint lists, so they share no task, no argument and no program (the oracle's command); the example
each instruction shows uses a third list, so no instruction shows another task's answer either.
Each task folder holds task.toml, instruction.md, tests/test.sh (the verifier: checks the files under /app
exactly, or a script's output, and writes /logs/verifier/reward.txt), solution/solve.sh (the oracle) and,
for a task that starts from files, environment/ (a Dockerfile that copies them into /app, and the files).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from dataclasses import dataclass, replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
TRAIN_OUT = HERE / "shell-train"
HELDOUT_OUT = HERE / "shell-heldout"
IMAGE = "127.0.0.1:5000/rl360/python:3.11"

# Disjoint vocabularies: the training pool's, the held-out pool's, and the examples' (shown in instructions).
TRAIN_WORDS = ["apple", "river", "stone", "cloud", "tiger", "maple", "candle", "silver", "orange", "garden",
               "rocket", "pepper", "violet", "anchor", "button", "forest", "hammer", "island", "jacket", "lemon"]
HELDOUT_WORDS = ["banana", "desert", "falcon", "harbor", "meadow", "pencil", "walnut", "copper", "dragon", "planet"]
EXAMPLE_WORDS = ["hello", "world", "sample", "test"]
TRAIN_STEMS = ["fruit", "notes", "color", "animal", "plant", "city", "todo", "list", "name", "word",
               "data", "items", "log", "memo", "result", "out", "info", "draft", "record", "entry"]
HELDOUT_STEMS = ["answer", "message", "summary", "report", "letter", "story", "label", "title", "card", "page"]
EXAMPLE_STEMS = ["greeting", "example", "demo", "sample"]
NUM_PER_FAMILY = {"train": 5, "heldout": 2}
SEEDS = {"train": "shell-train-360", "heldout": "shell-heldout-360"}


@dataclass(frozen=True)
class Task:
    """One task: what the instruction asks, the oracle's command, the starting files, and what must hold after."""

    family: str
    instruction: str  # what to do; instruction.md adds a hint of the task's level (LEVELS)
    command: str
    start: dict[str, str]  # file name under /app -> content
    expect: dict  # the verifier's spec: files (exact content), absent, dirs, run (script, stdout)
    level: str = ""


def _file(rng: random.Random, stems: list[str], ext: str = "txt") -> str:
    return f"{rng.choice(stems)}.{ext}"


def _two_files(rng: random.Random, stems: list[str]) -> tuple[str, str]:
    a, b = rng.sample(stems, 2)
    return f"{a}.txt", f"{b}.txt"


# Each family: (rng, words, stems) -> the task's arguments; its text, command, start files and checks.
def write_word(rng, words, stems) -> Task:
    w, f = rng.choice(words), _file(rng, stems)
    return Task("write-word", f"Write the word {w} to the file {f}.", f"echo {w} > {f}", {},
                {"files": {f: f"{w}\n"}})


def two_words(rng, words, stems) -> Task:
    w1, w2 = rng.sample(words, 2)
    f = _file(rng, stems)
    return Task("two-words", f"Create a file named {f} containing the text {w1} {w2}.", f"echo '{w1} {w2}' > {f}",
                {}, {"files": {f: f"{w1} {w2}\n"}})


def append_line(rng, words, stems) -> Task:
    first, w = rng.sample(words, 2)
    f = _file(rng, stems)
    return Task("append-line", f"The file {f} holds one line. Append the line {w} to it.", f"echo {w} >> {f}",
                {f: f"{first}\n"}, {"files": {f: f"{first}\n{w}\n"}})


def copy_file(rng, words, stems) -> Task:
    src, dst = _two_files(rng, stems)
    w = rng.choice(words)
    return Task("copy-file", f"Copy the file {src} to a new file named {dst}.", f"cp {src} {dst}", {src: f"{w}\n"},
                {"files": {src: f"{w}\n", dst: f"{w}\n"}})


def rename_file(rng, words, stems) -> Task:
    src, dst = _two_files(rng, stems)
    w = rng.choice(words)
    return Task("rename-file", f"Rename the file {src} to {dst}.", f"mv {src} {dst}", {src: f"{w}\n"},
                {"files": {dst: f"{w}\n"}, "absent": [src]})


def make_dir(rng, words, stems) -> Task:
    d = rng.choice(stems + words)
    return Task("make-dir", f"Make a directory named {d}.", f"mkdir {d}", {}, {"dirs": [d]})


def upper_case(rng, words, stems) -> Task:
    src, dst = _two_files(rng, stems)
    w = rng.choice(words)
    return Task("upper-case", f"The file {src} holds a word. Write that word in upper case to the file {dst}.",
                f"tr a-z A-Z < {src} > {dst}", {src: f"{w}\n"}, {"files": {dst: f"{w.upper()}\n"}})


def python_print(rng, words, stems) -> Task:
    w, f = rng.choice(words), _file(rng, stems, "py")
    return Task("python-print", f"Write a Python script {f} that prints the word {w}.",
                f"echo 'print(\"{w}\")' > {f}", {}, {"run": {"script": f, "stdout": f"{w}\n"}})


def python_fix(rng, words, stems) -> Task:
    wrong, w = rng.sample(words, 2)
    f = _file(rng, stems, "py")
    return Task("python-fix", f"The Python script {f} prints {wrong}. Change it so that it prints {w} instead.",
                f"sed -i 's/{wrong}/{w}/' {f}", {f: f'print("{wrong}")\n'},
                {"run": {"script": f, "stdout": f"{w}\n"}})


FAMILIES = [write_word, two_words, append_line, copy_file, rename_file, make_dir, upper_case, python_print,
            python_fix]
FAMILY_BY_NAME = {f.__name__.replace("_", "-"): f for f in FAMILIES}


def example_of(family) -> Task:
    """The family's example, shown in each of its instructions: the examples' own words and names."""
    return family(random.Random(f"example-{family.__name__}"), EXAMPLE_WORDS, EXAMPLE_STEMS)


# How much of the answer an instruction shows (docs/recipes.md, "The shell task sets"): SmolLM2-135M-Instruct
# almost never writes a tool call its chat template did not show it (its template renders no tools), so the
# easiest tasks show the whole call; harder ones show the command, or the same kind of command on other names.
LEVELS = ("call", "command", "example")


def instruction(task: Task, example: Task, level: str) -> str:
    if level == "call":
        call = json.dumps({"name": "bash", "arguments": {"command": task.command}})
        return f"{task.instruction}\nCall the bash tool with exactly this:\n<tool_call>{call}</tool_call>\n"
    if level == "command":
        return f"{task.instruction}\nThe command is: {task.command}\n"
    return f"{task.instruction}\nExample: for \"{example.instruction}\" the command is: {example.command}\n"


def tasks(pool: str) -> list[Task]:
    """The pool's tasks, distinct in what they ask; `pool` is "train" or "heldout"."""
    words, stems = (TRAIN_WORDS, TRAIN_STEMS) if pool == "train" else (HELDOUT_WORDS, HELDOUT_STEMS)
    rng = random.Random(SEEDS[pool])
    chosen, seen = [], set()
    for f, family in enumerate(FAMILIES):
        taken = 0
        while taken < NUM_PER_FAMILY[pool]:
            task = family(rng, words, stems)
            if task.instruction in seen:
                continue
            seen.add(task.instruction)
            # Levels rotate within a family and across families: each pool holds every (family, level) pair
            # about equally often.
            chosen.append(replace(task, level=LEVELS[(f + taken) % len(LEVELS)]))
            taken += 1
    return chosen


TASK_TOML = """\
schema_version = "1.1"

[task]
name = "rl360/{name}"
description = "{description}"
authors = []
keywords = ["shell", "files", "{family}"]

[metadata]
author_name = "rl360"
difficulty = "easy"
category = "shell"
tags = ["{tag}", "{family}", "hint-{level}"]
# Generated by recipes/tasks/generate_shell.py; the oracle's command.
program = {program}

[verifier]
timeout_sec = 10.0

[agent]
timeout_sec = 60.0

[environment]
{image_line}workdir = "/app"
build_timeout_sec = 60.0
cpus = 0.5
memory_mb = 256
storage_mb = 64
# Nothing here needs the internet: the sandbox gets no network.
network_mode = "no-network"
gpus = 0
mcp_servers = []

[verifier.env]

[environment.env]

[solution.env]
"""

DOCKERFILE = """\
# The shell tasks' sandbox image, with the files this task starts from.
FROM {image}
WORKDIR /app
{copies}
"""

# The verifier: standard library only, ~10 ms. RL360_APP_DIR / RL360_REWARD_FILE move /app and the reward
# file, for tests outside a sandbox.
TEST_SH = """\
#!/bin/bash
# Verifier of rl360/{name} (generated by recipes/tasks/generate_shell.py): {description}
# Writes /logs/verifier/reward.txt: 1 when every file under /app is exactly as asked, else 0.
exec python3 -I -S - "${{RL360_APP_DIR:-/app}}" "${{RL360_REWARD_FILE:-/logs/verifier/reward.txt}}" <<'PY'
import os
import subprocess
import sys

EXPECT = {expect}

app, reward_path = sys.argv[1], sys.argv[2]
os.makedirs(os.path.dirname(reward_path) or ".", exist_ok=True)
# Written first, so that a crash below still leaves reward 0.
with open(reward_path, "w") as f:
    f.write("0\\n")


def problems():
    for name, content in EXPECT.get("files", {{}}).items():
        try:
            with open(os.path.join(app, name), errors="replace") as f:
                got = f.read(4096)
        except OSError as err:
            yield f"{{name}}: {{err.strerror}}"
            continue
        if got != content:
            yield f"{{name}} holds {{got[:80]!r}}, not {{content!r}}"
    for name in EXPECT.get("absent", []):
        if os.path.lexists(os.path.join(app, name)):
            yield f"{{name}} is still there"
    for name in EXPECT.get("dirs", []):
        if not os.path.isdir(os.path.join(app, name)):
            yield f"{{name}} is not a directory"
    run = EXPECT.get("run")
    if run:
        try:
            done = subprocess.run([sys.executable, "-I", "-S", run["script"]], cwd=app, capture_output=True,
                                  text=True, timeout=5)
        except subprocess.TimeoutExpired:
            yield f"{{run['script']}} ran past 5 s"
            return
        if done.stdout != run["stdout"]:
            yield f"{{run['script']}} printed {{done.stdout[:80]!r}}, not {{run['stdout']!r}}"


found = list(problems())
print("\\n".join(found) or "pass")
with open(reward_path, "w") as f:
    f.write("0\\n" if found else "1\\n")
PY
"""

SOLVE_SH = """\
#!/bin/bash
# Oracle of rl360/{name}.
cd /app
{command}
"""


def task_files(name: str, task: Task, tag: str) -> dict[str, str]:
    example = example_of(FAMILY_BY_NAME[task.family])
    files = {
        "task.toml": TASK_TOML.format(name=name, description=task.instruction, family=task.family, tag=tag, level=task.level,
                                      program=json.dumps(task.command),
                                      image_line="" if task.start else f'docker_image = "{IMAGE}"\n'),
        "instruction.md": instruction(task, example, task.level),
        "tests/test.sh": TEST_SH.format(name=name, description=task.instruction, expect=repr(task.expect)),
        "solution/solve.sh": SOLVE_SH.format(name=name, command=task.command),
    }
    if task.start:
        copies = "\n".join(f"COPY {f} /app/{f}" for f in task.start)
        files["environment/Dockerfile"] = DOCKERFILE.format(image=IMAGE, copies=copies)
        files.update({f"environment/{f}": content for f, content in task.start.items()})
    return files


def all_files(pool: str) -> dict[str, str]:
    """Every file of the pool, by path relative to its folder (task folders `<family>-NN`, or
    `heldout-<family>-NN`: no name in both pools)."""
    prefix, tag = ("", "shell-train") if pool == "train" else ("heldout-", "shell-heldout")
    files, counts = {}, {}
    for task in tasks(pool):
        index = counts[task.family] = counts.get(task.family, -1) + 1
        name = f"{prefix}{task.family}-{index:02d}"
        files.update({f"{name}/{rel}": text for rel, text in task_files(name, task, tag).items()})
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="default: shell-train (shell-heldout with --heldout)")
    parser.add_argument("--heldout", action="store_true", help="the held-out pool instead of the training pool")
    parser.add_argument("--check", action="store_true", help="compare with the folder instead of writing")
    args = parser.parse_args(argv)
    pool = "heldout" if args.heldout else "train"
    out = args.out or (HELDOUT_OUT if args.heldout else TRAIN_OUT)
    files = all_files(pool)
    if args.check:
        stale = [rel for rel, text in files.items() if not (out / rel).is_file() or (out / rel).read_text() != text]
        extra = sorted(str(p.relative_to(out)) for p in out.rglob("*")
                       if p.is_file() and str(p.relative_to(out)) not in files)  # fmt: skip
        for rel in stale + extra:
            print(f"differs: {rel}", file=sys.stderr)
        return 1 if stale or extra else 0
    for rel, text in files.items():
        path = out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        if path.suffix == ".sh":
            path.chmod(0o755)
    print(f"wrote {len({rel.split('/')[0] for rel in files})} tasks to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
