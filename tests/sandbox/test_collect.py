"""Harbor's collection pass and the fields it reads (issue 47): `[[verifier.collect]]` hooks, `artifacts`
entries `{source, destination, exclude, service}` and `[[environment.mcp_servers]] headers`.

Read against Harbor 0.26's own source: trial/trial.py `_collect_artifacts_phased` (the hooks of `main`, its
artifacts, `main` stopped in separate mode, then the sidecars' hooks and artifacts, all before the verifier, in
shared mode too), trial/artifact_handler.py (host layout, `exclude` as `tar --exclude`, the manifest, upload to
the source path), models/task/config.py (the fields' checks), agents/mcp_headers.py (a header's value in a
variable of its own). Process sandboxes here; the sidecar parts on the dev Docker nodes.
"""

from __future__ import annotations

import dataclasses
import json
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rl360cli.agent.config import AgentConfig, RolloutConfig
from rl360cli.agent.session import SessionSpec
from rl360cli.outcome import Outcome
from rl360cli.sandbox.attempt import noop_agent, run_attempt
from rl360cli.sandbox.provider import NodeCapacity
from rl360cli.sandbox.sidecars import MCP_ENV
from rl360cli.sandbox.steps import placement_problem
from rl360cli.sandbox.task_loader import TaskError, load_task
from tests.agent.sessions import builtin_session
from tests.agent.test_conversation import CHATML, byte_tokenizer
from tests.sandbox.conftest import BUSYBOX, PYTHON, run, write_task
from tests.sandbox.test_harbor_format import ScriptedStepsEngineStandIn


def reward_if(condition: str) -> str:
    return f"if {condition}; then r=1; else r=0; fi; echo $r > /logs/verifier/reward.txt\n"


def agent_running(*commands: str):
    async def agent(sandbox):
        for command in commands:
            result = await sandbox.exec(command, timeout_s=30)
            assert result.exit_code == 0, result.output

    return agent


# ----------------------------------------------------------------------------- collect hooks, shared verifier

HOOKS = """
[[verifier.collect]]
command = "cat /app/state > /app/snapshot"

[[verifier.collect]]
command = "echo broken; exit 3"
"""


def test_collect_hooks_run_after_the_agent_before_a_shared_verifier(process_provider, tmp_path):
    """Harbor runs them in shared mode too (single_step.py collects before `_run_verifier`): the snapshot holds
    what the agent wrote; a hook that fails is recorded, never the attempt's failure."""
    task = load_task(write_task(tmp_path, "hooks", toml=HOOKS, test_sh=reward_if('[ "$(cat /app/snapshot)" = 42 ]')))
    assert [h.command for h in task.collect] == ["cat /app/state > /app/snapshot", "echo broken; exit 3"]
    result = run(run_attempt(process_provider(), task, agent_running("echo 42 > /app/state"), attempt_id="h"))
    assert (result.outcome, result.reward) == (Outcome.OK, 1.0), (result.detail, result.verifier_output)
    assert [(h["service"], h["exit_code"]) for h in result.collect_hooks] == [("main", 0), ("main", 3)]
    assert result.artifacts == ()  # shared, nothing kept: no copy is taken


def test_a_steps_hooks_are_the_tasks_then_its_own(process_provider, tmp_path):
    task = load_task(write_task(tmp_path, "steps", toml="""
        [[verifier.collect]]
        command = "echo task >> /app/order"

        [[steps]]
        name = "one"
        [[steps.verifier.collect]]
        command = "echo step >> /app/order"
        """, files={"steps/one/instruction.md": "one",
                    "steps/one/tests/test.sh": reward_if('[ "$(cat /app/order | tr "\\n" " ")" = "task step " ]')}))
    assert [h.command for h in task.steps[0].collect] == ["echo task >> /app/order", "echo step >> /app/order"]
    result = run(run_attempt(process_provider(), task, noop_agent, attempt_id="s", artifacts_dir=tmp_path / "kept"))
    assert result.reward == 1.0, result.verifier_output
    # Kept as Harbor's trial folder keeps a step's: steps/<name>/artifacts/, with its manifest.
    manifest = json.loads((tmp_path / "kept" / "steps" / "one" / "artifacts" / "manifest.json").read_text())
    assert [(e["source"], e["status"]) for e in manifest] == [("/logs/artifacts", "failed")]  # the agent made none
    assert result.artifacts[0]["step"] == "one"


