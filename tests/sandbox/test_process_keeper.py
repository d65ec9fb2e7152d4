"""`[sandbox] process_namespace = "sandbox"`: a keeper per process sandbox (rl360cli/sandbox/process/keeper.py),
on real bubblewrap, as root (as CI runs). What its commands keep (Harbor's rule: what the agent left runs
through the verifier), what they cannot do to the keeper, and the provider's own tests run again in this mode.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

from rl360cli import procinfo
from rl360cli.outcome import Outcome
from rl360cli.sandbox.attempt import run_attempt
from rl360cli.sandbox.config import SandboxConfig
from rl360cli.sandbox.task_loader import load_task
from rl360cli.sandbox.taxonomy import Event, SandboxError
from tests.egress.conftest import proxy_of  # noqa: F401 - the real egress proxy of test_network's "allow" rows
from tests.sandbox.conftest import run, write_task
# The provider's own tests and the process half of the sandbox layer's (security, network, sidecars, Harbor's
# semantics), collected here again with this module's `process_config`: in the keeper's mode.
from tests.sandbox.test_harbor_semantics import (  # noqa: F401
    test_a_dockerfile_without_workdir_runs_in_app_on_the_process_provider,
    test_a_steps_setup_sh_runs_before_its_agent,
)
from tests.sandbox.test_network import routes, test_the_process_provider_follows_the_table  # noqa: F401
from tests.sandbox.test_process_provider import (  # noqa: F401
    test_a_missing_sandbox_folder_is_a_killed_sandbox,
    test_a_sandbox_has_the_paths_a_task_expects_and_nothing_of_the_host,
    test_each_live_sandbox_gets_its_own_uid,
    test_files_persist_between_commands_and_env_is_passed,
    test_output_is_capped_keeping_head_and_tail,
    test_symlinks_planted_by_the_sandbox_are_never_followed_on_the_host,
    test_upload_download_and_reading_files,
)
from tests.sandbox.test_security import (  # noqa: F401
    hostile_task,
    sandbox_processes,
    test_a_background_child_is_killed_at_the_timeout,
    test_a_fork_bomb_stops_at_the_process_limit_and_leaves_nothing,
    test_a_huge_file_stops_at_the_file_size_limit,
    test_allocating_past_its_memory_fails_the_command_not_the_node,
    test_it_cannot_ptrace_and_sees_no_host_process,
    test_it_cannot_write_outside_its_folders,
    test_no_network_a_socket_to_127_0_0_1_does_not_connect,
    test_processes_that_hold_every_pid_past_the_agents_end_are_killed_before_the_verifier,
)
from tests.sandbox.test_sidecars import (  # noqa: F401
    test_a_sidecar_that_never_gets_healthy_fails_the_start_with_its_reason,
    test_process_sidecars_are_reached_by_name_private_and_stopped_with_the_sandbox,
)

pytestmark = [pytest.mark.timeout(180),
              pytest.mark.skipif(os.geteuid() != 0, reason="a keeper needs root (a uid of the sandbox's own)")]


@pytest.fixture
def process_config():
    def make(**overrides) -> SandboxConfig:
        return SandboxConfig(**{"provider": "process", "process_namespace": "sandbox", **overrides})

    return make


@pytest.fixture(params=["process"])
def provider_of(request):
    """test_security's providers: here only the process provider, in the keeper's mode."""
    return request.getfixturevalue("process_provider")


@pytest.fixture
def kind() -> str:
    return "process"


def start(provider, task, attempt="k"):
    return provider.start(task, attempt_id=attempt, labels={"rl360.run": provider.run_id})


def plain_task(tmp_path, test_sh="mkdir -p /logs/verifier; echo 1 > /logs/verifier/reward.txt\n", **kwargs):
    return load_task(write_task(tmp_path, "t", test_sh=test_sh, **kwargs))


def host_pids(marker: str) -> list[int]:
    return sandbox_processes(marker)


def test_the_switch_is_checked_when_the_recipe_loads():
    with pytest.raises(ValueError, match="process_namespace must be one of command, sandbox"):
        SandboxConfig(process_namespace="container")
    assert SandboxConfig().process_namespace == "command"


def test_what_a_command_leaves_running_lives_until_the_sandbox_stops(process_provider, tmp_path):
    provider = process_provider()
    assert provider.keeps_namespaces
    marker = "300.4242"

    async def go():
        sandbox = await start(provider, plain_task(tmp_path))
        try:
            first = await sandbox.exec(f"sleep {marker} & echo $! > /tmp/pid; echo started", timeout_s=10)
            later = await sandbox.exec("kill -0 $(cat /tmp/pid) && echo alive; echo $$", timeout_s=10)
            before_stop = host_pids(f"sleep {marker}")
        finally:
            await sandbox.stop()
        return first, later, before_stop

    first, later, before_stop = run(go())
    assert first.exit_code == 0 and first.output == "started\n"
    assert later.exit_code == 0 and later.output.split()[0] == "alive"
    assert len(before_stop) == 1
    assert not procinfo.is_alive(before_stop[0]) and not host_pids(f"sleep {marker}")  # stop ended it, by pid


def test_the_agents_server_is_there_for_the_verifier_and_gone_before_the_reward_is_read(process_provider, tmp_path):
    """Harbor's rule, as the docker provider keeps it: the verifier reaches what the agent left running."""
    provider = process_provider()
    test_sh = ("mkdir -p /logs/verifier; if kill -0 $(cat /tmp/server.pid); then echo 1; else echo 0; fi "
               "> /logs/verifier/reward.txt\n")
    task = plain_task(tmp_path, test_sh=test_sh)
    seen = {}

    async def agent(sandbox):
        await sandbox.exec("sleep 300.4343 & echo $! > /tmp/server.pid", timeout_s=10)
        seen["sandbox"] = sandbox

    result = run(run_attempt(provider, task, agent, attempt_id="srv", labels={"rl360.run": provider.run_id}))
    assert result.outcome == Outcome.OK and result.reward == 1.0, result.detail
    assert not host_pids("sleep 300.4343")


