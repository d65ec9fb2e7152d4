"""Model-written code runs in sandboxes: prove that it cannot reach out, read or write the host, or exceed its limits.

Each test makes a real attempt whose agent runs the hostile command, with the process provider (bubblewrap +
rlimits) and with the docker provider on the dev nodes, and checks both what the command saw and the host.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import threading
import uuid
import zlib
from pathlib import Path

import pytest

from rl360cli.egress.client import EgressRoute
from rl360cli.outcome import Outcome
from rl360cli.sandbox.attempt import run_attempt
from rl360cli.sandbox.task_loader import load_task
from tests.conftest import REPO, need
from tests.sandbox.conftest import BUSYBOX, PYTHON, run, write_task

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
    from rl360cli import procinfo

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


# The sandbox's own loopback works; the host's listener is not reached at 127.0.0.1, nor (process
# sandboxes) through slirp's gateway 10.0.2.2, which slirp would otherwise forward to the host's 127.0.0.1.
# Last: how many default routes the sandbox has.
PROBE = """python3 - {port} {hosts} <<'PY'
import socket, sys
own = socket.socket(); own.bind(("127.0.0.1", 0)); own.listen(1)
socket.create_connection(own.getsockname(), timeout=3); print("OWN-LOOPBACK")
for host in sys.argv[2:]:
    try:
        socket.create_connection((host, int(sys.argv[1])), timeout=3); print(host, "CONNECTED")
    except OSError as e:
        print(host, "refused:", e)
PY
awk '$2 == "00000000"' /proc/net/route | wc -l"""


def need_slirp() -> None:
    need(shutil.which("slirp4netns") is not None, "slirp4netns missing: apt-get install slirp4netns")


# The profile's `[egress] mode = "open"`: a network task's process sandbox gets slirp4netns's NAT.
OPEN = EgressRoute(mode="open")


def test_a_network_task_cannot_reach_any_port_on_the_hosts_loopback(provider_of, kind, tmp_path):
    if kind == "process":
        need_slirp()
    hosts = "127.0.0.1 10.0.2.2" if kind == "process" else "127.0.0.1"  # 10.0.2.2 exists only inside slirp
    listener = Listener()
    try:
        result, (seen,) = attempt(provider_of(egress=OPEN), hostile_task(tmp_path, network_mode="public"),
                                  PROBE.format(port=listener.port, hosts=hosts))
    finally:
        listener.close()
    assert "OWN-LOOPBACK" in seen.output and "CONNECTED" not in seen.output, seen.output
    assert [line.split()[0] for line in seen.output.splitlines() if " refused: " in line] == hosts.split()
    assert listener.accepted == 0
    # The process sandbox has a network (slirp's default route); the dev Docker nodes have no bridge, so the
    # container gets none (test_on_nodes_without_a_bridge_...); on a bridge its 127.0.0.1 would be its own.
    assert int(seen.output.split()[-1]) == (1 if kind == "process" else 0), seen.output
    assert result.outcome == Outcome.OK


def test_a_process_sandboxs_network_is_its_own_or_none(process_provider, tmp_path):
    need_slirp()
    task = hostile_task(tmp_path, network_mode="public")

    async def network_of(provider):
        sandbox = await provider.start(task, attempt_id="net", labels={})
        try:
            return sandbox.info(), await sandbox.exec("cut -d: -f1 /proc/net/dev | tail -n +3", timeout_s=20)
        finally:
            await sandbox.stop()

    info, allowed = run(network_of(process_provider(egress=OPEN)))
    assert info["network"] == "slirp4netns" and not info["network_denied"]
    assert allowed.output.split() == ["lo", "tap0"]
    for denied in (process_provider(egress=OPEN, network="none"), process_provider()):  # [egress] none: the default
        info, refused = run(network_of(denied))
        assert info["network"] == "none" and info["network_denied"]
        assert refused.output.split() == ["lo"]  # only a loopback of its own


def test_on_nodes_without_a_bridge_a_network_task_gets_none_and_is_told(docker_provider, tmp_path):
    provider = docker_provider(egress=OPEN)
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


def test_it_cannot_write_outside_its_folders(provider_of, tmp_path):
    outside = tmp_path / "outside.txt"
    commands = [f"echo pwned > {outside}", "echo pwned > /usr/pwned.txt", "echo pwned > /pwned.txt",
                "echo fine > /app/inside.txt && cat /app/inside.txt"]
    result, seen = attempt(provider_of(read_only_root=True), hostile_task(tmp_path), *commands)
    assert not outside.exists() and not Path("/usr/pwned.txt").exists() and not Path("/pwned.txt").exists()
    assert seen[0].exit_code != 0
    assert seen[1].exit_code != 0 and seen[2].exit_code != 0  # a read-only root (a container's, when asked)
    assert seen[3].exit_code == 0 and seen[3].output.strip() == "fine"
    assert result.outcome == Outcome.OK


FORK = """python3 -c '
import os, sys, time
n = 0
try:
    while n < 1000:
        if os.fork() == 0:
            os.close(1); os.close(2); time.sleep(SECONDS); os._exit(0)
        n += 1
