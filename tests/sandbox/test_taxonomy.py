"""The failure taxonomy: one real scenario per row of the table, and the table and its doc agree.

Each `test_row_<event>` makes an attempt in which that row's event really happens (process provider where
it can, the dev Docker nodes for the rows only a daemon produces) and checks the outcome, cause and
retriability the table gives it.
"""

from __future__ import annotations

import shutil
import sys

import pytest

from rl360cli.nodes.config import NodeSpec
from rl360cli.outcome import InfraCause, Outcome
from rl360cli.sandbox.attempt import ModelFailure, oracle_agent, run_attempt
from rl360cli.sandbox.faults import FaultInjector
from rl360cli.sandbox.task_loader import load_task
from rl360cli.sandbox.taxonomy import RULES, TABLE, Event, InfraError, Observed, classify
from tests.conftest import REPO
from tests.egress.conftest import free_port, proxy_of  # noqa: F401 - the real egress proxy, a fixture
from tests.sandbox.conftest import BUSYBOX, EXAMPLES, PYTHON, run, write_task

REWARD_0 = "mkdir -p /logs/verifier; echo 0 > /logs/verifier/reward.txt\n"


def attempt(provider, task, agent=None, **kwargs):
    async def nothing(sandbox):
        pass

    return run(run_attempt(provider, task, agent or nothing, attempt_id="row", labels={}, **kwargs))


def expect(result, event: Event):
    rule = RULES[event]
    assert result.events[-1] == event.value or event.value in result.events, result.events
    assert result.outcome == rule.outcome, (result.outcome, result.detail)
    if rule.cause is not None:
        assert result.cause == rule.cause, (result.cause, result.detail)
    assert result.retriable == (rule.retriable and rule.outcome == Outcome.INFRA_FAILURE)


# ----------------------------------------------------------------------------- the table itself


def test_every_event_has_exactly_one_row_and_every_row_a_test():
    assert [r.event for r in TABLE] == list(dict.fromkeys(r.event for r in TABLE))
    assert set(RULES) == set(Event)
    tests = {name for name in dir(sys.modules[__name__]) if name.startswith("test_row_")}
    assert tests == {f"test_row_{e.value}" for e in Event}


def test_the_doc_lists_every_row():
    doc = (REPO / "docs" / "sandboxes.md").read_text()
    for rule in TABLE:
        row = f"| `{rule.event.value}` |"
        assert row in doc, f"docs/sandboxes.md has no row for {rule.event.value}"
        line = next(line for line in doc.splitlines() if line.startswith(row))
        assert f"`{rule.outcome.value}`" in line and (rule.cause is None or f"`{rule.cause.value}`" in line)


def test_infra_beats_model_beats_ok():
    events = [Observed(event=Event.AGENT_EXEC_TIMEOUT), Observed(event=Event.REWARD)]
    assert classify(events).outcome == Outcome.MODEL_FAILURE
    events.append(Observed(event=Event.VERIFIER_NO_REWARD))
    verdict = classify(events)
    assert verdict.outcome == Outcome.INFRA_FAILURE and verdict.cause == InfraCause.VERIFIER_ERROR
    assert classify([Observed(event=Event.REWARD)]).outcome == Outcome.OK
    agent = classify([Observed(event=Event.AGENT_INFRA, cause=InfraCause.ENGINE_ERROR)])
    assert agent.cause == InfraCause.ENGINE_ERROR and not agent.retriable


# ----------------------------------------------------------------------------- one scenario per row


def test_row_reward(process_provider):
    result = attempt(process_provider(), load_task(EXAMPLES / "hello-world"),
                     oracle_agent(load_task(EXAMPLES / "hello-world")))
    expect(result, Event.REWARD)
    assert result.reward == 1.0 and result.cause is None


def test_row_agent_exec_timeout(process_provider, tmp_path):
    task = load_task(write_task(tmp_path, "t", test_sh="echo 1 > /logs/verifier/reward.txt\n"))

    async def agent(sandbox):
        await sandbox.exec("sleep 5", timeout_s=0.5)

    result = attempt(process_provider(), task, agent)
    expect(result, Event.AGENT_EXEC_TIMEOUT)
    assert result.reward == 1.0  # a model failure's reward stands
    assert result.commands[0]["timed_out"] and result.timings["agent"] < 4


def test_row_agent_limit(process_provider, tmp_path):
    task = load_task(write_task(tmp_path, "t", image=PYTHON, test_sh=REWARD_0))

    async def agent(sandbox):
        await sandbox.exec("python3 -c 'x = bytearray(512 * 2**20)'", timeout_s=20)

    result = attempt(process_provider(memory_mb=96), task, agent)
    expect(result, Event.AGENT_LIMIT)
    assert "memory" in result.detail and result.commands[0]["limit"] == "memory"