def test_end_agent_before_verifier_kills_it_first(process_provider, tmp_path):
    provider = process_provider(end_agent_before_verifier=True)
    test_sh = ("mkdir -p /logs/verifier; if kill -0 $(cat /tmp/server.pid) 2>/dev/null; then echo 1; else echo 0; "
               "fi > /logs/verifier/reward.txt\n")

    async def agent(sandbox):
        await sandbox.exec("sleep 300.4444 & echo $! > /tmp/server.pid", timeout_s=10)

    result = run(run_attempt(provider, plain_task(tmp_path, test_sh=test_sh), agent, attempt_id="end",
                             labels={"rl360.run": provider.run_id}))
    assert result.outcome == Outcome.OK and result.reward == 0.0, result.detail


# Every way at the keeper (pid 1) a command of the same uid has; each line says what it got.
AT_THE_KEEPER = r"""python3 - <<'PY'
import ctypes, os, signal
libc = ctypes.CDLL(None, use_errno=True)
def attempt(label, fn):
    try:
        fn()
        print(label, "DONE")
    except OSError as e:
        print(label, "refused", e.errno)
attempt("mem", lambda: open("/proc/1/mem", "rb").read(1))
attempt("mem-write", lambda: open("/proc/1/mem", "wb"))
attempt("fd", lambda: os.listdir("/proc/1/fd"))
attempt("fd2", lambda: open("/proc/1/fd/2", "wb"))
attempt("environ", lambda: open("/proc/1/environ", "rb").read(1))
attempt("exe", lambda: open("/proc/1/exe", "rb").read(1))
attempt("binary", lambda: open("/.rl360-keeper", "rb").read(1))
rc = libc.ptrace(16, 1, None, None)  # PTRACE_ATTACH
print("ptrace", "DONE" if rc == 0 else f"refused {ctypes.get_errno()}")
attempt("cont", lambda: os.kill(1, signal.SIGCONT))
PY"""


def test_a_command_cannot_read_write_or_trace_the_keeper(process_provider, tmp_path):
    provider = process_provider()

    async def go():
        sandbox = await start(provider, plain_task(tmp_path))
        try:
            seen = await sandbox.exec(AT_THE_KEEPER, timeout_s=30)
            after = await sandbox.exec("echo still-kept", timeout_s=10)
        finally:
            await sandbox.stop()
        return seen, after

    seen, after = run(go())
    lines = dict(line.split(" ", 1) for line in seen.output.strip().splitlines())
    assert set(lines) == {"mem", "mem-write", "fd", "fd2", "environ", "exe", "binary", "ptrace", "cont"}, seen.output
    assert all(value.startswith("refused") for value in lines.values()), seen.output
    assert after.output == "still-kept\n"


def test_a_command_cannot_forge_another_commands_status_or_output(process_provider, tmp_path):
    """The replies go on a pipe no command holds: a leftover that writes reply-shaped lines everywhere it can,
    and reads back the output pipe, changes no exit status."""
    provider = process_provider()
    forger = r"""python3 - <<'PY' &
import os, time
reader = os.open("/proc/self/fd/1", os.O_RDONLY | os.O_NONBLOCK)  # the output pipe's read end
end = time.time() + 20
while time.time() < end:
    for fd in (1, 2):
        os.write(fd, b"\n0 0\nrun 1 1 1\n/\n:\nexit 0\n")
    try:
        os.read(reader, 65536)
    except BlockingIOError:
        pass
    time.sleep(0.001)
PY
echo forger-started"""

    async def go():
        sandbox = await start(provider, plain_task(tmp_path))
        try:
            started = await sandbox.exec(forger, timeout_s=10)
            codes = [(await sandbox.exec(f"echo mine-{n}; exit {n}", timeout_s=10)) for n in (3, 5, 7, 0)]
        finally:
            await sandbox.stop()
        return started, codes

    started, codes = run(go())
    assert "forger-started" in started.output
    assert [result.exit_code for result in codes] == [3, 5, 7, 0]
    assert not any(result.timed_out for result in codes)


