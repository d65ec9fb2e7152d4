"""Write the shell task sets of recipes/smollm2-agent.toml: shell-train (the training pool, 261 tasks) and
shell-heldout (the held-out pool, 18 tasks), Harbor tasks a 135M instruct model can do in one or two
bash tool calls: write a word to a file, create a file, append a line, copy, rename or upper-case a file,
make a directory, write or fix a one-line Python script.

shell-heldout has 2 easy tasks of each of the 9 kinds. shell-train has every kind at every hint level
(call, command, example, none: LEVELS, NONE; and template, TEMPLATE, a bridge that held-out tasks never show)
and three difficulties (`[metadata] difficulty`, tag
`difficulty-<d>`): easy, one short command (the first 45 tasks, as calibrated on 2026-12-06, and 2 of each
kind with no hint); medium, one command with more to get right (a path, a flag, a third word, a number);
hard, two steps joined by `&&` (VARIANTS). Medium and hard tasks are 2 of each kind, level and difficulty.

    .venv/bin/python recipes/tasks/generate_shell.py            # (re)write recipes/tasks/shell-train
    .venv/bin/python recipes/tasks/generate_shell.py --check    # exit 1 if the committed tasks differ, or if a
                                                                # training task overlaps a held-out one
    .venv/bin/python recipes/tasks/generate_shell.py --heldout [--check]   # the same for shell-heldout

Deterministic (fixed seeds), like generate_arith.py: the committed folders are exactly what this script
writes (tests/recipes/test_shell_tasks.py checks it). The two pools draw their words and file names from
disjoint lists, so they share no task, no argument and no program (the oracle's command); the example
each instruction shows uses a third list, so no instruction shows another task's answer either. `--check`
reads both committed folders and refuses a training task that repeats a held-out one (its name, its program,
its ask) or shares an argument word with one (`overlaps`), however it got there.
Each task folder holds task.toml, instruction.md, tests/test.sh (the verifier: checks the files under /app
exactly, or a script's output, and writes /logs/verifier/reward.txt), solution/solve.sh (the oracle) and,
for a task that starts from files, environment/ (a Dockerfile that copies them into /app, and the files).
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import tomllib
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
# The training pool's growth (issue 49): tasks of each (kind, level) at the harder difficulties, and easy ones
# with no hint, drawn after the first 45 from a seed of their own (so those 45 stay as calibrated).
NUM_GROWN = 2
GROWN_SEED = "shell-train-grown-360"
# The bridge level's tasks (TEMPLATE), per kind and difficulty, after the growth, from a seed of their own.
NUM_TEMPLATE = 2
TEMPLATE_SEED = "shell-train-template-360"
# Words of the programs that are the commands' own (and Python's), not a task's arguments: `overlaps` allows these.
COMMAND_WORDS = frozenset({"echo", "printf", "print", "mkdir", "touch", "python", "range", "prnt", "sed", "cat",
                           "tmp", "for", "txt"})


@dataclass(frozen=True)
class Task:
    """One task: what the instruction asks, the oracle's command, the starting files, and what must hold after."""

    family: str
    instruction: str  # what to do; instruction.md adds a hint of the task's level (LEVELS)
    command: str
    start: dict[str, str]  # file name under /app -> content
    expect: dict  # the verifier's spec: files (exact content), absent, dirs, run (script, stdout)
    level: str = ""
    difficulty: str = "easy"


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


# Medium: one command with more to get right. Hard: two steps joined by `&&`. Each keeps its kind's name.
def write_word_medium(rng, words, stems) -> Task:
    w, f = rng.choice(words), _file(rng, stems)
    return Task("write-word", f"Write the word {w} to the file {f}, with no newline after it.", f"printf {w} > {f}",
                {}, {"files": {f: w}}, difficulty="medium")


def write_word_hard(rng, words, stems) -> Task:
    d, (w, f) = rng.choice(stems), (rng.choice(words), _file(rng, stems))
    return Task("write-word", f"Make a directory named {d} and write the word {w} to the file {f} inside it.",
                f"mkdir {d} && echo {w} > {d}/{f}", {}, {"files": {f"{d}/{f}": f"{w}\n"}}, difficulty="hard")


def two_words_medium(rng, words, stems) -> Task:
    w1, w2, w3 = rng.sample(words, 3)
    f = _file(rng, stems)
    return Task("two-words", f"Create a file named {f} containing the text {w1} {w2} {w3}.",
                f"echo '{w1} {w2} {w3}' > {f}", {}, {"files": {f: f"{w1} {w2} {w3}\n"}}, difficulty="medium")


