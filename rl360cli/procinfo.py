"""What /proc says about a process: alive or not, its start time, its group and descendants.

`kill -0` is not enough: a process that ended can stay a zombie for seconds,
and a pid can be reused. A process is ours only while /proc/PID/stat shows it
not dead and with the start time we recorded.

A floor module: the backends, the process sandboxes, the janitor and the supervisor (supervise.py)
all read /proc through it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ProcStat:
    pid: int
    state: str
    ppid: int
    pgid: int
    start_time: int  # clock ticks since boot (field 22 of /proc/PID/stat)
    cpu_ticks: int  # user + system clock ticks it has run (fields 14 and 15)


def stat(pid: int) -> ProcStat | None:
    """The process's stat line, or None if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    rest = raw[raw.rindex(")") + 2 :].split()
    return ProcStat(pid=pid, state=rest[0], ppid=int(rest[1]), pgid=int(rest[2]), start_time=int(rest[19]),
                    cpu_ticks=int(rest[11]) + int(rest[12]))


def start_time(pid: int) -> int | None:
    s = stat(pid)
    return s.start_time if s else None


def is_alive(pid: int | None, started: int | None = None) -> bool:
    """True if `pid` runs (not a zombie) and, when given, started at `started`."""
    if not pid:
        return False
    s = stat(pid)
    if s is None or s.state in ("Z", "X", "x"):
        return False
    return started is None or s.start_time == started


def all_processes() -> list[ProcStat]:
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            s = stat(int(name))
            if s is not None:
                out.append(s)
    return out


def family(root_pid: int, pgid: int | None = None) -> list[int]:
    """Live pids that descend from `root_pid` (itself included) or belong to process group `pgid`."""
    procs = [p for p in all_processes() if p.state not in ("Z", "X", "x")]
    children: dict[int, list[int]] = {}
    for p in procs:
        children.setdefault(p.ppid, []).append(p.pid)
    alive = {p.pid for p in procs}
    found = set()
    stack = [root_pid] if root_pid in alive else []
    while stack:
        pid = stack.pop()
        if pid in found:
            continue
        found.add(pid)
        stack.extend(children.get(pid, ()))
    if pgid:
        found.update(p.pid for p in procs if p.pgid == pgid)
    return sorted(found)


def peak_rss_mb(pid: int | str = "self") -> float | None:
    """The process's peak resident memory so far (VmHWM) in MiB; None where /proc does not say."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        return None
    return None