def test_row_agent_budget(process_provider, tmp_path):
    task = load_task(write_task(tmp_path, "t", toml="[agent]\ntimeout_sec = 0.5\n", test_sh=REWARD_0))

    async def agent(sandbox):
        await sandbox.exec("sleep 30", timeout_s=30)

    result = attempt(process_provider(), task, agent)
    expect(result, Event.AGENT_BUDGET)
    assert result.timings["agent"] < 5 and "budget" in result.detail


def test_row_agent_no_answer(process_provider, tmp_path):
    task = load_task(write_task(tmp_path, "t", test_sh=REWARD_0))

    async def agent(sandbox):
        raise ModelFailure("the reply had no action")

    result = attempt(process_provider(), task, agent)
    expect(result, Event.AGENT_NO_ANSWER)
    assert result.detail == "the reply had no action"


def test_row_agent_infra(process_provider, tmp_path):
    task = load_task(write_task(tmp_path, "t"))

    async def agent(sandbox):
        raise InfraError(InfraCause.ENGINE_ERROR, "HTTP 503 from the engine")

    result = attempt(process_provider(), task, agent)
    expect(result, Event.AGENT_INFRA)
    assert result.cause == InfraCause.ENGINE_ERROR and "verify" not in result.timings


def test_row_agent_bug(process_provider, tmp_path):
    task = load_task(write_task(tmp_path, "t"))

    async def agent(sandbox):
        {}["missing"]

    result = attempt(process_provider(), task, agent)
    expect(result, Event.AGENT_BUG)
    assert "KeyError" in result.detail


@pytest.mark.docker
def test_row_image_pull_failed(docker_provider, tmp_path):
    # A registry address where nothing listens (loopback only): the pull fails, retriable.
    task = load_task(write_task(tmp_path, "t", image="127.0.0.1:5999/rl360/nothing-listens:1"))
    result = attempt(docker_provider(), task)
    expect(result, Event.IMAGE_PULL_FAILED)


@pytest.mark.docker
def test_row_image_not_found(docker_provider, tmp_path):
    task = load_task(write_task(tmp_path, "t", image="127.0.0.1:5000/rl360/does-not-exist:1"))
    result = attempt(docker_provider(), task)
    expect(result, Event.IMAGE_NOT_FOUND)
    assert "does-not-exist" in result.detail


def test_row_image_build_failed(process_provider, tmp_path):
    task = load_task(write_task(tmp_path, "t", dockerfile=f"FROM {BUSYBOX}\nRUN echo broken >&2; exit 3\n"))
    result = attempt(process_provider(), task)
    expect(result, Event.IMAGE_BUILD_FAILED)
    assert "exited 3" in result.detail and "broken" in result.detail


def test_row_start_failed(process_provider, tmp_path):
    # The healthcheck never passes: the sandbox did not come up in a usable state.
    toml = '[environment.healthcheck]\ncommand = "test -f /app/ready"\ninterval_sec = 0.05\nretries = 2\n'
    result = attempt(process_provider(), load_task(write_task(tmp_path, "t", toml=toml)))
    expect(result, Event.START_FAILED)
    assert "healthcheck" in result.detail and "agent" not in result.timings


@pytest.mark.docker
def test_row_start_timeout(docker_provider, tmp_path):
    provider = docker_provider(start_timeout_s=0.001)
    result = attempt(provider, load_task(write_task(tmp_path, "t")))
    expect(result, Event.START_TIMEOUT)
    # The create that outlived the limit finishes on the provider's threads and removes its container
    # (the fixture then checks that nothing of the run is left on any node).
    provider._executor.shutdown(wait=True)


@pytest.mark.docker
def test_row_node_unreachable(docker_provider, tmp_path):
    gone = NodeSpec(name="gone", docker_host=f"unix://{tmp_path}/no-daemon.sock")
    result = attempt(docker_provider(nodes=[gone]), load_task(write_task(tmp_path, "t")))
    expect(result, Event.NODE_UNREACHABLE)
    assert result.node == "gone"


def test_row_sandbox_killed(process_provider, tmp_path):
    task = load_task(write_task(tmp_path, "t"))

    async def agent(sandbox):
        shutil.rmtree(sandbox.info()["folder"])  # removed from outside while the agent works
        await sandbox.exec("true", timeout_s=5)

    result = attempt(process_provider(), task, agent)
    expect(result, Event.SANDBOX_KILLED)


