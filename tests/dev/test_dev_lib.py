"""cluster/dev/lib.sh: the process helpers only ever signal the process they
started (pid + start time + command line), survive zombies, escalate TERM to
KILL, and settings stick. Needs no dev service: runs everywhere."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

LIB = Path(__file__).resolve().parents[2] / "cluster" / "dev" / "lib.sh"


def sh(script: str, root: Path, **env: str) -> subprocess.CompletedProcess:
    full = {**os.environ, "RL360_DEV_ROOT": str(root), **env}
    return subprocess.run(["bash", "-c", f"set -euo pipefail; source {LIB}; {script}"],
                          env=full, capture_output=True, text=True, timeout=60)


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


@pytest.fixture
def stray(tmp_path):
    """A process that is not ours to stop (another user's 'sleep')."""
    proc = subprocess.Popen(["sleep", "300"], start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


def test_start_records_pid_and_stop_ends_it(tmp_path):
    pidfile = tmp_path / "d.pid"
    res = sh(f'dev_start {pidfile} {tmp_path}/d.log "sleep 123" sleep 123; echo $DEV_PID', tmp_path)
    assert res.returncode == 0, res.stderr
    pid = int(res.stdout.split()[-1])
    lines = pidfile.read_text().split("\n")
    assert lines[0] == str(pid) and lines[2] == "sleep 123"
    assert alive(pid)
    # Its own session; no fd of ours held open beyond 0-2.
    assert os.getsid(pid) == pid
    assert sorted(os.listdir(f"/proc/{pid}/fd")) == ["0", "1", "2"]
    # Starting again is a no-op.
    again = sh(f'dev_start {pidfile} {tmp_path}/d.log "sleep 123" sleep 123; echo $DEV_PID', tmp_path)
    assert int(again.stdout.split()[-1]) == pid
    res = sh(f"dev_stop {pidfile} 5", tmp_path)
    assert res.stdout.startswith("stopped"), res.stdout + res.stderr
    assert not alive(pid) and not pidfile.exists()
    # Twice is fine.
    assert sh(f"dev_stop {pidfile} 5", tmp_path).stdout.strip() == "not running"


def test_reused_pid_is_never_signalled(tmp_path, stray):
    pidfile = tmp_path / "x.pid"
    # Same pid, wrong start time: a recycled pid.
    pidfile.write_text(f"{stray.pid}\n1\nsleep 300\n")
    assert sh(f"dev_stop {pidfile} 1", tmp_path).stdout.strip() == "not running"
    assert alive(stray.pid) and not pidfile.exists()
    # Right start time, but the command line is not what we started.
    start = Path(f"/proc/{stray.pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    pidfile.write_text(f"{stray.pid}\n{start}\n/usr/sbin/dockerd --host unix:///x\n")
    assert sh(f"dev_stop {pidfile} 1", tmp_path).stdout.strip() == "not running"
    assert alive(stray.pid)


def test_term_ignoring_daemon_is_killed_after_grace(tmp_path):
    pidfile = tmp_path / "t.pid"
    res = sh(f"dev_start {pidfile} {tmp_path}/t.log 'trap-term' "
             "bash -c 'trap \"\" TERM; exec -a trap-term sleep 300'; echo $DEV_PID", tmp_path)
    pid = int(res.stdout.split()[-1])
    time.sleep(0.2)
    t0 = time.monotonic()
    out = sh(f"dev_stop {pidfile} 1", tmp_path).stdout
    assert out.startswith("killed after 1s"), out
    assert time.monotonic() - t0 < 8
    assert not alive(pid)


def test_kill_is_immediate(tmp_path):
    pidfile = tmp_path / "k.pid"
    res = sh(f'dev_start {pidfile} {tmp_path}/k.log "sleep 321" sleep 321; echo $DEV_PID', tmp_path)
    pid = int(res.stdout.split()[-1])
    assert sh(f"dev_kill {pidfile}", tmp_path).stdout.startswith("killed")
    assert not alive(pid)


def test_a_daemon_that_dies_at_once_is_reported(tmp_path):
    res = sh(f"dev_start {tmp_path}/f.pid {tmp_path}/f.log 'no-such' /nonexistent/no-such-daemon",
             tmp_path)
    assert res.returncode != 0
    assert "exited at once" in res.stderr


def test_settings_stick_unless_overridden(tmp_path):
    f = tmp_path / "settings.env"
    assert sh(f"dev_settings {f} RL360_DEV_X_PORT=5000; echo $RL360_DEV_X_PORT", tmp_path,
              RL360_DEV_X_PORT="5100").stdout.split()[-1] == "5100"
    # Later, without the variable: the recorded value, not the default.
    env = {k: v for k, v in os.environ.items() if k != "RL360_DEV_X_PORT"}
    res = subprocess.run(["bash", "-c", f"set -euo pipefail; source {LIB}; "
                          f"dev_settings {f} RL360_DEV_X_PORT=5000; echo $RL360_DEV_X_PORT"],
                         env={**env, "RL360_DEV_ROOT": str(tmp_path)}, capture_output=True, text=True)
    assert res.stdout.split()[-1] == "5100", res.stderr
    assert f.read_text() == "RL360_DEV_X_PORT=5100\n"
    bad = sh(f"dev_settings {f} RL360_DEV_X_PORT=5000", tmp_path, RL360_DEV_X_PORT="1;rm")
    assert bad.returncode != 0


def test_json_strings_are_escaped(tmp_path):
    import json

    res = sh("""dev_json_str 'a"b\\c'""", tmp_path)
    assert json.loads(res.stdout) == 'a"b\\c'


def test_scripts_parse_and_print_usage(tmp_path):
    for name in ("docker-nodes.sh", "sshd-nodes.sh", "slurm.sh", "all.sh"):
        script = LIB.parent / name
        assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
        res = subprocess.run(["bash", str(script), "bogus"], capture_output=True, text=True,
                             env={**os.environ, "RL360_DEV_ROOT": str(tmp_path)})
        assert res.returncode == 2 and "up" in res.stdout, (name, res.stdout, res.stderr)


def test_stop_does_not_touch_a_zombie(tmp_path):
    """A zombie (PID 1 reaps slowly here) counts as gone: no signal, no wait."""
    child = subprocess.Popen(["bash", "-c", "exit 0"])
    time.sleep(0.3)  # now a zombie until we wait()
    try:
        start = Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
        pidfile = tmp_path / "z.pid"
        pidfile.write_text(f"{child.pid}\n{start}\nbash\n")
        t0 = time.monotonic()
        assert sh(f"dev_stop {pidfile} 5", tmp_path).stdout.strip() == "not running"
        assert time.monotonic() - t0 < 3
    finally:
        child.wait()
