"""Harbor tasks, fuzzed (hypothesis): folder names with `..`, `/` and odd characters, `include`
names that climb out of the task set, symbolic links in tests/, solution/ and environment/ that
point at host files, instructions of any size up to 50 MB, and reward.json holding NaN, infinity,
strings, nested objects or bytes that are no JSON. Each task loads or is refused with a one-line
`TaskError` that names the task and the fix; each reward file gives finite rewards or the
verifier_error infra cause (masked, never a reward). Case counts: `fuzz(n)`, docs/reliability.md.
"""

from __future__ import annotations

import asyncio
import json
import math
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from rl360cli.outcome import InfraCause, Outcome
from rl360cli.sandbox.attempt import REWARD_JSON, REWARD_TXT, read_reward
from rl360cli.sandbox.task_loader import MAX_INSTRUCTION_BYTES, TaskError, load_task, load_task_set
from rl360cli.sandbox.taxonomy import Event, classify
from tests.sandbox.conftest import write_task


def fuzz(max_examples: int) -> settings:
    """Derandomized (the same cases every run: CI is reproducible, the counts exact), no database."""
    return settings(max_examples=max_examples, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def assert_one_line_refusal(error: TaskError, *, naming: str) -> None:
    message = str(error)
    assert "\n" not in message and naming in message, message


def fresh(tmp_path: Path) -> Path:
    """An empty task set folder (hypothesis runs many cases in one test's tmp_path)."""
    root = tmp_path / "set"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir()
    return root


# Names a file system allows, weighted towards the dangerous ones.
FOLDER_NAMES = st.one_of(
    st.sampled_from(["..", ".", "...", "-rf", ".hidden", "a b", "a\nb", "naïve", "x" * 129, "ok-task_1.2"]),
    st.text(st.characters(blacklist_characters="/\0", blacklist_categories=("Cs",)), min_size=1, max_size=20),
).filter(lambda n: len(n.encode()) < 250)


@fuzz(120)
@given(name=FOLDER_NAMES)
def test_any_folder_name_loads_as_a_plain_id_or_is_refused(tmp_path, name):
    root = fresh(tmp_path)
    try:
        folder = write_task(root, name) if name not in (".", "..") else None
    except OSError:
        assume(False)  # a name this file system refuses to create
    if folder is None:  # `set/t/..` and `set/t/.` name real folders: their ids are those folders' names
        inner = write_task(root, "t")
        leads_to = {"..": root, ".": inner}[name]
        try:
            task = load_task(inner / name)
        except TaskError as e:
            assert_one_line_refusal(e, naming="task")
            assert name == ".."  # `set/` is no task folder (no task.toml)
        else:
            assert task.path == leads_to and task.id == leads_to.name
        return
    try:
        task = load_task(folder)
    except TaskError as e:
        assert_one_line_refusal(e, naming="rename the folder")
    else:
        # What loads is a plain name: usable as a sandbox name, a label and an image tag as it is.
        assert task.id == name and name.isascii() and name.isprintable() and name[0].isalnum()


@fuzz(60)
@given(include=st.lists(st.sampled_from(["../set", "../../etc", "/etc", "hello/../hello", "hello/", "hello", ".",
                                         "..", "*", ""]) | st.text(max_size=12), min_size=1, max_size=3))
def test_include_names_only_folders_of_the_task_set(tmp_path, include):
    root = fresh(tmp_path)
    write_task(root, "hello")
    if not (tmp_path / "etc").exists():  # a task folder beside the set, where `../etc` leads
        write_task(tmp_path, "etc")
    try:
        tasks = load_task_set(root, include=tuple(include))
    except TaskError as e:
        assert_one_line_refusal(e, naming="no task folder named")
        assert set(include) != {"hello"}
    else:
        assert set(include) == {"hello"} and [t.path for t in tasks] == [root / "hello"]


@st.composite
def links(draw):
    """(where in the task the link is, where it points: 'outside' host files, 'inside' files, nothing)."""
    folder = draw(st.sampled_from(["tests", "solution", "environment"]))
    depth = draw(st.sampled_from(["", "sub/"]))
    kind = draw(st.sampled_from(["secret", "host-dir", "etc-passwd", "parent", "loop", "dangling", "inside",
                                 "relative-inside", "whole-folder"]))
    return folder, depth, kind


@fuzz(60)
@given(case=links())
def test_a_link_out_of_the_task_folder_is_refused(tmp_path, case):
    folder_name, depth, kind = case
    root = fresh(tmp_path)
    secret = tmp_path / "state.json"
    secret.write_text('{"secret": true}')
    task = write_task(root, "t", solve_sh="echo hi\n", dockerfile="FROM busybox\n")
    folder = task / folder_name
    (folder / depth).mkdir(parents=True, exist_ok=True)
    link = folder / depth / "link"
    targets = {"secret": str(secret), "host-dir": str(tmp_path), "etc-passwd": "/etc/passwd",
               "parent": "../" * (depth.count("/") + 2) + "state.json", "loop": str(link), "dangling": "/nonexistent",
               "inside": str(task / "instruction.md"), "relative-inside": "../" * (depth.count("/") + 1) + "task.toml"}
    if kind == "whole-folder":
        shutil.rmtree(folder)
        folder.symlink_to(tmp_path)
    else:
        link.symlink_to(targets[kind])
    try:
        loaded = load_task(task)
    except TaskError as e:
        assert kind not in ("inside", "relative-inside"), e
        assert_one_line_refusal(e, naming="outside the task folder")
    else:
        assert kind in ("inside", "relative-inside")
        assert loaded.id == "t"


@fuzz(12)
@given(size=st.sampled_from([0, 1, MAX_INSTRUCTION_BYTES - 1, MAX_INSTRUCTION_BYTES, MAX_INSTRUCTION_BYTES + 1,
                             5 * MAX_INSTRUCTION_BYTES]) | st.integers(0, 3 * MAX_INSTRUCTION_BYTES))
def test_an_instruction_over_the_limit_is_refused_before_it_is_read(tmp_path, size):
    root = fresh(tmp_path)
    task = write_task(root, "t")
    with open(task / "instruction.md", "wb") as f:
        f.truncate(size)  # sparse: no bytes written, the size is what is checked
    try:
        loaded = load_task(task)
    except TaskError as e:
        assert size > MAX_INSTRUCTION_BYTES
        assert_one_line_refusal(e, naming="shorten it")
    else:
        assert size <= MAX_INSTRUCTION_BYTES and len(loaded.instruction) == size


def test_a_50_mb_instruction_is_refused(tmp_path):
    task = write_task(tmp_path, "t")
    with open(task / "instruction.md", "wb") as f:
        f.truncate(50 << 20)
    with pytest.raises(TaskError, match=r"instruction.md is 50.0 MB, over the 1 MB"):
        load_task(task)


class RewardFilesStandIn:
    """Stands in for a sandbox after tests/test.sh ran: `read_file` hands back the bytes the test
    put at /logs/verifier/, cut at `max_bytes` as the providers cut them. No process, no container."""

    def __init__(self, files: dict[str, bytes]):
        self.files = files

    async def read_file(self, remote_path: str, *, max_bytes: int = 1 << 20) -> bytes | None:
        data = self.files.get(remote_path)
        return None if data is None else data[:max_bytes]


REWARD_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6)
    | st.sampled_from([float("nan"), float("inf"), -float("inf"), 10**400, 1e308]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8)
