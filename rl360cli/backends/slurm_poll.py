"""One batched look at Slurm per poll interval, shared by every rl360 process of a cluster.

A poll is one `squeue` (live jobs), one `sacct` (jobs and their steps, ended
ones too, with exit codes) and one `sinfo` (the state of the nodes we use),
run side by side.
The result is cached in `slurm-poll.json` beside the state file under a flock
(`slurm-poll.lock`): a caller that finds a fresh snapshot covering what it
asks about reads it; otherwise it polls while holding the lock, so ten
concurrent `rl360 status` calls cost one sacct per poll interval, not ten.
A failed poll is cached too, and the interval doubles after each failure up to
`max_poll_interval_s` (back-off), so a down slurmctld is not hammered.

Nothing here decides that a job ended: a snapshot says what each tool said,
including "I could not ask" and "not listed"; `slurm_observe` draws the
conclusions.

    python -m pytest tests/slurm/test_slurm_poll.py
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from rl360cli.backends import slurm_cmd
from rl360cli.backends.config import SlurmOptions
from rl360cli.errors import Rl360Error

CACHE_NAME = "slurm-poll.json"
LOCK_NAME = "slurm-poll.lock"


@dataclass(kw_only=True)
class Snapshot:
    """What squeue, sacct and sinfo said at `time` (wall clock) about `job_ids` and `node_names`."""

    time: float
    job_ids: list[str]
    node_names: list[str]
    # squeue: raw job id -> {state, nodes, reason, display_id}; None when squeue could not be asked.
    queue: dict[str, dict] | None
    # sacct: raw job id -> {...}, "JOB.STEP" -> {...}; None when sacct could not be asked.
    acct_jobs: dict[str, dict] | None
    acct_steps: dict[str, dict] | None
    # sinfo: node -> {state, reason, lost}; None when sinfo could not be asked.
    nodes: dict[str, dict] | None
    errors: dict[str, str] = field(default_factory=dict)
    # Consecutive polls with an error (drives the back-off), and counters for measurements.
    failures: int = 0
    num_polls: int = 0
    num_sacct_calls: int = 0

    def to_json(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    @classmethod
    def from_json(cls, data: dict) -> Snapshot:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})

    def covers(self, job_ids: Iterable[str], node_names: Iterable[str]) -> bool:
        return set(job_ids) <= set(self.job_ids) and set(node_names) <= set(self.node_names)

    def job(self, job_id: str) -> tuple[str | None, dict]:
        """(state, details) of a job from squeue first (live truth), else sacct; (None, {}) if neither lists it."""
        if self.queue and job_id in self.queue:
            return self.queue[job_id]["state"], self.queue[job_id]
        if self.acct_jobs and job_id in self.acct_jobs:
            return self.acct_jobs[job_id]["state"], self.acct_jobs[job_id]
        return None, {}

    def node_lost(self, node: str) -> bool:
        return bool(self.nodes and self.nodes.get(node, {}).get("lost"))


class Poller:
    """The shared, cached poll of one cluster state folder."""

    def __init__(self, home: Path, options: SlurmOptions, *, clock=time.time):
        self.cache_path = Path(home) / CACHE_NAME
        self.lock_path = Path(home) / LOCK_NAME
        self.options = options
        self.clock = clock

    def interval_s(self, failures: int) -> float:
        """The poll interval after `failures` failed polls in a row (doubling, capped)."""
        return min(self.options.poll_interval_s * (2 ** min(failures, 16)), self.options.max_poll_interval_s)

    def snapshot(self, job_ids: Iterable[str], node_names: Iterable[str] = (), *, newer_than: float = 0.0,
                 force: bool = False) -> Snapshot:
        """A snapshot covering `job_ids` and `node_names`, at most one poll interval old (and taken after
        `newer_than`); polls, under the lock, only when the cached one will not do."""
        job_ids = sorted({str(j) for j in job_ids if j})
        node_names = sorted(set(node_names))
        with self._locked():
            cached = self._read()
            if cached is not None and not force and self._fresh(cached, job_ids, node_names, newer_than):
                return cached
            previous = cached or Snapshot(time=0.0, job_ids=[], node_names=[], queue=None, acct_jobs=None,
                                          acct_steps=None, nodes=None)
            fresh = self._poll(job_ids, node_names, previous)
            self._write(fresh)
            return fresh

    def _fresh(self, snap: Snapshot, job_ids: list[str], node_names: list[str], newer_than: float) -> bool:
        age = self.clock() - snap.time
        return 0 <= age < self.interval_s(snap.failures) and snap.time > newer_than and snap.covers(job_ids, node_names)

    def _poll(self, job_ids: list[str], node_names: list[str], previous: Snapshot) -> Snapshot:
        """squeue, sacct and sinfo at once (threads: a silent controller costs one timeout, not three)."""
        opts = self.options
        calls = {}
        if job_ids:
            calls["squeue"] = lambda: self._squeue(job_ids)
            calls["sacct"] = lambda: slurm_cmd.parse_sacct(slurm_cmd.run(
                ["sacct", "-n", "-P", "-o", slurm_cmd.SACCT_FIELDS, "-j", ",".join(job_ids)],
                timeout_s=opts.command_timeout_s, slurm_conf=opts.slurm_conf))
        if node_names:
            calls["sinfo"] = lambda: slurm_cmd.parse_sinfo_nodes(slurm_cmd.run(
                ["sinfo", "-h", "-N", "-n", ",".join(node_names), "-o", "%N|%T|%E"],
                timeout_s=opts.command_timeout_s, slurm_conf=opts.slurm_conf))
        started = self.clock()
        results: dict[str, object] = {}
        errors: dict[str, str] = {}
        if calls:
            with ThreadPoolExecutor(max_workers=len(calls)) as pool:
                futures = {name: pool.submit(call) for name, call in calls.items()}
                for name, future in futures.items():
                    try:
                        results[name] = future.result()
                    except Rl360Error as e:
                        errors[name] = str(e)
        acct = results.get("sacct")
        return Snapshot(
            time=started, job_ids=job_ids, node_names=node_names,
            queue=results.get("squeue") if job_ids else {},  # type: ignore[arg-type]
            acct_jobs=acct[0] if acct else ({} if not job_ids else None),  # type: ignore[index]
            acct_steps=acct[1] if acct else ({} if not job_ids else None),  # type: ignore[index]
            nodes=results.get("sinfo") if node_names else {},  # type: ignore[arg-type]
            errors=errors,
            failures=previous.failures + 1 if errors else 0,
            num_polls=previous.num_polls + 1,
            num_sacct_calls=previous.num_sacct_calls + (1 if job_ids else 0),
        )

    def _squeue(self, job_ids: list[str]) -> dict[str, dict]:
        opts = self.options
        try:
            out = slurm_cmd.run(["squeue", "-h", "-a", "--states=all", "-j", ",".join(job_ids),
                                 "-o", "%A|%i|%T|%N|%r"], timeout_s=opts.command_timeout_s,
                                slurm_conf=opts.slurm_conf)
        except slurm_cmd.SlurmCommandFailed as e:
            # squeue refuses a list of job ids it has all forgotten; that is "none listed", not a failure.
            if "Invalid job id" in e.stderr:
                return {}
            raise
        return slurm_cmd.parse_squeue(out)

    # ------------------------------------------------------------------ cache file

    def _read(self) -> Snapshot | None:
        try:
            return Snapshot.from_json(json.loads(self.cache_path.read_text()))
        except (FileNotFoundError, json.JSONDecodeError, TypeError, KeyError):
            return None

    def _write(self, snap: Snapshot) -> None:
        self.cache_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.cache_path.with_name(f".{self.cache_path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(snap.to_json()))
        os.replace(tmp, self.cache_path)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.lock_path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            # A poller holds the lock for at most three commands' timeouts.
            deadline = time.monotonic() + 3 * self.options.command_timeout_s + 5
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise Rl360Error(f"{self.lock_path} has been held for too long by another rl360 poll",
                                         "check for a hung sacct/squeue process") from None
                    time.sleep(0.01)
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