@pytest.mark.docker
def test_row_sandbox_oom(docker_provider, tmp_path):
    # The agent's files fill the container's tmpfs (counted against its memory) past its 128 MB: the
    # command clearing /tests before the verifier is OOM-killed, which no process of the agent's holds,
    # or, when the kernel picks it first, the container's init (and with it the container).
    task = load_task(write_task(tmp_path, "t"))

    async def agent(sandbox):
        await sandbox.exec("head -c 100m /dev/zero > /tmp/fill; head -c 100m /dev/zero > /run/fill", timeout_s=60)

    result = attempt(docker_provider(memory_mb=128), task, agent)
    expect(result, Event.SANDBOX_OOM)
    assert "OOM-killed" in result.detail


def test_row_provider_failed(process_provider, tmp_path):
    task = load_task(write_task(tmp_path, "t"))

    async def agent(sandbox):
        await sandbox.upload(tmp_path, "/usr/lib/not-writable")

    result = attempt(process_provider(), task, agent)
    expect(result, Event.PROVIDER_FAILED)


def test_row_verifier_no_reward(process_provider, tmp_path):
    result = attempt(process_provider(), load_task(write_task(tmp_path, "t", test_sh="echo tests ran\n")))
    expect(result, Event.VERIFIER_NO_REWARD)
    assert "tests ran" in result.verifier_output and result.reward == 0.0


@pytest.mark.parametrize("test_sh", [
    "echo not-a-number > /logs/verifier/reward.txt\n",
    "echo nan > /logs/verifier/reward.txt\n",
    "echo '{\"reward\": {\"nested\": 1}}' > /logs/verifier/reward.json\n",
    "echo '{\"reward\": true}' > /logs/verifier/reward.json\n",
    "echo '[1, 2]' > /logs/verifier/reward.json\n",
    "echo '{' > /logs/verifier/reward.json\n",
])
def test_row_verifier_bad_reward(process_provider, tmp_path, test_sh):
    result = attempt(process_provider(), load_task(write_task(tmp_path, "t", test_sh=test_sh)))
    expect(result, Event.VERIFIER_BAD_REWARD)


def test_row_verifier_timeout(process_provider, tmp_path):
    task = load_task(write_task(tmp_path, "t", toml="[verifier]\ntimeout_sec = 0.5\n",
                                test_sh="echo 1 > /logs/verifier/reward.txt; sleep 30\n"))
    result = attempt(process_provider(), task)
    expect(result, Event.VERIFIER_TIMEOUT)
    assert result.timings["verify"] < 5


def test_row_verifier_oom(process_provider):
    task = load_task(EXAMPLES / "memory-hungry")
    result = attempt(process_provider(memory_mb=128), task, oracle_agent(task))
    expect(result, Event.VERIFIER_OOM)
    assert "128 MB" in result.detail


def test_printing_memoryerror_does_not_mask_a_written_reward(process_provider, tmp_path):
    # The policy's code cannot escape a reward of 0 by making the verifier's output look like an OOM.
    test_sh = "echo 'MemoryError: Cannot allocate memory'; echo 0 > /logs/verifier/reward.txt\n"
    result = attempt(process_provider(), load_task(write_task(tmp_path, "t", test_sh=test_sh)))
    assert result.outcome == Outcome.OK and result.reward == 0.0, (result.outcome, result.detail)


def test_row_verifier_env_missing(process_provider, tmp_path, monkeypatch):
    monkeypatch.delenv("RL360_TEST_NEVER_SET", raising=False)
    toml = '[verifier.env]\nKEY = "${RL360_TEST_NEVER_SET}"\n'
    result = attempt(process_provider(), load_task(write_task(tmp_path, "t", toml=toml)))
    expect(result, Event.VERIFIER_ENV_MISSING)
    assert "RL360_TEST_NEVER_SET" in result.detail


def test_row_egress_failed(process_provider, proxy_of, tmp_path):
    """The verifier needs a host the profile allows, and nothing answers there: the attempt is masked, not scored 0."""
    proxy = proxy_of('allow = ["files.example.test"]\n[egress.hosts]\n"files.example.test" = "127.0.0.1"\n')
    fetch = (f"python3 -c 'import urllib.request; urllib.request.urlopen(\"http://files.example.test:{free_port()}/x\")'"
             " || true; ")
    task = load_task(write_task(tmp_path, "t", image=PYTHON, test_sh=fetch + REWARD_0))
    result = attempt(process_provider(egress=proxy.route), task)
    expect(result, Event.EGRESS_FAILED)
    assert result.detail.startswith("rl360 egress: cannot reach files.example.test:") and result.egress.failed


def test_row_injected(process_provider, tmp_path):
    task = load_task(write_task(tmp_path, "t"))
    provider = FaultInjector(process_provider(), rate=0.999, seed=1)
    result = attempt(provider, task)
    expect(result, Event.INJECTED)
    assert result.injected and provider.injected == [("row", "start")]