# ----------------------------------------------------------------------------- artifacts, separate verifier

SEPARATE = """
artifacts = [
    {source = "/app/out", exclude = ["*.tmp", "cache"]},
    {source = "/app/report.txt", destination = "reports/final.txt"},
    "/app/never-made.txt",
]

[[verifier.collect]]
command = "echo dumped > /logs/artifacts/dump.txt"

[verifier]
environment_mode = "separate"
"""
# At their source paths, without what was excluded, with the hook's dump; the destination is the host's only.
SEPARATE_TEST = reward_if(
    '[ -f /app/out/a.txt ] && [ -f /app/out/sub/b.txt ] && [ ! -e /app/out/c.tmp ] && [ ! -e /app/out/cache ] '
    '&& [ "$(cat /app/report.txt)" = report ] && [ ! -e /reports ] && [ "$(cat /logs/artifacts/dump.txt)" = dumped ]')
MAKE_OUTPUTS = ("mkdir -p /app/out/sub /app/out/cache /logs/artifacts && echo a > /app/out/a.txt && "
                "echo b > /app/out/sub/b.txt && echo c > /app/out/c.tmp && echo x > /app/out/cache/x && "
                "echo report > /app/report.txt")


def test_artifacts_reach_a_separate_verifier_at_their_sources_and_are_kept_at_their_destinations(
        process_provider, tmp_path):
    task = load_task(write_task(tmp_path, "sep", toml=SEPARATE, test_sh=SEPARATE_TEST))
    out, report, never = task.artifacts
    assert (out.exclude, report.destination, never.destination) == (("*.tmp", "cache"), "reports/final.txt", None)
    kept = tmp_path / "kept"
    result = run(run_attempt(process_provider(), task, agent_running(MAKE_OUTPUTS), attempt_id="sep",
                             artifacts_dir=kept))
    assert (result.outcome, result.reward) == (Outcome.OK, 1.0), (result.detail, result.verifier_output)
    # Harbor's host layout: a source's path below the folder, or its destination; the manifest beside them.
    assert sorted(p.relative_to(kept).as_posix() for p in kept.rglob("*") if p.is_file()) == [
        "app/out/a.txt", "app/out/sub/b.txt", "logs/artifacts/dump.txt", "manifest.json", "reports/final.txt"]
    manifest = json.loads((kept / "manifest.json").read_text())
    assert [(e["source"], e["destination"], e["type"], e["status"]) for e in manifest] == [
        ("/logs/artifacts", "logs/artifacts", "directory", "ok"),
        ("/app/out", "app/out", "directory", "ok"),
        ("/app/report.txt", "reports/final.txt", "file", "ok"),
        ("/app/never-made.txt", "app/never-made.txt", "file", "failed"),
    ]
    assert list(result.artifacts) == manifest and result.collect_hooks[0]["exit_code"] == 0

    # Without the agent's outputs the verifier finds nothing (the test can fail); nothing kept: no folder.
    empty = run(run_attempt(process_provider(), task, noop_agent, attempt_id="sep-noop"))
    assert (empty.outcome, empty.reward) == (Outcome.OK, 0.0), empty.detail
    assert {e["source"]: e["status"] for e in empty.artifacts}["/app/out"] == "failed"


def test_an_artifact_whose_place_overlaps_an_earlier_one_is_skipped(process_provider, tmp_path):
    """Harbor keeps the first claim on a host path and skips the later one (artifact_handler.py)."""
    task = load_task(write_task(tmp_path, "clash", toml="""
        artifacts = ["/app/a.txt", {source = "/app/b.txt", destination = "app/a.txt"}]
        [verifier]
        environment_mode = "separate"
        """, test_sh=reward_if("[ -f /app/a.txt ] && [ ! -e /app/b.txt ]")))
    result = run(run_attempt(process_provider(), task, agent_running("echo a > /app/a.txt; echo b > /app/b.txt"),
                             attempt_id="clash", artifacts_dir=tmp_path / "kept"))
    assert result.reward == 1.0, result.verifier_output
    assert [e["status"] for e in result.artifacts] == ["failed", "ok", "skipped"]  # /logs/artifacts: none made
    assert (tmp_path / "kept" / "app" / "a.txt").read_text() == "a\n"


