"""Loading Harbor tasks: the shipped examples, Harbor's own example metadata, and every way a task is refused."""

from __future__ import annotations

import shutil
import tomllib
from pathlib import Path

import pytest

from rl360cli.errors import Rl360Error
from rl360cli.sandbox.task import resolve_env
from rl360cli.sandbox.task_loader import TaskError, load_task, load_task_set
from tests.conftest import need
from tests.sandbox.conftest import EXAMPLE_IDS, EXAMPLES, write_task

HARBOR = Path("/work/shared/fixtures/harbor-examples")
if not HARBOR.is_dir():
    HARBOR = Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "harbor-examples"

# Why each of Harbor's examples is refused on its metadata alone (None: its task.toml is fine for rl360;
# GPU and MCP tasks load and are refused at placement, see tests/sandbox/test_harbor_format.py).
HARBOR_VERDICTS = {
    "describe-image": None,
    "hello-alpine": None,
    "hello-computer-use": None,
    "hello-cuda": None,
    "hello-healthcheck": None,
    "hello-mcp": None,
    "hello-multi-step-advanced": None,
    "hello-multi-step-bat": "Windows tasks need a Windows node",
    "hello-multi-step-simple": None,
    "hello-skills": None,
    "hello-user": None,
    "hello-workdir": None,
    "hello-world": None,
    "hello-world-bat": "Windows tasks need a Windows node",
    "llm-judge-example": None,
    "reward-kit-example": None,
    "separate-verifier-environment": None,
    "separate-verifier-multi-step": None,
}


@pytest.fixture
def harbor() -> Path:
    need(HARBOR.is_dir(), f"Harbor's example tasks are not at {HARBOR} (shared/fixtures/harbor-examples)")
    return HARBOR


def test_the_examples_load_with_what_their_task_toml_says():
    tasks = {t.id: t for t in load_task_set(EXAMPLES)}
    assert sorted(tasks) == sorted(EXAMPLE_IDS)
    hello = tasks["hello-world"]
    assert hello.name == "rl360/hello-world"
    assert hello.docker_image == "127.0.0.1:5000/rl360/busybox:latest" and hello.dockerfile is None
    assert (hello.cpus, hello.memory_mb, hello.storage_mb) == (1.0, 256, 64)
    assert (hello.agent_timeout_s, hello.verifier_timeout_s) == (60.0, 30.0)
    assert hello.workdir == "/app" and hello.has_solution and not hello.network
    assert "hello.txt" in hello.instruction
    # The legacy size string: memory = "768M".
    assert tasks["memory-hungry"].memory_mb == 768
    assert tasks["reward-json"].verifier_env == {"NUM_PRIMES": "10"}
    tool = tasks["install-tool"]
    assert tool.docker_image is None and tool.dockerfile == EXAMPLES / "install-tool" / "environment" / "Dockerfile"
    assert tool.image_ref.startswith("rl360-task/install-tool:") and len(tool.env_hash) == 64
    assert tool.healthcheck is not None and tool.healthcheck.command == "greet --version"
    # The workdir comes from the Dockerfile's WORKDIR when task.toml does not set one.
    assert tasks["python-bugfix"].workdir == "/app"


