"""Run one component under a small supervisor that records how it ended.

    python -m rl360cli.supervise STATUS_JSON LOG -- COMMAND [ARGS...]

The CLI that starts a component exits long before the component does, so no
one would be left to collect its exit code. The supervisor waits for it and
writes `{pid, start_time, exit_code, signal, ended_at}` to STATUS_JSON. It
appends the component's output to LOG with a UTC timestamp on every line, so
that `rl360 logs` can merge many components in time order. It is a child
subreaper: processes the component leaves behind (a daemonised Ray worker,
say) are re-parented to it and ended with it, so nothing outlives the
component unseen.

A floor module, beside procinfo.py: the local backend and Slurm's job steps launch it, and inference
raises its open-files limit the same way (`open_files_up_to_hard_limit`).
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import IO

from rl360cli import procinfo

PR_SET_CHILD_SUBREAPER = 36
ORPHAN_GRACE_S = 3.0


def write_status(path: Path, status: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(status))
    os.replace(tmp, path)


def stamp() -> bytes:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ ").encode()


def copy_lines(source: IO[bytes], log: IO[bytes]) -> None:
    """Append every line of `source` to `log`, each behind a timestamp, as it arrives."""
    for line in iter(source.readline, b""):
        log.write(stamp() + (line if line.endswith(b"\n") else line + b"\n"))
        log.flush()


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[2] != "--":
        print("usage: python -m rl360cli.supervise STATUS_JSON LOG -- COMMAND [ARGS...]", file=sys.stderr)
        return 2
    status_path, log_path, command = Path(argv[0]), Path(argv[1]), argv[3:]
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = open(log_path, "ab", buffering=0)

    open_files_up_to_hard_limit()
    try:
        child = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    except OSError as e:
        log.write(stamp() + f"rl360: cannot start {command[0]}: {e.strerror}\n".encode())
        write_status(status_path, {"pid": None, "exit_code": 127, "signal": None, "ended_at": time.time()})
        return 127
    copier = threading.Thread(target=copy_lines, args=(child.stdout, log), daemon=True)
    copier.start()

    # A signal for the supervisor is meant for the component; the component decides how to end.
    def forward(signum: int, _frame: object) -> None:
        try:
            os.kill(child.pid, signum)
        except ProcessLookupError:
            pass

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, forward)

    status = {"pid": child.pid, "start_time": procinfo.start_time(child.pid), "supervisor": os.getpid()}
    write_status(status_path, status)

    returncode = _wait_for(child.pid)
    status["ended_at"] = time.time()
    if returncode < 0:
        status.update(exit_code=128 - returncode, signal=signal.Signals(-returncode).name)
    else:
        status.update(exit_code=returncode, signal=None)
    write_status(status_path, status)
    _end_orphans()
    # Output still in the pipe is copied; a grandchild that holds the pipe open is not waited for.
    copier.join(timeout=2.0)
    return status["exit_code"]


def open_files_up_to_hard_limit() -> int:
    """Raise this process's (and so the component's) soft limit of open files to its hard limit; return it.

    Components are servers that hold a descriptor per connection (the router two per request in flight),
    and a login shell's soft limit is often 1,024 whatever the hard limit allows."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):  # an unlimited hard limit is above the kernel's nr_open: keep the soft one
            pass
    return hard


def _wait_for(pid: int) -> int:
    """Reap children until `pid` ends (orphans re-parented here are reaped on the way)."""
    while True:
        try:
            reaped, wait_status = os.wait()
        except InterruptedError:
            continue
        except ChildProcessError:
            return -signal.SIGKILL
        if reaped == pid:
            return -os.WTERMSIG(wait_status) if os.WIFSIGNALED(wait_status) else os.WEXITSTATUS(wait_status)


def _end_orphans() -> None:
    me = os.getpid()
    for sig, wait in ((signal.SIGTERM, ORPHAN_GRACE_S), (signal.SIGKILL, 1.0)):
        orphans = [p for p in procinfo.family(me) if p != me]
        # Another component's supervisor (an engine the trainer's health watcher started again) and what it
        # runs belong to that component: recorded in the state, ended by `rl360 down`, not with this one.
        spared = {q for p in orphans if p != me and _is_supervisor(p) for q in procinfo.family(p)}
        orphans = [p for p in orphans if p not in spared]
        if not orphans:
            return
        for pid in orphans:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                while os.waitpid(-1, os.WNOHANG)[0]:
                    pass
            except ChildProcessError:
                return
            time.sleep(0.05)


def _is_supervisor(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"rl360cli.supervise" in f.read()
    except OSError:
        return False


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