def two_words_hard(rng, words, stems) -> Task:
    w1, w2 = rng.sample(words, 2)
    f = _file(rng, stems)
    return Task("two-words", f"Create a file named {f} with two lines: {w1} on the first and {w2} on the second.",
                f"echo {w1} > {f} && echo {w2} >> {f}", {}, {"files": {f: f"{w1}\n{w2}\n"}}, difficulty="hard")


def append_line_medium(rng, words, stems) -> Task:
    a, b = _two_files(rng, stems)
    w1, w2 = rng.sample(words, 2)
    return Task("append-line", f"The files {a} and {b} hold one line each. Append the line of {b} to the end of {a}.",
                f"cat {b} >> {a}", {a: f"{w1}\n", b: f"{w2}\n"}, {"files": {a: f"{w1}\n{w2}\n"}},
                difficulty="medium")


def append_line_hard(rng, words, stems) -> Task:
    first, w1, w2 = rng.sample(words, 3)
    f = _file(rng, stems)
    return Task("append-line", f"The file {f} holds one line. Append the lines {w1} and {w2} to it, in that order.",
                f"echo {w1} >> {f} && echo {w2} >> {f}", {f: f"{first}\n"}, {"files": {f: f"{first}\n{w1}\n{w2}\n"}},
                difficulty="hard")


def copy_file_medium(rng, words, stems) -> Task:
    d, src = rng.sample(stems, 2)
    src, w = f"{src}.txt", rng.choice(words)
    return Task("copy-file", f"Copy the file {src} into the directory {d}, which already exists, keeping its name.",
                f"cp {src} {d}/", {src: f"{w}\n", f"{d}/.keep": ""}, {"files": {src: f"{w}\n", f"{d}/{src}": f"{w}\n"}},
                difficulty="medium")


def copy_file_hard(rng, words, stems) -> Task:
    d, src = rng.sample(stems, 2)
    src, w = f"{src}.txt", rng.choice(words)
    return Task("copy-file", f"Make a directory named {d} and copy the file {src} into it.",
                f"mkdir {d} && cp {src} {d}/", {src: f"{w}\n"}, {"files": {src: f"{w}\n", f"{d}/{src}": f"{w}\n"}},
                difficulty="hard")


def rename_file_medium(rng, words, stems) -> Task:
    d, src = rng.sample(stems, 2)
    src, w = f"{src}.txt", rng.choice(words)
    return Task("rename-file", f"Move the file {src} into the directory {d}, which already exists.",
                f"mv {src} {d}/", {src: f"{w}\n", f"{d}/.keep": ""},
                {"files": {f"{d}/{src}": f"{w}\n"}, "absent": [src]},
                difficulty="medium")


def rename_file_hard(rng, words, stems) -> Task:
    a, b, c, e = (f"{stem}.txt" for stem in rng.sample(stems, 4))
    w1, w2 = rng.sample(words, 2)
    return Task("rename-file", f"Rename the file {a} to {b} and the file {c} to {e}.", f"mv {a} {b} && mv {c} {e}",
                {a: f"{w1}\n", c: f"{w2}\n"}, {"files": {b: f"{w1}\n", e: f"{w2}\n"}, "absent": [a, c]},
                difficulty="hard")


def make_dir_medium(rng, words, stems) -> Task:
    outer, inner = rng.sample(stems, 2)
    return Task("make-dir", f"Make a directory named {outer} with a directory named {inner} inside it.",
                f"mkdir -p {outer}/{inner}", {}, {"dirs": [f"{outer}/{inner}"]}, difficulty="medium")


def make_dir_hard(rng, words, stems) -> Task:
    d1, d2, f = rng.sample(stems, 3)
    return Task("make-dir", f"Make the directories {d1} and {d2}, and an empty file {f}.txt inside {d2}.",
                f"mkdir {d1} {d2} && touch {d2}/{f}.txt", {}, {"dirs": [d1, d2], "files": {f"{d2}/{f}.txt": ""}},
                difficulty="hard")


def upper_case_medium(rng, words, stems) -> Task:
    w, f = rng.choice(words), _file(rng, stems)
    return Task("upper-case", f"Write the word {w} in upper case to the file {f}.", f"echo {w.upper()} > {f}", {},
                {"files": {f: f"{w.upper()}\n"}}, difficulty="medium")


def upper_case_hard(rng, words, stems) -> Task:
    w, f = rng.choice(words), _file(rng, stems)
    return Task("upper-case", f"The file {f} holds a word. Change the file so that it holds that word in upper case.",
                f"tr a-z A-Z < {f} > {f}.tmp && mv {f}.tmp {f}", {f: f"{w}\n"}, {"files": {f: f"{w.upper()}\n"}},
                difficulty="hard")