except OSError as e:
    print("forked", n, "then", e.strerror, flush=True)
'"""


def unique_seconds(tmp_path, whole: int) -> str:
    """`whole`.NNNNNN, different for each test and parameter: the host-wide search for leftovers must
    not find the processes of the same test running for the other provider at the same time."""
    return f"{whole}.{zlib.crc32(str(tmp_path).encode()) % 10**6:06d}"


def test_a_fork_bomb_stops_at_the_process_limit_and_leaves_nothing(provider_of, tmp_path):
    provider = provider_of(pids_limit=64)
    seconds = unique_seconds(tmp_path, 60)
    result, (python_bomb, shell_bomb) = attempt(provider, hostile_task(tmp_path), FORK.replace("SECONDS", seconds),
                                                 "bomb() { bomb | bomb & }; bomb; sleep 8", timeout_s=6)
    words = python_bomb.output.split()
    assert words[0] == "forked" and int(words[1]) < 64, python_bomb.output
    assert python_bomb.limit == "processes" or "Resource temporarily unavailable" in python_bomb.output
    assert shell_bomb.timed_out or shell_bomb.limit == "processes"
    assert result.outcome == Outcome.MODEL_FAILURE and result.reward == 0.0
    assert not sandbox_processes(f"time.sleep({seconds})")


# Leaves behind a process that holds every pid of the limit (its children sleep, and it forks again as
# soon as one is free) and kills any `sleep` of the sandbox's init, so that an init that forks one finds
# no pid for the next; the command itself ends after 2 s.
HOARD = """python3 -c '
import os, time
if os.fork():
    time.sleep(2)
    os._exit(0)
fd = os.open("/dev/null", os.O_RDWR)
for n in 0, 1, 2:
    os.dup2(fd, n)
def init_sleeps():
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            comm, stat = open(f"/proc/{pid}/comm").read(), open(f"/proc/{pid}/stat").read()
        except OSError:
            continue
        if comm == "sleep\\n" and stat.rsplit(")", 1)[1].split()[1] == "1":
            yield int(pid)
while True:
    try:
        if os.fork() == 0:
            time.sleep(SECONDS)
            os._exit(0)
    except OSError:
        for pid in init_sleeps():
            os.kill(pid, 9)
'"""


def test_processes_that_hold_every_pid_past_the_agents_end_are_killed_before_the_verifier(provider_of, tmp_path):
    """No command of rl360's can start in a sandbox whose pids are all held: the verifier still runs
    (in a container, its init kills them, which takes no new pid) and its reward stands."""
    seconds = unique_seconds(tmp_path, 60)
    result, (seen,) = attempt(provider_of(pids_limit=32), hostile_task(tmp_path), HOARD.replace("SECONDS", seconds))
    assert seen.exit_code == 0 and not seen.timed_out, seen
    assert result.outcome == Outcome.OK and result.reward == 0.0 and result.events == ("reward",), result.detail
    assert not sandbox_processes(f"time.sleep({seconds})")


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
    marker = unique_seconds(tmp_path, 300)
    result, (seen, listing) = attempt(
        provider_of(), hostile_task(tmp_path),
        f"(sleep {marker} &); setsid sleep {marker} & sleep {marker}",
        "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done | grep -c 'sleep [3]00' || true",
        timeout_s=2)
    assert seen.timed_out and seen.exit_code is None and 1.5 < seen.duration_s < 15
    assert listing.output.strip() == "0"  # nothing of it is left in the sandbox
    assert not sandbox_processes(f"sleep {marker}")  # nor anywhere on this machine
    assert result.outcome == Outcome.MODEL_FAILURE and "timeout" in result.detail