# ----------------------------------------------------------------------------- entries refused in one line


@pytest.mark.parametrize("toml, problem", [
    ('artifacts = [{source = "/app/x", destination = "/abs"}]\n', "destination '/abs' must be a relative path"),
    ('artifacts = [{source = "/app/x", destination = "a/../../b"}]\n', "must be a relative path"),
    ('artifacts = [{source = "/app/x", destination = "manifest.json"}]\n', "'manifest.json' is the collection's"),
    ('artifacts = [{source = "/app/x", exclude = "*.tmp"}]\n', "exclude must be a list of patterns"),
    ('artifacts = [{destination = "x"}]\n', "entries need a source path"),
    ('artifacts = [{source = "/data/x", service = "db"}]\n', "service 'db' is not one of the task's sidecars"),
    ('artifacts = [{source = "/data/x", service = "no good"}]\n', "is not a compose service name"),
    ('artifacts = "/app/x"\n', "artifacts must be a list"),
    ("[[verifier.collect]]\nservice = \"main\"\n", "[[verifier.collect]] entries need a command"),
    ('[[verifier.collect]]\ncommand = "true"\ntimeout_sec = 0\n', "timeout_sec must be a positive number"),
    ('[verifier]\ncollect = "true"\n', "[[verifier.collect]] must be an array of tables"),
    ('[[environment.mcp_servers]]\nname = "m"\nurl = "http://m:1/mcp"\nheaders = {Authorization = "Bearer abc"}\n',
     "header 'Authorization' holds a credential written out"),
    ('[[environment.mcp_servers]]\nname = "m"\nurl = "http://m:1/mcp"\nheaders = {X-Api-Key = "${K:-abc}"}\n',
     "holds a credential written out"),
    ('[[environment.mcp_servers]]\nname = "m"\nurl = "http://m:1/mcp"\nheaders = {"Bad Name" = "x"}\n',
     "is not an HTTP header name"),
    ('[[environment.mcp_servers]]\nname = "m"\nurl = "http://m:1/mcp"\nheaders = {X-Trace = "${oops"}\n',
     "malformed ${VAR} reference"),
    ('[[environment.mcp_servers]]\nname = "m"\ntransport = "stdio"\ncommand = "srv"\nheaders = {X-A = "1"}\n',
     "headers are only for the sse and streamable-http transports"),
    ('[[environment.mcp_servers]]\nname = "m"\n', "transport 'sse' needs a url"),  # Harbor's default transport
    ('[[environment.mcp_servers]]\nname = "m"\ntransport = "carrier-pigeon"\n', "is not one of stdio, sse"),
])
def test_malformed_entries_are_refused_in_one_line_naming_the_fix(tmp_path, toml, problem):
    with pytest.raises(TaskError) as caught:
        load_task(write_task(tmp_path, "bad", toml=toml))
    message = str(caught.value)
    assert "task bad" in message and problem in message and "\n" not in message, message


def test_a_sidecars_artifact_must_be_an_absolute_path(tmp_path):
    with pytest.raises(TaskError, match="taken from service 'db' must be an absolute path"):
        load_task(write_task(tmp_path, "rel", toml='artifacts = [{source = "data/x", service = "db"}]\n',
                             files={"environment/docker-compose.yaml": SIDECAR_COMPOSE}))


def test_a_relative_source_is_read_below_the_root_as_docker_cp_reads_it(tmp_path):
    task = load_task(write_task(tmp_path, "rel", toml='artifacts = ["app/out.txt", {source = "main-file"}]\n'))
    assert [a.source for a in task.artifacts] == ["/app/out.txt", "/main-file"]


# ----------------------------------------------------------------------------- MCP headers

MCP = """
[[environment.mcp_servers]]
name = "tools"
transport = "http"
url = "http://tools:8000/mcp"
headers = {Authorization = "Bearer ${RL360_TEST_MCP_TOKEN}", X-Trace = "${RL360_TEST_TRACE:-off}"}
"""