def python_print_medium(rng, words, stems) -> Task:
    a, b, f = rng.randint(2, 49), rng.randint(2, 49), _file(rng, stems, "py")
    return Task("python-print", f"Write a Python script {f} that prints the sum of {a} and {b}.",
                f"echo 'print({a} + {b})' > {f}", {}, {"run": {"script": f, "stdout": f"{a + b}\n"}},
                difficulty="medium")


def python_print_hard(rng, words, stems) -> Task:
    w, n, f = rng.choice(words), rng.randint(2, 5), _file(rng, stems, "py")
    return Task("python-print", f"Write a Python script {f} that prints the word {w} {n} times, one per line.",
                f"echo 'for i in range({n}): print(\"{w}\")' > {f}", {}, {"run": {"script": f, "stdout": f"{w}\n" * n}},
                difficulty="hard")


def python_fix_medium(rng, words, stems) -> Task:
    w, f = rng.choice(words), _file(rng, stems, "py")
    return Task("python-fix", f"The Python script {f} should print {w} but calls prnt instead of print. Fix it.",
                f"sed -i 's/prnt/print/' {f}", {f: f'prnt("{w}")\n'}, {"run": {"script": f, "stdout": f"{w}\n"}},
                difficulty="medium")


def python_fix_hard(rng, words, stems) -> Task:
    wrong, w = rng.sample(words, 2)
    f, out = _file(rng, stems, "py"), _file(rng, stems)
    return Task("python-fix", f"The Python script {f} prints {wrong}. Change it so that it prints {w} instead, then "
                f"run it and save what it prints to the file {out}.",
                f"sed -i 's/{wrong}/{w}/' {f} && python3 {f} > {out}",
                {f: f'print("{wrong}")\n'}, {"run": {"script": f, "stdout": f"{w}\n"}, "files": {out: f"{w}\n"}},
                difficulty="hard")


# The harder difficulties of each kind, by kind.
VARIANTS = {family: {"medium": globals()[f"{family.__name__}_medium"], "hard": globals()[f"{family.__name__}_hard"]}
            for family in FAMILIES}


def example_of(family) -> Task:
    """The family's (or variant's) example, shown in each of its instructions: the examples' own words and names."""
    return family(random.Random(f"example-{family.__name__}"), EXAMPLE_WORDS, EXAMPLE_STEMS)


# How much of the answer an instruction shows (docs/recipes.md, "The shell task sets"): SmolLM2-135M-Instruct
# almost never writes a tool call its chat template did not show it (its template renders no tools), so the
# easiest tasks show the whole call; harder ones show the command, or the same kind of command on other names.
LEVELS = ("call", "command", "example")
# No hint at all: the instruction alone (training pool only, from the growth on).
NONE = "none"
# A bridge from the call to the command (training pool only): the command, and the call's shape with a
# placeholder where the command goes. The policy learns to copy a shown call but, shown only the command, copies
# "The command is: ..." back instead of calling the tool (docs/benchmarks.md, "SmolLM2 agent: learning past the
# format"); filling a placeholder is the step between. Policy v0 passed 7 of 204 such attempts, 0 of the
# command level's.
TEMPLATE = "template"


def instruction(task: Task, example: Task, level: str) -> str:
    if level == NONE:
        return f"{task.instruction}\n"
    if level == "call":
        call = json.dumps({"name": "bash", "arguments": {"command": task.command}})
        return f"{task.instruction}\nCall the bash tool with exactly this:\n<tool_call>{call}</tool_call>\n"
    if level == "command":
        return f"{task.instruction}\nThe command is: {task.command}\n"
    if level == TEMPLATE:
        shape = json.dumps({"name": "bash", "arguments": {"command": "COMMAND"}}).replace('"COMMAND"', "COMMAND")
        return (f"{task.instruction}\nThe command is: {task.command}\n"
                f"Reply with <tool_call>{shape}</tool_call>, with COMMAND the command in double quotes.\n")
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
    if pool != "train":
        return chosen
    grown = grown_tasks(chosen)
    return chosen + grown + template_tasks(chosen + grown)


def grown_tasks(first: list[Task]) -> list[Task]:
    """The training pool's growth: for each kind, `NUM_GROWN` easy tasks with no hint, and `NUM_GROWN` tasks of each
    hint level (call, command, example, none) at each harder difficulty, none asking or running what another
    training task does."""
    rng = random.Random(GROWN_SEED)
    wanted = [(make, level) for family in FAMILIES
              for make, level in [(family, NONE)] * NUM_GROWN + [(VARIANTS[family][difficulty], level)
                                                                 for difficulty in ("medium", "hard")
                                                                 for level in (*LEVELS, NONE)
                                                                 for _ in range(NUM_GROWN)]]
    return _new_tasks(wanted, rng, first)