@pytest.fixture
def secrets_home():
    """A real state file and run folder, world-readable (so only the sandbox's isolation keeps them out)."""
    from rl360cli.state.store import StateFile

    home = Path(tempfile.gettempdir()) / "rl360-test-secrets" / uuid.uuid4().hex[:12]
    state_path = home / ".rl360" / "state.json"
    state_path.parent.mkdir(parents=True)
    with StateFile(state_path).update():
        pass  # writes a whole, valid document
    checkpoint = home / "runs" / "secret-run" / "checkpoints" / "step-1" / "trainer.txt"
    checkpoint.parent.mkdir(parents=True)
    checkpoint.write_text("SECRET-RUN\n")
    for folder, _, files in os.walk(home.parent):
        os.chmod(folder, 0o755)
        for name in files:
            os.chmod(os.path.join(folder, name), 0o644)
    yield state_path, home / "runs" / "secret-run"
    shutil.rmtree(home, ignore_errors=True)


def host_path_of(sandbox, kind: str, path: str) -> str:
    """Where the host sees `path` of a live sandbox: in its folder, or in its container's root through /proc."""
    if kind == "process":
        return f"{sandbox.fs}{path}"
    pid = sandbox.owner.api(sandbox.node).inspect_container(sandbox.container_id)["State"]["Pid"]
    return f"/proc/{pid}/root{path}"


def test_it_cannot_read_the_state_file_the_run_folder_or_another_live_sandbox(provider_of, kind, tmp_path,
                                                                                secrets_home, monkeypatch):
    from rl360cli.sandbox.config import WarmPoolConfig

    state_path, run_dir = secrets_home
    monkeypatch.setenv("RL360_STATE", str(state_path))
    assert '"sandboxes"' in state_path.read_text()
    provider = provider_of(warm_pool=WarmPoolConfig(size=0))
    task = hostile_task(tmp_path)

    async def go():
        mine = await provider.start(task, attempt_id="mine", labels={"rl360.run": provider.run_id})
        other = await provider.start(task, attempt_id="other", labels={"rl360.run": provider.run_id})
        try:
            assert (await other.exec("echo SECRET-OTHER > /app/secret.txt", timeout_s=20)).exit_code == 0
            other_file = host_path_of(other, kind, "/app/secret.txt")
            assert Path(other_file).read_text() == "SECRET-OTHER\n"  # a real path, and the host reads it
            paths = [state_path, state_path.parent, run_dir, run_dir / "checkpoints/step-1/trainer.txt",
                     other_file, Path(other_file).parent]
            seen = [await mine.exec(f"cat {p} || ls -la {p}", timeout_s=20) for p in paths]
            return seen, await mine.exec("env; ls /tmp /", timeout_s=20)
        finally:
            await mine.stop()
            await other.stop()

    seen, env = run(go())
    for result in seen:
        assert result.exit_code != 0 and "No such file" in result.output, result.output
        assert not any(s in result.output for s in ("SECRET-", '"sandboxes"', "total ")), result.output
    assert "RL360" not in env.output and "rl360-test-secrets" not in env.output, env.output


PTRACE = """sleep 30 & python3 - $! {host_pid} <<'PY'
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
for label, pid in zip(("sibling", "host"), map(int, sys.argv[1:])):
    rc = libc.ptrace(16, pid, None, None)  # PTRACE_ATTACH
    print(label, "ATTACHED" if rc == 0 else "refused: " + os.strerror(ctypes.get_errno()))
seen = []
for name in filter(str.isdigit, os.listdir("/proc")):
    try:
        seen.append(open(f"/proc/{{name}}/cmdline", "rb").read().replace(b"\\0", b" ").decode())
    except OSError:
        pass
marker = "{marker}".replace("_", "")  # not written whole here: this script is in its own shell's command line
print("visible", len(seen), "host-marker" if any(marker in c for c in seen) else "no-host-marker")
PY
kill -9 $! 2>/dev/null; true"""