def test_mcp_headers_reach_the_agent_each_in_a_variable_of_its_own(process_provider, tmp_path, monkeypatch):
    """Harbor resolves `${VAR}` in a header from the run's environment and hands the agent the value in a
    variable its MCP config names (agents/mcp_headers.py); the listed servers hold no credential."""
    task = load_task(write_task(tmp_path, "mcp", toml=MCP))
    (server,) = task.mcp_servers
    assert server.transport == "streamable-http"  # Harbor's "http"
    listed = json.loads(task.env[MCP_ENV])
    assert listed == [{"name": "tools", "transport": "streamable-http", "url": "http://tools:8000/mcp",
                       "header_env": {"Authorization": "RL360_MCP_AUTH_0_0", "X-Trace": "RL360_MCP_AUTH_0_1"}}]
    task = dataclasses.replace(task, mcp_servers=())  # the server is no sidecar here: placement would refuse it
    seen = []

    async def agent(sandbox):
        seen.append((await sandbox.exec('echo "$RL360_MCP_AUTH_0_0|$RL360_MCP_AUTH_0_1|$RL360_MCP_SERVERS"',
                                        timeout_s=10)).output.strip())

    monkeypatch.setenv("RL360_TEST_MCP_TOKEN", "s3cret")
    result = run(run_attempt(process_provider(), task, agent, attempt_id="mcp"))
    assert result.outcome == Outcome.OK, result.detail
    bearer, trace, servers = seen[0].split("|", 2)
    assert (bearer, trace) == ("Bearer s3cret", "off") and "s3cret" not in servers

    monkeypatch.delenv("RL360_TEST_MCP_TOKEN")  # Harbor fails the trial before the environment starts
    missing = run(run_attempt(process_provider(), task, agent, attempt_id="mcp-missing"))
    assert missing.outcome == Outcome.INFRA_FAILURE and "RL360_TEST_MCP_TOKEN" in missing.detail, missing.detail
    assert os.environ.get("RL360_TEST_MCP_TOKEN") is None


# ----------------------------------------------------------------------------- sidecars (docker)

SIDECAR_COMPOSE = f"""
services:
  main:
    depends_on:
      db: {{condition: service_healthy}}
  db:
    image: {PYTHON}  # GNU tar: busybox's has no --exclude (such an artifact fails, in Harbor too)
    command: ["sh", "-c", "mkdir -p /data/log && cat /proc/sys/kernel/random/uuid > /data/boot && echo noise > /data/log/x.log && echo row > /data/log/rows.txt && exec sleep 3600"]
    healthcheck: {{test: ["CMD", "test", "-s", "/data/boot"], interval: 0.2s, retries: 100}}
"""
SIDECAR_TOML = """
artifacts = [
    {source = "/dump/db.txt", service = "db"},
    {source = "/data/log", service = "db", exclude = ["*.log"]},
]

[[verifier.collect]]
service = "db"
command = "mkdir -p /dump && echo dumped-$(cat /data/boot) > /dump/db.txt"

[verifier]
environment_mode = "separate"
"""
# The sidecar's dump (not the agent's forgery) and its log folder without *.log, at their sources.
SIDECAR_TEST = reward_if('grep -q "^dumped-[0-9a-f-]*$" /dump/db.txt && [ -f /data/log/rows.txt ] '
                         '&& [ ! -e /data/log/x.log ]')


def test_collect_hooks_and_artifacts_of_a_sidecar_reach_a_separate_verifier(docker_provider, tmp_path):
    task = load_task(write_task(tmp_path, "side", toml=SIDECAR_TOML, test_sh=SIDECAR_TEST,
                                files={"environment/docker-compose.yaml": SIDECAR_COMPOSE}))
    assert [(a.service, a.exclude) for a in task.artifacts] == [("db", ()), ("db", ("*.log",))]
    kept = tmp_path / "kept"
    forge = "mkdir -p /dump && echo forged > /dump/db.txt"  # main's /dump is not the sidecar's
    result = run(run_attempt(docker_provider(), task, agent_running(forge), attempt_id="side", artifacts_dir=kept))
    assert (result.outcome, result.reward) == (Outcome.OK, 1.0), (result.detail, result.verifier_output,
                                                                  result.artifacts, result.collect_hooks,
                                                                  sorted(str(p) for p in kept.rglob("*")))
    assert (kept / "dump" / "db.txt").read_text().startswith("dumped-")
    assert sorted(p.name for p in (kept / "data" / "log").iterdir()) == ["rows.txt"]
    assert [(e["service"], e["status"]) for e in result.artifacts] == [("main", "failed"), ("db", "ok"), ("db", "ok")]
    assert result.collect_hooks == ({"service": "db", "command": task.collect[0].command, "exit_code": 0},)