REWARD_JSON_BYTES = st.one_of(
    REWARD_VALUES.map(lambda v: json.dumps(v).encode()),  # NaN and Infinity as Python's json writes them
    st.dictionaries(st.text(max_size=6), REWARD_VALUES, max_size=4).map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=40),
    st.integers(60_000, 70_000).map(lambda n: b'{"reward": 1, "pad": "' + b"x" * n + b'"}'),  # past the read cut
    st.integers(4_000, 5_000).map(lambda n: b'{"reward": ' + b"7" * n + b"}"),  # past Python's int digit limit
)


@fuzz(300)
@given(raw=REWARD_JSON_BYTES, txt=st.none() | st.binary(max_size=12))
def test_reward_files_give_finite_rewards_or_the_verifier_error_cause(raw, txt):
    files = {REWARD_JSON: raw} | ({REWARD_TXT: txt} if txt is not None else {})
    rewards, problem = asyncio.run(read_reward(RewardFilesStandIn(files)))
    if problem is None:
        assert rewards and all(type(v) is float and math.isfinite(v) for v in rewards.values())
        return
    assert rewards == {} and problem.event == Event.VERIFIER_BAD_REWARD and "\n" not in problem.detail
    verdict = classify([problem])
    assert verdict.outcome == Outcome.INFRA_FAILURE and verdict.cause == InfraCause.VERIFIER_ERROR