def test_it_cannot_ptrace_and_sees_no_host_process(provider_of, kind, tmp_path):
    marker = "300.6161"
    host = subprocess.Popen(["sleep", marker])
    try:
        result, (seen,) = attempt(provider_of(), hostile_task(tmp_path),
                                  PTRACE.format(host_pid=host.pid, marker="_".join(marker)))
        tracer = [line for line in Path(f"/proc/{host.pid}/status").read_text().splitlines()
                  if line.startswith("TracerPid:")]
    finally:
        host.kill()
        host.wait()
    lines = dict(line.split(" ", 1) for line in seen.output.strip().splitlines())
    assert lines["host"].startswith("refused"), seen.output  # not there: a pid namespace of its own
    assert lines["visible"].endswith(" no-host-marker") and int(lines["visible"].split()[0]) < 10, seen.output
    assert tracer == ["TracerPid:\t0"]
    if kind == "process":
        assert lines["sibling"] == "refused: Operation not permitted", seen.output  # the seccomp filter
    # Docker keeps its default seccomp profile, which allows ptrace: the agent may trace the container's own
    # processes of its user, never one outside it (docs/sandboxes.md, "Limits, side by side").
    assert result.outcome == Outcome.OK


def test_no_process_it_started_outlives_its_attempt(provider_of, kind, tmp_path):
    marker = "300.7373"
    provider = provider_of()
    count = "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done | grep -c 'sleep [3]00.7373'"
    result, (started, later) = attempt(
        provider, hostile_task(tmp_path),
        f"nohup sleep {marker} >/dev/null 2>&1 & setsid sleep {marker} >/dev/null 2>&1 & echo started", count)
    assert started.exit_code == 0 and "started" in started.output
    # A process sandbox's command has a pid namespace of its own, which ends with it; a container keeps the
    # agent's background processes between its commands and through the verifier (Harbor's rule), until its removal.
    assert later.output.strip() == ("0" if kind == "process" else "2"), later.output
    run(provider.close())  # waits for the container's removal
    assert not sandbox_processes(f"sleep {marker}")
    assert result.outcome == Outcome.OK


def test_a_containers_root_is_writable_by_default_and_the_hosts_is_untouched(docker_provider, tmp_path):
    """Harbor's images expect root to install what they need: by default a container's root is its own to write.
    And to serve it: sshd chroots its pre-auth child (SYS_CHROOT), which no other capability may stand in for."""
    result, (wrote, chrooted) = attempt(docker_provider(), hostile_task(tmp_path),
                                        "echo x > /usr/rl360-probe && echo x > /rl360-probe && echo wrote",
                                        "chroot / /bin/sh -c 'echo chrooted'")
    assert wrote.exit_code == 0 and wrote.output.strip() == "wrote", wrote.output
    assert not Path("/usr/rl360-probe").exists() and not Path("/rl360-probe").exists()
    # Without SYS_CHROOT: "chroot: cannot change root directory to '/': Operation not permitted".
    assert chrooted.exit_code == 0 and chrooted.output.strip() == "chrooted", chrooted.output
    assert result.outcome == Outcome.OK


CAPABILITY_BITS = {"DAC_OVERRIDE": 1, "KILL": 5}  # of a read-only root's container (linux/capability.h)