def template_tasks(earlier: list[Task]) -> list[Task]:
    """The bridge level's tasks: for each kind, `NUM_TEMPLATE` at each difficulty, none asking or running what
    another training task does."""
    wanted = [(make, TEMPLATE) for family in FAMILIES
              for make in (family, VARIANTS[family]["medium"], VARIANTS[family]["hard"]) for _ in range(NUM_TEMPLATE)]
    return _new_tasks(wanted, random.Random(TEMPLATE_SEED), earlier)


def _new_tasks(wanted: list[tuple], rng: random.Random, earlier: list[Task]) -> list[Task]:
    """One task of each (maker, level) in `wanted`, drawn again until it asks and runs what no task before did."""
    seen = {t.instruction for t in earlier} | {t.command for t in earlier}
    made = []
    for make, level in wanted:
        task = make(rng, TRAIN_WORDS, TRAIN_STEMS)
        while task.instruction in seen or task.command in seen:
            task = make(rng, TRAIN_WORDS, TRAIN_STEMS)
        seen |= {task.instruction, task.command}
        made.append(replace(task, level=level))
    return made


TASK_TOML = """\
schema_version = "1.1"

[task]
name = "rl360/{name}"
description = "{description}"
authors = []
keywords = ["shell", "files", "{family}"]

[metadata]
author_name = "rl360"
difficulty = "{difficulty}"
category = "shell"
tags = ["{tag}", "{family}", "hint-{level}"{difficulty_tag}]
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
    family = FAMILY_BY_NAME[task.family]
    example = example_of(family if task.difficulty == "easy" else VARIANTS[family][task.difficulty])
    # The training pool's tasks say their difficulty as a tag too (the figures per tag); the held-out pool's are
    # all easy, and stay as they were measured.
    difficulty_tag = f', "difficulty-{task.difficulty}"' if tag == "shell-train" else ""
    files = {
        "task.toml": TASK_TOML.format(name=name, description=task.instruction, family=task.family, tag=tag, level=task.level,
                                      difficulty=task.difficulty, difficulty_tag=difficulty_tag,
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
    """Every file of the pool, by path relative to its folder (task folders `<family>-NN` for easy tasks,
    `<family>-<difficulty>-NN` for the others, or `heldout-<family>-NN`: no name in both pools)."""
    prefix, tag = ("", "shell-train") if pool == "train" else ("heldout-", "shell-heldout")
    files, counts = {}, {}
    for task in tasks(pool):
        kind = task.family if task.difficulty == "easy" else f"{task.family}-{task.difficulty}"
        index = counts[kind] = counts.get(kind, -1) + 1
        name = f"{prefix}{kind}-{index:02d}"
        files.update({f"{name}/{rel}": text for rel, text in task_files(name, task, tag).items()})
    return files


def committed(folder: Path) -> dict[str, tuple[str, str]]:
    """Each task folder's (program, ask: the instruction's first line) as committed."""
    return {d.name: (tomllib.loads((d / "task.toml").read_text())["metadata"]["program"],
                     (d / "instruction.md").read_text().split("\n", 1)[0])
            for d in sorted(folder.iterdir()) if (d / "task.toml").is_file()}


def argument_words(program: str) -> set[str]:
    """The words and file names a program acts on (the commands' own words aside)."""
    return {w for w in re.findall(r"[a-z]{3,}", program.lower()) if w not in COMMAND_WORDS}


def overlaps(train: Path, heldout: Path) -> list[str]:
    """One line per training task that repeats a held-out task (its folder name, its program or its ask) or acts
    on one of the held-out tasks' words or file names; none for disjoint pools."""
    held = committed(heldout)
    by_program = {program: name for name, (program, _) in held.items()}
    by_ask = {ask: name for name, (_, ask) in held.items()}
    held_words = {w: name for name, (program, _) in held.items() for w in argument_words(program)}
    problems = []
    for name, (program, ask) in committed(train).items():
        if name in held:
            problems.append(f"{name}: a held-out task has the same name")
        if program in by_program:
            problems.append(f"{name}: duplicates held-out task {by_program[program]} (the same program: {program})")
        if ask in by_ask:
            problems.append(f"{name}: duplicates held-out task {by_ask[ask]} (the same ask: {ask})")
        shared = sorted(argument_words(program) & held_words.keys())
        if shared:
            problems.append(f"{name}: shares {', '.join(shared)} with held-out task {held_words[shared[0]]}")
    return problems


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
        # The committed pools, whoever wrote them: no training task may repeat a held-out one.
        train, heldout = (TRAIN_OUT, out) if args.heldout else (out, HELDOUT_OUT)
        overlapping = overlaps(train, heldout)
        for line in overlapping:
            print(f"overlaps the held-out pool: {line}", file=sys.stderr)
        return 1 if stale or extra or overlapping else 0
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