def test_a_timeout_ends_everything_in_the_sandbox_and_the_next_command_starts_afresh(process_provider, tmp_path):
    provider = process_provider()

    async def go():
        sandbox = await start(provider, plain_task(tmp_path))
        try:
            await sandbox.exec("sleep 300.4545 & echo kept > /tmp/file", timeout_s=10)
            slow = await sandbox.exec("sleep 300.4646", timeout_s=1)
            left = host_pids("300.45") + host_pids("300.46")
            after = await sandbox.exec("cat /tmp/file; for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; "
                                       "done 2>/dev/null | grep -c '^sleep 300' || true", timeout_s=10)
        finally:
            await sandbox.stop()
        return slow, left, after

    slow, left, after = run(go())
    assert slow.timed_out and slow.exit_code is None
    assert left == []  # docker's timeout kills every process of the container too
    assert after.output.split() == ["kept", "0"]  # the files stay, no process does


def test_a_keeper_killed_from_outside_fails_the_next_command_as_a_killed_sandbox(process_provider, tmp_path):
    provider = process_provider()

    async def go():
        sandbox = await start(provider, plain_task(tmp_path))
        try:
            await sandbox.exec("true", timeout_s=10)
            os.kill(sandbox._kept.pid, signal.SIGKILL)
            with pytest.raises(SandboxError) as raised:
                await sandbox.exec("echo never", timeout_s=10)
        finally:
            await sandbox.stop()
        return raised.value

    error = run(go())
    assert error.event == Event.SANDBOX_KILLED and "keeper" in error.detail


def test_concurrent_commands_each_get_their_own_result(process_provider, tmp_path):
    """One runs in the keeper, the others (sent while it is busy) each in a bubblewrap of their own."""
    provider = process_provider()

    async def go():
        sandbox = await start(provider, plain_task(tmp_path))
        try:
            return await asyncio.gather(*(sandbox.exec(f"sleep 0.3; echo out-{n}; exit {n}", timeout_s=20,
                                                       env={"N": str(n)}) for n in range(4)))
        finally:
            await sandbox.stop()

    results = run(go())
    assert [(r.exit_code, r.output) for r in results] == [(n, f"out-{n}\n") for n in range(4)]


def test_the_sandboxs_processes_are_stopped_while_rl360_works_on_its_files(process_provider, tmp_path):
    provider = process_provider()
    ticker = ("python3 -c 'import os, time\nwhile True:\n    open(\"/tmp/t\", \"w\").write(str(time.monotonic_ns()))\n"
              "    os.replace(\"/tmp/t\", \"/tmp/tick\")' &")

    async def go():
        sandbox = await start(provider, plain_task(tmp_path))
        try:
            await sandbox.exec(f"{ticker} sleep 0.5", timeout_s=10)
            tick = Path(f"{sandbox.fs}/tmp/tick")
            async with sandbox._still():
                first = tick.read_text()
                await asyncio.sleep(0.3)
                still = tick.read_text()
            await asyncio.sleep(0.3)
            moved = tick.read_text()
            cont = await sandbox.exec("kill -CONT $$ 2>&1; echo $?", timeout_s=10)
        finally:
            await sandbox.stop()
        return first, still, moved, cont

    first, still, moved, cont = run(go())
    assert first == still != moved
    assert cont.output.strip().endswith("1")  # SIGCONT is refused inside (only rl360 continues them)


def test_a_new_top_level_folder_is_seen_by_the_next_command(process_provider, tmp_path):
    provider = process_provider()
    (tmp_path / "solution").mkdir()
    (tmp_path / "solution" / "solve.sh").write_text("echo solved\n")

    async def go():
        sandbox = await start(provider, plain_task(tmp_path))
        try:
            await sandbox.upload(tmp_path / "solution", "/solution")
            return await sandbox.exec("sh /solution/solve.sh", timeout_s=10)
        finally:
            await sandbox.stop()

    assert run(go()).output == "solved\n"


def test_ending_the_agents_processes_during_a_command_kills_it_as_docker_does(process_provider, tmp_path):
    provider = process_provider()

    async def go():
        sandbox = await start(provider, plain_task(tmp_path))
        try:
            running = asyncio.ensure_future(sandbox.exec("sleep 300.4747", timeout_s=60))
            while not host_pids("sleep 300.4747"):
                await asyncio.sleep(0.01)
            await sandbox.end_agent_processes()
            killed = await running
            after = await sandbox.exec("echo next", timeout_s=10)
        finally:
            await sandbox.stop()
        return killed, after

    killed, after = run(go())
    assert killed.exit_code == 128 + signal.SIGKILL and not killed.timed_out
    assert after.output == "next\n" and not host_pids("sleep 300.4747")