def test_sidecar_collection_is_refused_at_placement_where_the_provider_cannot_reach_sidecars(tmp_path):
    task = load_task(write_task(tmp_path, "side", toml=SIDECAR_TOML, test_sh=SIDECAR_TEST,
                                files={"environment/docker-compose.yaml": SIDECAR_COMPOSE}))
    nodes = [NodeCapacity(name="n", cpus=4.0, memory_mb=8192)]
    problem = placement_problem(task, nodes, "process", sidecars=True, service_ops=False)
    assert problem == ("task side runs collect hooks in, or takes artifacts from, its sidecars (db), which the "
                       "process provider cannot reach: run it with the docker provider")
    assert placement_problem(task, nodes, "docker", sidecars=True, service_ops=True) is None


# ----------------------------------------------------------------------------- fuzzed entries

_TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x7f"), max_size=12)
_SCALAR = st.one_of(_TEXT, st.sampled_from(["/app/x", "main", "db", "x.txt", "/", "..", "Authorization",
                                            "Bearer ${T}", "${T:-d}", "stdio", "http", "*.log"]),
                    st.integers(-3, 3), st.floats(-1e3, 1e3, allow_nan=False), st.booleans())
_KEYS = st.sampled_from(["source", "destination", "exclude", "service", "command", "timeout_sec", "user", "name",
                         "transport", "url", "args", "headers", "Authorization", "X-A"])
_VALUE = st.recursive(_SCALAR, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(_KEYS, inner, max_size=4)), max_leaves=8)


def toml_value(value) -> str:
    """`value` as an inline TOML value (strings as JSON strings, which TOML's basic strings read alike)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(map(toml_value, value)) + "]"
    return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items()) + "}"


@settings(max_examples=300, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(artifacts=_VALUE, collect=_VALUE, servers=_VALUE)
def test_any_artifacts_collect_and_mcp_entries_load_or_are_refused_in_one_line(tmp_path_factory, artifacts, collect,
                                                                               servers):
    folder = write_task(tmp_path_factory.mktemp("fz"), "fz", toml=(
        f"artifacts = {toml_value(artifacts)}\n[verifier]\ncollect = {toml_value(collect)}\n"
        f"[environment]\nmcp_servers = {toml_value(servers)}\n"))
    try:
        task = load_task(folder)
    except TaskError as e:
        assert "\n" not in str(e) and str(e).startswith("task fz: ") and e.fix, str(e)
        return
    assert all(a.source.startswith("/") and ".." not in a.source.split("/") for a in task.artifacts)
    assert all(h.command.strip() and h.timeout_s > 0 for h in task.collect)


SHARED_COMPOSE = f"""
volumes:
  evidence: {{}}
services:
  main:
    volumes: ["evidence:/evidence:ro"]
    depends_on:
      db: {{condition: service_healthy}}
  db:
    image: {PYTHON}
    command: ["sh", "-c", "echo 7 > /tmp/rows && exec sleep 3600"]
    volumes: ["evidence:/evidence"]
    healthcheck: {{test: ["CMD", "test", "-s", "/tmp/rows"], interval: 0.2s, retries: 100}}
