"""Model-written code runs in sandboxes: prove that it cannot reach out, read or write the host, or exceed its limits.

Each test makes a real attempt whose agent runs the hostile command, with the process provider (bubblewrap +
rlimits) and with the docker provider on the dev nodes, and checks both what the command saw and the host.
"""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

import pytest

from rl360cli.outcome import Outcome
from rl360cli.sandbox.attempt import run_attempt
from rl360cli.sandbox.task import load_task
from tests.conftest import REPO
from tests.sandbox.conftest import PYTHON, run, write_task

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(params=["process", "docker"])
def provider_of(request):
    """`provider_of(**config)`: a provider of the parametrized kind."""
    if request.param == "process":
        return request.getfixturevalue("process_provider")
    return request.getfixturevalue("docker_provider")


@pytest.fixture
def kind(request) -> str:
    return request.node.callspec.params["provider_of"]


def attempt(provider, task, *commands: str, timeout_s: float = 20):
    """Run an attempt whose agent runs `commands`; returns (AttemptResult, [ExecResult, ...])."""
    seen = []

    async def agent(sandbox):
        for command in commands:
            seen.append(await sandbox.exec(command, timeout_s=timeout_s))

    result = run(run_attempt(provider, task, agent, attempt_id="sec", labels={"rl360.run": provider.run_id}))
    return result, seen


def hostile_task(tmp_path, **env):
    lines = "".join(f"{k} = {v!r}\n" if isinstance(v, str) else f"{k} = {v}\n" for k, v in env.items())
    return load_task(write_task(tmp_path, "hostile", image=PYTHON, toml="[environment]\n" + lines,
                                test_sh="mkdir -p /logs/verifier; echo 0 > /logs/verifier/reward.txt\n"))


def sandbox_processes(marker: str) -> list[int]:
    """Host pids (not zombies) whose command line contains `marker` (docker's containers run on this machine)."""
    from rl360cli.backends import procinfo

    found = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            try:
                cmdline = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue
            if marker.encode() in cmdline and procinfo.is_alive(int(name)):
                found.append(int(name))
    return found


class Listener:
    """A TCP server on 127.0.0.1 that counts the connections it accepts."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self._stop = False
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self):
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
                self.accepted += 1
                conn.close()
            except OSError:
                continue

    def close(self):
        self._stop = True
        self._thread.join()
        self.sock.close()


CONNECT = ("python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {port}), timeout=3); "
           "print(\"CONNECTED\")'")


def test_no_network_a_socket_to_127_0_0_1_does_not_connect(provider_of, tmp_path):
    listener = Listener()
    try:
        result, (seen,) = attempt(provider_of(), hostile_task(tmp_path), CONNECT.format(port=listener.port))
    finally:
        listener.close()
    assert seen.exit_code != 0 and "CONNECTED" not in seen.output
    assert listener.accepted == 0
    assert result.outcome == Outcome.OK and result.reward == 0.0


def test_a_task_that_asks_for_a_network_gets_one_only_where_allowed(process_provider, tmp_path):
    task = hostile_task(tmp_path, network_mode="public")
    listener = Listener()
    try:
        _, (allowed,) = attempt(process_provider(), task, CONNECT.format(port=listener.port))
        _, (refused,) = attempt(process_provider(network="none"), task, CONNECT.format(port=listener.port))
    finally:
        listener.close()
    assert "CONNECTED" in allowed.output and listener.accepted == 1
    assert refused.exit_code != 0 and "CONNECTED" not in refused.output


def test_on_nodes_without_a_bridge_a_network_task_gets_none_and_is_told(docker_provider, tmp_path):
    provider = docker_provider()
    task = hostile_task(tmp_path, network_mode="public")

    async def go():
        sandbox = await provider.start(task, attempt_id="net", labels={})
        try:
            return sandbox.info()
        finally:
            await sandbox.stop()

    info = run(go())
    assert info["network"] == "none" and info["network_denied"] is True


def test_it_cannot_read_the_project_or_host_secrets(provider_of, tmp_path):
    project_file = REPO / "pyproject.toml"
    assert "[project]" in project_file.read_text()
    commands = [f"cat {project_file}", f"ls {REPO}"]
    result, seen = attempt(provider_of(), hostile_task(tmp_path), *commands)
    assert all(r.exit_code != 0 for r in seen)
    assert "[project]" not in seen[0].output and "rl360cli" not in seen[1].output
    assert result.outcome == Outcome.OK


def test_process_sandboxes_cannot_read_roots_files(process_provider, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("only meaningful when rl360 runs as root")
    _, (seen,) = attempt(process_provider(), hostile_task(tmp_path), "cat /etc/shadow")
    assert seen.exit_code != 0 and "Permission denied" in seen.output


def test_it_cannot_write_outside_its_folders(provider_of, kind, tmp_path):
    outside = tmp_path / "outside.txt"
    commands = [f"echo pwned > {outside}", "echo pwned > /usr/pwned.txt", "echo pwned > /pwned.txt",
                "echo fine > /app/inside.txt && cat /app/inside.txt"]
    result, seen = attempt(provider_of(), hostile_task(tmp_path), *commands)
    assert not outside.exists() and not Path("/usr/pwned.txt").exists() and not Path("/pwned.txt").exists()
    assert seen[0].exit_code != 0
    if kind == "process":
        assert seen[1].exit_code != 0 and seen[2].exit_code != 0  # a read-only root (a container has its own)
    assert seen[3].exit_code == 0 and seen[3].output.strip() == "fine"
    assert result.outcome == Outcome.OK


FORK = """python3 -c '
import os, sys, time
n = 0
try:
    while n < 1000:
        if os.fork() == 0:
            os.close(1); os.close(2); time.sleep(60); os._exit(0)
        n += 1