@pytest.mark.parametrize("name", sorted(HARBOR_VERDICTS))
def test_every_harbor_example_loads_or_is_refused_in_one_line(name, tmp_path, harbor):
    """Harbor's own task.toml files (metadata only): each loads once the files rl360 needs exist, or is refused."""
    folder = tmp_path / name
    shutil.copytree(HARBOR / name, folder)
    # The fixtures hold only task.toml and instruction.md: give each the rest of a task folder.
    (folder / "tests").mkdir(exist_ok=True)
    (folder / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    (folder / "environment").mkdir(exist_ok=True)
    (folder / "environment" / "Dockerfile").write_text("FROM 127.0.0.1:5000/rl360/busybox:latest\n")
    if not (folder / "instruction.md").exists():
        (folder / "instruction.md").write_text("steps\n")
    for step in tomllib.loads((folder / "task.toml").read_text()).get("steps", []):
        (folder / "steps" / step["name"]).mkdir(parents=True)
        (folder / "steps" / step["name"] / "instruction.md").write_text(f"do {step['name']}\n")
    verdict = HARBOR_VERDICTS[name]
    if verdict is None:
        task = load_task(folder)
        assert task.id == name and task.instruction
        return
    with pytest.raises(TaskError) as caught:
        load_task(folder)
    message = str(caught.value)
    assert verdict in message and name in message and "\n" not in message


def test_harbor_examples_as_shipped_are_each_loaded_or_refused(tmp_path, harbor):
    """Unchanged fixtures (no tests/test.sh): none crashes the loader; each refusal names the task."""
    assert sorted(p.name for p in HARBOR.iterdir() if p.is_dir()) == sorted(HARBOR_VERDICTS)
    for folder in sorted(p for p in HARBOR.iterdir() if p.is_dir()):
        try:
            load_task(folder)
        except Rl360Error as e:
            assert folder.name in str(e) and "\n" not in str(e)


def test_harbor_fields_are_read_as_harbor_reads_them(tmp_path, harbor):
    folder = tmp_path / "t"
    shutil.copytree(HARBOR / "reward-kit-example", folder)
    (folder / "tests").mkdir()
    (folder / "tests" / "test.sh").write_text("true\n")
    (folder / "environment").mkdir()
    (folder / "environment" / "Dockerfile").write_text("FROM x\n")
    task = load_task(folder)
    assert task.memory_mb == 2048 and task.storage_mb == 10240  # memory = "2G", storage = "10G"
    assert task.verifier_env == {"ANTHROPIC_API_KEY": "${ANTHROPIC_API_KEY}"}
    assert task.name == "t"  # no [task] table: the folder name

    shutil.copytree(HARBOR / "hello-workdir", tmp_path / "w")
    (tmp_path / "w" / "tests").mkdir()
    (tmp_path / "w" / "tests" / "test.sh").write_text("true\n")
    (tmp_path / "w" / "environment").mkdir()
    (tmp_path / "w" / "environment" / "Dockerfile").write_text("FROM x\nWORKDIR /elsewhere\n")
    assert load_task(tmp_path / "w").workdir == "/custom-workdir"  # task.toml wins over the Dockerfile

    shutil.copytree(HARBOR / "hello-user", tmp_path / "u")
    (tmp_path / "u" / "tests").mkdir()
    (tmp_path / "u" / "tests" / "test.sh").write_text("true\n")
    (tmp_path / "u" / "environment").mkdir()
    (tmp_path / "u" / "environment" / "Dockerfile").write_text("FROM x\n")
    assert load_task(tmp_path / "u").agent_user == "agent"


@pytest.mark.parametrize("toml, wants", [
    ('[environment]\nnetwork_mode = "public"\n', True),
    ("[environment]\nallow_internet = true\n", True),
    ('[environment]\nnetwork_mode = "no-network"\n', False),
    ("[environment]\nallow_internet = false\n", False),
    ("[environment]\ncpus = 1\n", True),  # Harbor's default: public (the profile's [egress] says where to)
    ('[environment]\nnetwork_mode = "no-network"\nallow_internet = true\n', False),  # network_mode wins
    ('[environment]\nnetwork_mode = "public"\n[agent]\nnetwork_mode = "no-network"\n', False),
])
def test_a_task_wants_the_internet_as_harbor_reads_it(tmp_path, toml, wants):
    assert load_task(write_task(tmp_path, "t", toml=toml)).network is wants


def test_an_allowlist_task_wants_the_network_and_names_its_hosts(tmp_path):
    task = load_task(write_task(tmp_path, "t", toml=(
        '[environment]\nnetwork_mode = "allowlist"\nallowed_hosts = ["pypi.org", "*.debian.org"]\n')))
    assert task.network and task.allowed_hosts == ("pypi.org", "*.debian.org")
    assert load_task(write_task(tmp_path, "u")).allowed_hosts is None


@pytest.mark.parametrize("toml, problem", [
    ("[environment]\ncpus = 0\n", "cpus must be positive"),
    ('[environment]\ncpus = "two"\n', "cpus must be a number"),
    ('[environment]\nmemory = "lots"\n', "is not a size"),
    ("[environment]\nmemory_mb = 8\n", "memory must be at least 16 MB"),
    ("[environment]\nstorage_mb = 1.5\n", "storage_mb must be an integer"),
    ("[agent]\ntimeout_sec = -1\n", "[agent] timeout_sec must be positive"),
    ("[verifier]\ntimeout_sec = 0\n", "[verifier] timeout_sec must be positive"),
    ("schema_version = 2.0\n", "schema version 2.0 is not a string"),  # Harbor's model refuses a number too
    ('[agent]\nnetwork_mode = "allowlist"\nallowed_hosts = ["pypi.org"]\n', "[agent] network allowlists are not"),
    ('[environment.tpu]\ntype = "v5e"\ntopology = "2x2"\n', "TPU tasks need TPU nodes"),
    # Harbor runs collect hooks; one naming a service the task does not have is refused (test_collect.py).
    ('[[verifier.collect]]\ncommand = "pg_dump > /logs/artifacts/db.sql"\nservice = "db"\n',
     "service 'db' is not one of the task's sidecars"),
    ('[environment]\nnetwork_mode = "allowlist"\n', "needs allowed_hosts, a list of host names"),
    ('[environment]\nnetwork_mode = "allowlist"\nallowed_hosts = ["https://pypi.org"]\n', "not a URL"),
    ('[environment]\nallowed_hosts = ["pypi.org"]\n', 'allowed_hosts needs network_mode = "allowlist"'),
    ('[environment]\nnetwork_mode = "intranet"\n', "is not one of public"),
    ('[environment]\nallow_internet = "no"\n', "allow_internet must be true or false"),
    ('[environment]\nworkdir = "relative"\n', "workdir must be an absolute path"),
    ("[environment]\ngpus = -2\n", "gpus must be a non-negative integer"),
    ('agent = "fast"\n', "[agent] must be a table"),
    ("[verifier]\nenv = { A = [1] }\n", "A must be a string"),
    ('[environment.healthcheck]\ncommand = ""\n', "healthcheck] command must be"),
    ("[[steps]]\nname = 'a'\n", "no steps/a/instruction.md"),
])
def test_bad_task_toml_is_refused_naming_task_and_problem(tmp_path, toml, problem):
    with pytest.raises(TaskError) as caught:
        load_task(write_task(tmp_path, "bad-task", toml=toml))
    assert "task bad-task" in str(caught.value) and problem in str(caught.value)


def test_missing_and_unreadable_files_are_named(tmp_path):
    folder = write_task(tmp_path, "a")
    (folder / "tests" / "test.sh").unlink()
    with pytest.raises(TaskError, match=r"task a: no tests/test.sh"):
        load_task(folder)
    folder = write_task(tmp_path, "b")
    (folder / "task.toml").write_text("[environment\ncpus = 1\n")
    with pytest.raises(TaskError, match=r"task b: task.toml is not valid TOML"):
        load_task(folder)
    folder = write_task(tmp_path, "c")
    (folder / "instruction.md").unlink()
    with pytest.raises(TaskError, match=r"task c: no instruction.md"):
        load_task(folder)
    folder = write_task(tmp_path, "d", image=None)
    with pytest.raises(TaskError, match=r"task d: no environment/Dockerfile and no \[environment\] docker_image"):
        load_task(folder)
    folder = write_task(tmp_path, "e", files={"environment/docker-compose.yaml": "services: {}\n"})
    with pytest.raises(TaskError, match=r"task e: environment/docker-compose.yaml needs a `services:` mapping"):
        load_task(folder)
    with pytest.raises(TaskError, match=r"no task.toml"):
        load_task(tmp_path / "a" / "tests")


def test_a_task_set_is_a_folder_of_task_folders(tmp_path):
    for name in ("one", "two", "three"):
        write_task(tmp_path / "set", name)
    (tmp_path / "set" / "notes").mkdir()  # a folder without task.toml is not a task
    assert [t.id for t in load_task_set(tmp_path / "set")] == ["one", "three", "two"]
    assert [t.id for t in load_task_set(tmp_path / "set", include=("two",))] == ["two"]
    assert [t.id for t in load_task_set(tmp_path / "set" / "one")] == ["one"]
    with pytest.raises(TaskError, match=r"no task folder named four.*use names from: one, three, two"):
        load_task_set(tmp_path / "set", include=("four",))
    with pytest.raises(TaskError, match=r"holds no task folder"):
        load_task_set(tmp_path / "set" / "notes")
    with pytest.raises(TaskError, match=r"no such folder"):
        load_task_set(tmp_path / "missing")
    write_task(tmp_path / "set", "zbroken", toml="[environment]\ncpus = -1\n")
    with pytest.raises(TaskError, match=r"task zbroken: \[environment\] cpus must be positive"):
        load_task_set(tmp_path / "set")


def test_env_templates_resolve_from_the_orchestrator(tmp_path):
    env = {"KEY": "${API_KEY}", "MODEL": "${MODEL:-small}", "PLAIN": "x-${API_KEY}-y"}
    assert resolve_env(env, {"API_KEY": "k"}) == {"KEY": "k", "MODEL": "small", "PLAIN": "x-k-y"}
    with pytest.raises(KeyError, match="API_KEY"):
        resolve_env(env, {})


def test_the_image_tag_follows_the_environment_content(tmp_path):
    folder = write_task(tmp_path, "t", dockerfile="FROM x\nCOPY a.txt /a.txt\n", files={"environment/a.txt": "1"})
    first = load_task(folder).image_ref
    assert load_task(folder).image_ref == first
    (folder / "environment" / "a.txt").write_text("2")
    assert load_task(folder).image_ref != first


def test_one_refused_task_of_a_set_is_left_out_and_said_and_the_others_load(tmp_path, capsys):
    from rl360cli.run.session_actors import run_task_ids

    write_task(tmp_path, "good")
    write_task(tmp_path, "windows", toml='[environment]\nos = "windows"\n')
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "task.toml").write_text("[task\n")
    with pytest.raises(TaskError, match="task broken: task.toml is not valid TOML"):
        load_task_set(tmp_path)  # strict without a place to put refusals
    refused: dict[str, TaskError] = {}
    assert [t.id for t in load_task_set(tmp_path, refused=refused)] == ["good"]
    assert sorted(refused) == ["broken", "windows"] and "Windows tasks need a Windows node" in refused["windows"].problem
    # A run leaves them out and says so in its log, one line each.
    assert run_task_ids(str(tmp_path), ()) == ["good"]
    said = capsys.readouterr().out.splitlines()
    assert len(said) == 2 and all(line.startswith("[driver] task ") and "left out" in line for line in said)
    with pytest.raises(TaskError, match="none of its 1 tasks loads"):
        load_task_set(tmp_path, include=("windows",), refused={})