"""


def test_a_sidecars_hook_runs_before_a_shared_verifier(docker_provider, tmp_path):
    """Harbor's shared mode runs the sidecars' hooks too: the dump lands in a volume the agent reads only."""
    task = load_task(write_task(tmp_path, "shared-hook", toml="""
        [[verifier.collect]]
        service = "db"
        command = "cp /tmp/rows /evidence/rows"
        """, test_sh=reward_if('[ "$(cat /evidence/rows)" = 7 ]'),
        files={"environment/docker-compose.yaml": SHARED_COMPOSE}))
    seen = []

    async def agent(sandbox):
        seen.append((await sandbox.exec("cat /evidence/rows 2>/dev/null || echo none", timeout_s=30)).output.strip())

    result = run(run_attempt(docker_provider(), task, agent, attempt_id="shared-hook"))
    assert (result.outcome, result.reward) == (Outcome.OK, 1.0), (result.detail, result.verifier_output)
    assert seen == ["none"]  # not there while the agent ran: the hook made it after
    assert result.collect_hooks == ({"service": "db", "command": "cp /tmp/rows /evidence/rows", "exit_code": 0},)


def test_a_sidecar_hook_past_its_timeout_is_recorded_and_the_attempt_goes_on(docker_provider, tmp_path):
    task = load_task(write_task(tmp_path, "slow-hook", toml="""
        [[verifier.collect]]
        service = "db"
        command = "sleep 600"
        timeout_sec = 1

        [[verifier.collect]]
        service = "db"
        command = "cp /tmp/rows /evidence/rows"
        """, test_sh=reward_if('[ "$(cat /evidence/rows)" = 7 ]'),
        files={"environment/docker-compose.yaml": SHARED_COMPOSE}))
    result = run(run_attempt(docker_provider(), task, noop_agent, attempt_id="slow-hook"))
    assert (result.outcome, result.reward) == (Outcome.OK, 1.0), (result.detail, result.verifier_output)
    assert [h["exit_code"] for h in result.collect_hooks] == [None, 0]  # timed out, then the next hook ran


# ----------------------------------------------------------------------------- what a trajectory keeps


def test_a_sessions_trajectory_keeps_the_manifest_and_the_hooks(process_provider, tmp_path):
    """Where Harbor keeps a trial's artifacts in its folder, an RL session keeps what was taken (the manifest)
    and how each hook ended, in its trajectory's metadata."""
    task = load_task(write_task(tmp_path, "sep", toml=SEPARATE, test_sh=SEPARATE_TEST))
    tokenizer = byte_tokenizer(CHATML)
    engine = ScriptedStepsEngineStandIn(tokenizer, [f"```bash\n{MAKE_OUTPUTS}\n```", "Done."])
    spec = SessionSpec(task_id=task.id, group_id="g", sample_index=0, attempt_id="session-collect")
    session = builtin_session(spec, task, tokenizer=tokenizer, client=engine, provider=process_provider(),
                              rollout=RolloutConfig(max_turns=3, max_new_tokens=256),
                              agent=AgentConfig(done_words=("done.",)), exec_timeout_s=10)
    [trajectory] = run(session)
    assert trajectory.outcome == Outcome.OK and trajectory.reward == 1.0, trajectory.metadata.get("detail")
    assert {e["source"]: e["status"] for e in trajectory.metadata["artifacts"]} == {
        "/logs/artifacts": "ok", "/app/out": "ok", "/app/report.txt": "ok", "/app/never-made.txt": "failed"}
    assert [h["exit_code"] for h in trajectory.metadata["collect_hooks"]] == [0]


def test_a_main_hook_past_its_timeout_leaves_the_agents_server_to_the_verifier(docker_provider, tmp_path):
    """Harbor's hook timeout ends the hook only; a docker exec past its limit here ends the sandbox's every
    process, so the hook is bounded by its own `timeout` inside a longer exec."""
    serve = "mkdir -p /tmp/www && echo served > /tmp/www/index.html && httpd -p 127.0.0.1:8080 -h /tmp/www"
    task = load_task(write_task(tmp_path, "slow-main-hook", image=BUSYBOX, toml="""
        [[verifier.collect]]
        command = "sleep 600"
        timeout_sec = 1
        """, test_sh=reward_if("wget -qO- http://127.0.0.1:8080/index.html | grep -q served")))
    result = run(run_attempt(docker_provider(), task, agent_running(serve), attempt_id="slow-main-hook"))
    assert (result.outcome, result.reward) == (Outcome.OK, 1.0), (result.detail, result.verifier_output)
    assert [h["exit_code"] for h in result.collect_hooks] == [None]