except OSError as e:
    print("forked", n, "then", e.strerror, flush=True)
'"""


def test_a_fork_bomb_stops_at_the_process_limit_and_leaves_nothing(provider_of, tmp_path):
    provider = provider_of(pids_limit=64)
    result, (python_bomb, shell_bomb) = attempt(provider, hostile_task(tmp_path), FORK,
                                                 "bomb() { bomb | bomb & }; bomb; sleep 8", timeout_s=6)
    words = python_bomb.output.split()
    assert words[0] == "forked" and int(words[1]) < 64, python_bomb.output
    assert python_bomb.limit == "processes" or "Resource temporarily unavailable" in python_bomb.output
    assert shell_bomb.timed_out or shell_bomb.limit == "processes"
    assert result.outcome == Outcome.MODEL_FAILURE and result.reward == 0.0
    assert not sandbox_processes("time.sleep(60)")


def test_allocating_past_its_memory_fails_the_command_not_the_node(provider_of, tmp_path):
    provider = provider_of(memory_mb=128)
    result, (seen, after) = attempt(provider, hostile_task(tmp_path),
                                    "python3 -c 'b = b\"x\" * (400 * 2**20); print(len(b))'", "echo still-here")
    assert seen.exit_code != 0 and seen.oom_killed and seen.limit == "memory"
    assert str(400 * 2**20) not in seen.output
    assert after.exit_code == 0 and after.output.strip() == "still-here"  # the sandbox itself survived
    assert result.outcome == Outcome.MODEL_FAILURE and result.cause is None and "memory" in result.detail


def test_a_huge_file_stops_at_the_file_size_limit(provider_of, tmp_path):
    task = hostile_task(tmp_path, storage_mb=32)
    result, (seen, size) = attempt(provider_of(), task, "dd if=/dev/zero of=/app/big bs=1M count=200",
                                   "wc -c < /app/big")
    assert seen.exit_code != 0 and seen.limit == "file_size"
    assert int(size.output.strip()) <= 32 * 2**20
    assert result.outcome == Outcome.MODEL_FAILURE


def test_a_background_child_is_killed_at_the_timeout(provider_of, tmp_path):
    marker = "300.4242"
    result, (seen, listing) = attempt(
        provider_of(), hostile_task(tmp_path),
        f"(sleep {marker} &); setsid sleep {marker} & sleep {marker}",
        "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done | grep -c 'sleep [3]00' || true",
        timeout_s=2)
    assert seen.timed_out and seen.exit_code is None and 1.5 < seen.duration_s < 15
    assert listing.output.strip() == "0"  # nothing of it is left in the sandbox
    assert not sandbox_processes(f"sleep {marker}")  # nor anywhere on this machine
    assert result.outcome == Outcome.MODEL_FAILURE and "timeout" in result.detail
