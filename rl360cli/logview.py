"""`rl360 logs`: the components' logs merged in time order, optionally followed to the run's end.

Every component's log line carries a UTC timestamp (the supervisor writes it),
so lines from many components and nodes merge by time. Following picks up
components that start later (new log files in the run's folder), and when the
run ends or is brought down it drains what is left, prints a footer with the
final status and returns the exit code that maps it.
"""

from __future__ import annotations

import heapq
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

from rl360cli.errors import Rl360Error
from rl360cli.state.schema import RUN_FINAL, RunStatus

STAMP = re.compile(rb"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+Z) ")
DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
# The exit code of a command that followed a run to its end, by the run's final status (every one of RUN_FINAL):
# a stopped run (`rl360 down`) did not fail, but did not finish either (cli.py lists the codes).
FINAL_RUN: dict[RunStatus, int] = {RunStatus.FINISHED: 0, RunStatus.STOPPED: 4, RunStatus.FAILED: 3}


@dataclass(frozen=True, slots=True)
class LogLine:
    time: str  # ISO 8601 UTC; sorts as text
    source: str  # tier/component
    text: str


@dataclass(kw_only=True, slots=True)
class LogFilter:
    components: tuple[str, ...] = ()
    tier: str | None = None
    since: str | None = None  # ISO time; lines before it are skipped

    def wants(self, source: str) -> bool:
        tier, _, name = source.partition("/")
        if self.tier and tier != self.tier:
            return False
        return not self.components or name in self.components or source in self.components


def parse_since(text: str | None) -> str | None:
    """`90s`, `5m`, `2h`, `1d` ago, as an ISO timestamp."""
    if not text:
        return None
    m = DURATION.match(text.strip())
    if not m:
        raise Rl360Error(f"--since {text!r} is not a duration", "use a number with s, m, h or d, such as 10m")
    seconds = float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
    return (datetime.now(timezone.utc) - timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def source_of(path: Path) -> str:
    """`service.router.log` -> `service/router`."""
    tier, _, name = path.name.removesuffix(".log").partition(".")
    return f"{tier}/{name}" if name else tier


def log_files(folders: Iterable[Path]) -> list[Path]:
    files = []
    for folder in folders:
        if folder.is_dir():
            files += [p for p in folder.glob("*.log") if not p.name.endswith(".supervisor.log")]
    return sorted(files)


@dataclass
class Tail:
    """New complete lines of one log file since the last read."""

    path: Path
    offset: int = 0
    partial: bytes = b""
    last_time: str = ""

    def read(self, *, final: bool = False) -> list[LogLine]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        self.offset += len(data)
        data = self.partial + data
        lines = data.split(b"\n")
        self.partial = b"" if final else lines.pop()
        out = []
        source = source_of(self.path)
        for raw in lines:
            if not raw and final:
                continue
            m = STAMP.match(raw)
            if m:
                self.last_time = m.group(1).decode()
                text = raw[m.end() :]
            else:
                text = raw  # a line written without the supervisor: it sorts with the line before it
            out.append(LogLine(self.last_time, source, text.decode(errors="replace")))
        return out


@dataclass(kw_only=True)
class Follower:
    """Merges the logs found in `folders`, printing with `emit`."""

    folders: Callable[[], list[Path]]
    emit: Callable[[LogLine], None]
    where: LogFilter = field(default_factory=LogFilter)
    tails: dict[Path, Tail] = field(default_factory=dict)

    def poll(self, *, final: bool = False) -> int:
        for path in log_files(self.folders()):
            if path not in self.tails and self.where.wants(source_of(path)):
                self.tails[path] = Tail(path)
        batches = [t.read(final=final) for t in self.tails.values()]
        count = 0
        for line in heapq.merge(*batches, key=lambda line: line.time):
            if self.where.since and line.time < self.where.since:
                continue
            self.emit(line)
            count += 1
        return count

    def backlog(self, lines: int | None) -> list[LogLine]:
        """Everything logged so far (the last `lines` of it), merged; follows on from there."""
        for path in log_files(self.folders()):
            if self.where.wants(source_of(path)):
                self.tails.setdefault(path, Tail(path))
        merged = [
            line
            for line in heapq.merge(*(t.read() for t in self.tails.values()), key=lambda line: line.time)
            if not self.where.since or line.time >= self.where.since
        ]
        return merged[-lines:] if lines is not None else merged


def follow(follower: Follower, run_status: Callable[[], str | None], *, interval_s: float = 0.2,
           check_every_s: float = 1.0) -> str:
    """Print new lines until `run_status()` returns a final status; returns that status."""
    next_check = 0.0
    while True:
        follower.poll()
        now = time.monotonic()
        if now >= next_check:
            status = run_status()
            if status in RUN_FINAL:
                follower.poll(final=True)  # drain what the last writers left
                return status
            next_check = now + check_every_s
        time.sleep(interval_s)