def test_it_runs_without_capabilities_or_new_privileges_on_a_read_only_root(provider_of, kind, tmp_path):
    from rl360cli.sandbox.docker.container import CAP_ADD

    result, (status, writes) = attempt(
        provider_of(read_only_root=True), hostile_task(tmp_path),
        "grep -E '^(CapEff|CapBnd|NoNewPrivs):' /proc/self/status",
        "for p in /usr /etc /root /var ''; do echo x > $p/rl360-probe 2>/dev/null && echo WROTE $p; done; "
        "for p in /app /tmp /tests /logs; do echo x > $p/rl360-probe && echo ok $p; done; "
        "printf '#!/bin/sh\\necho ran\\n' > /tmp/x.sh && chmod +x /tmp/x.sh && /tmp/x.sh")
    fields = dict(line.split(":\t") for line in status.output.strip().splitlines())
    expected = 0 if kind == "process" else sum(1 << CAPABILITY_BITS[name] for name in CAP_ADD)
    assert int(fields["CapEff"], 16) == expected and int(fields["CapBnd"], 16) == expected, fields
    assert fields["NoNewPrivs"] == "1"
    assert "WROTE" not in writes.output, writes.output
    assert all(f"ok {p}" in writes.output for p in ("/app", "/tmp", "/tests", "/logs")), writes.output
    assert "ran" in writes.output  # /tmp is not mounted noexec
    assert result.outcome == Outcome.OK


def test_docker_roots_are_read_only_for_the_shipped_tasks_and_writable_where_a_task_needs_it(tmp_path):
    from rl360cli.sandbox.docker.container import read_only_volumes
    from rl360cli.sandbox.task_loader import load_task_set

    shipped = load_task_set(REPO / "recipes" / "tasks" / "examples") + \
        load_task_set(REPO / "recipes" / "tasks" / "coding-32")
    assert len(shipped) == 40
    assert {read_only_volumes(t) for t in shipped} == {("/app", "/logs", "/solution", "/tests")}
    nested = load_task(write_task(tmp_path, "nested", toml='[environment]\nworkdir = "/tests/work"\n'))
    assert read_only_volumes(nested) == ("/app", "/logs", "/solution", "/tests")[1:]
    in_tmp = load_task(write_task(tmp_path, "in-tmp", toml='[environment]\nworkdir = "/tmp/w"\n'))
    assert read_only_volumes(in_tmp) == ("/logs", "/solution", "/tests")
    in_usr = load_task(write_task(tmp_path, "in-usr", toml='[environment]\nworkdir = "/usr/src/app"\n'))
    artifact = load_task(write_task(tmp_path, "artifact", toml='artifacts = ["/output/result.json"]\n'))
    in_tmpfs = load_task(write_task(tmp_path, "in-tmpfs", toml='artifacts = ["/tmp/result.json"]\n'))
    assert read_only_volumes(in_usr) is read_only_volumes(artifact) is read_only_volumes(in_tmpfs) is None
    in_logs = load_task(write_task(tmp_path, "in-logs", toml='artifacts = ["/logs/out", "/app/result.json"]\n'))
    assert read_only_volumes(in_logs) == ("/app", "/logs", "/solution", "/tests")


def test_an_agent_of_another_user_is_ended_and_cleared_up_before_the_verifier(docker_provider, tmp_path):
    """Why CAP_ADD is KILL and DAC_OVERRIDE: without them root cannot kill this agent's process (here before
    the verifier, `end_agent_before_verifier`; at a timeout and after the verifier alike: reward 0 here)
    and cannot empty the 0700 folder it left (an infra failure)."""
    from rl360cli.sandbox.config import WarmPoolConfig
    dockerfile = f"FROM {BUSYBOX}\nRUN mkdir /app && chown 65534 /app\nUSER 65534\nWORKDIR /app\n"
    task = load_task(write_task(
        tmp_path, "nobody", dockerfile=dockerfile,
        test_sh="if ps | grep -q '[s]leep 300.8383'; then echo 0; else echo 1; fi > /logs/verifier/reward.txt\n"))
    result, (seen,) = attempt(docker_provider(warm_pool=WarmPoolConfig(size=0), end_agent_before_verifier=True), task,
                              "id -u; mkdir -m 700 /logs/verifier/left && echo x > /logs/verifier/left/file && "
                              "sleep 300.8383 >/dev/null 2>&1 & echo started")
    assert seen.output.split() == ["65534", "started"], seen.output
    assert result.outcome == Outcome.OK and result.reward == 1.0, (result.outcome, result.cause, result.detail)
