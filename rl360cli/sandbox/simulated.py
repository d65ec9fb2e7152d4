"""A stand-in for a cluster of sandbox nodes: the provider interface with no processes, only asyncio timers.

`[sandbox] provider = "simulated"` (settings in `[sandbox.simulated]`, rl360cli/sandbox/config.py)
stands in for what cannot run on a small machine: two dozen rollout nodes with thousands of
sandboxes. It keeps what the orchestrator sees of a real fleet:

- nodes with a CPU and memory capacity (`nodes()`), which the admission controller
  (rl360cli/sandbox/waves.py) reserves from as it does for Docker nodes; the provider checks
  the reservations itself too and keeps each node's peak (`ledger`);
- an image cache per node: a cold start pulls the task's image (`image_size_mb`) through one
  registry link of `registry_bandwidth_mb_s`, shared evenly by the pulls in flight, at most
  `max_concurrent_pulls` at once; starts of one image on one node share its pull; a warm start
  does not pull;
- latencies: `start_latency_s` to start, `stop_latency_s` to stop, `verifier_latency_s` for the
  verifier's run, and each agent command's drawn from a lognormal distribution with median
  `exec_median_s` and p99 `exec_p99_ratio` times that (a command drawn longer than its timeout
  times out, as a real one would);
- failures by cause at set rates, each a `SandboxError` of the taxonomy's own row, so the loop
  masks and counts them as real ones: `start_failure_rate` (START_FAILED: sandbox_start),
  `start_timeout_rate` (START_TIMEOUT after `start_timeout_s`: timeout_infra), `pull_failure_rate`
  (IMAGE_PULL_FAILED: image_pull), `oom_rate` (the verifier is OOM-killed and writes no reward:
  VERIFIER_OOM, oom_killed) and `node_lost_rate` (a command's node stops answering:
  NODE_UNREACHABLE, node_lost). Whether each fires is drawn from (seed, attempt, operation).

What it does not do: it runs no command. Every agent command "succeeds" at once with exit code 0
and no output (a canned result, whatever the command says); the verifier (tests/test.sh) writes
`/logs/verifier/reward.txt` holding 1 with probability `pass_rate`, else 0, drawn per attempt —
so rewards say nothing about what the policy did. Files exist only as the in-memory copies of
what the verifier wrote; uploads are recorded, not copied. A lost node takes only the sandbox
whose command drew the loss, not the node's other sandboxes. Sandboxes live as long as the
provider object: nothing outlives the process, so fleets (`detach`) and the janitor find nothing.

Several session actors each build their own provider: `share=(index, count)` gives each a
disjoint slice of the nodes (node i goes to share i % count) and of the pull cap (cap // count),
so that together they never over-commit a node or the registry. With more shares than nodes,
every share sees every node with 1/count of its capacity.

    provider = SimulatedProvider(SandboxConfig(provider="simulated"), run_id="r1", share=(0, 2))

Test: tests/sandbox/test_simulated_provider.py.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import json
import math
import os
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rl360cli.sandbox.attempt import REWARD_TXT, VERIFY_COMMAND
from rl360cli.sandbox.config import SandboxConfig
from rl360cli.sandbox.provider import ExecResult, NodeCapacity, Sandbox, SandboxProvider
from rl360cli.sandbox.task import Task
from rl360cli.sandbox.taxonomy import RULES, Event, SandboxError

# The z-score of the 99th percentile of a standard normal: a lognormal's p99 / median = exp(sigma * Z99).
Z99 = 2.3263478740408408


def draw(seed: int, attempt_id: str, operation: str) -> float:
    """A uniform number in [0, 1) from (seed, attempt, operation): the same run draws the same failures."""
    digest = hashlib.blake2b(f"{seed}:{attempt_id}:{operation}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def lognormal_sigma(p99_ratio: float) -> float:
    """The sigma of a lognormal whose p99 is `p99_ratio` times its median."""
    return math.log(p99_ratio) / Z99


class SharedLink:
    """A link of `rate` MB/s shared evenly by the transfers in flight (processor sharing, on asyncio timers)."""

    def __init__(self, rate_mb_s: float):
        self.rate = rate_mb_s
        self.remaining: dict[object, float] = {}
        self._last = time.monotonic()
        self._changed = asyncio.Event()

    def _advance(self) -> None:
        now = time.monotonic()
        if self.remaining:
            done = self.rate / len(self.remaining) * (now - self._last)
            for key in self.remaining:
                self.remaining[key] -= done
        self._last = now

    def _notify(self) -> None:
        # Every transfer's finishing time moves when one joins or leaves.
        self._changed.set()
        self._changed = asyncio.Event()

    async def transfer(self, size_mb: float) -> None:
        key = object()
        self._advance()
        self.remaining[key] = size_mb
        self._notify()
        try:
            while True:
                self._advance()
                left = self.remaining[key]
                eta = left / (self.rate / len(self.remaining))
                if eta <= 1e-4:
                    return
                changed = self._changed
                try:
                    await asyncio.wait_for(changed.wait(), eta)
                except TimeoutError:
                    pass
        finally:
            self._advance()
            del self.remaining[key]
            self._notify()


@dataclass
class SimulatedNode:
    """One simulated node: its capacity (this provider's share of it), image cache, pulls and reservations."""

    capacity: NodeCapacity
    images: set[str] = field(default_factory=set)
    pulls: dict[str, asyncio.Future] = field(default_factory=dict)
    reserved_cpus: float = 0.0
    reserved_mb: int = 0
    live: int = 0
    peak_cpus: float = 0.0
    peak_mb: int = 0
    # Sandboxes placed beyond the capacity (the admission controller should make this impossible).
    overcommits: int = 0


@dataclass
class Ledger:
    """What the provider did, for tests and benchmarks: written as JSON by `close` when `ledger_dir` is set."""

    starts: int = 0
    warm_starts: int = 0
    cold_starts: int = 0
    pulls: int = 0
    pulls_in_flight: int = 0
    max_pulls_in_flight: int = 0
    pull_cap: int = 0
    execs: int = 0
    # Of the commands: the verifier's runs of tests/test.sh (the others are the agents' turns).
    verifier_execs: int = 0
    live: int = 0
    max_live: int = 0
    # Failures the provider drew, by taxonomy cause, and (attempt, operation, cause) of each.
    failures_by_cause: collections.Counter = field(default_factory=collections.Counter)
    failures: list[tuple[str, str, str]] = field(default_factory=list)
    # At the first command of each wall-clock second: (that second, sandboxes live, agent commands so
    # far). Summed over the actors' ledgers, the rate of turns while a given number were in flight.
    timeline: list[tuple[int, int, int]] = field(default_factory=list)

    def command(self, *, verifier: bool) -> None:
        self.execs += 1
        self.verifier_execs += verifier
        second = int(time.time())
        if not self.timeline or self.timeline[-1][0] != second:
            self.timeline.append((second, self.live, self.execs - self.verifier_execs))

    def failed(self, attempt_id: str, operation: str, event: Event) -> None:
        cause = RULES[event].cause
        assert cause is not None
        self.failures_by_cause[cause.value] += 1
        self.failures.append((attempt_id, operation, cause.value))


class SimulatedProvider(SandboxProvider):
    """See the module docstring: a stand-in cluster that runs nothing."""

    name = "simulated"

    def __init__(self, config: SandboxConfig, *, run_id: str = "", share: tuple[int, int] = (0, 1),
                 seed: int | None = None):
        index, count = share
        if not 0 <= index < count:
            raise ValueError(f"share must be (index, count) with 0 <= index < count (got {share})")
        self.config = config
        self.sim = config.simulated
        self.run_id = run_id
        self.share = share
        self.seed = self.sim.seed if seed is None else seed
        sim = self.sim
        if count <= sim.num_nodes:
            owned = [i for i in range(sim.num_nodes) if i % count == index]
            fraction = 1.0
        else:
            owned, fraction = list(range(sim.num_nodes)), 1.0 / count
        self.nodes_state: dict[str, SimulatedNode] = {}
        for i in owned:
            name = f"sim-{i:02d}"
            capacity = NodeCapacity(name=name, cpus=sim.node_cpus * fraction,
                                    memory_mb=max(1, int(sim.node_memory_mb * fraction)))
            self.nodes_state[name] = SimulatedNode(capacity=capacity)
        self.ledger = Ledger(pull_cap=max(1, sim.max_concurrent_pulls // count))
        self._pull_slots: asyncio.Semaphore | None = None
        self._link: SharedLink | None = None
        self._rng = random.Random(self.seed * 7919 + index)
        self._sigma = lognormal_sigma(sim.exec_p99_ratio)
        self._start_counts: collections.Counter[str] = collections.Counter()
        self._sandboxes = 0
        self._closed = False

    # ------------------------------------------------------------------ the SandboxProvider interface

    def nodes(self) -> list[NodeCapacity]:
        return [state.capacity for state in self.nodes_state.values()]

    def pull_load(self) -> tuple[int, int] | None:
        return self.ledger.pulls_in_flight, self.ledger.pull_cap

    async def start(self, task: Task, *, attempt_id: str, labels: Mapping[str, str],
                    node: str | None = None) -> Sandbox:
        self._start_counts[attempt_id] += 1
        operation = f"start{self._start_counts[attempt_id]}"
        name = node or min(self.nodes_state.values(), key=lambda s: (s.live, s.capacity.name)).capacity.name
        state = self.nodes_state.get(name)
        if state is None:
            raise SandboxError(Event.PROVIDER_FAILED, f"no simulated node {name!r} in this share", node=name)
        cpus, memory_mb = self.footprint(task)  # sidecars included, as on a real node
        self._reserve(state, cpus, memory_mb)
        self.ledger.starts += 1
        try:
            ref = self.image_ref(task)
            if self.sim.prewarmed:
                state.images.add(ref)
            if ref in state.images:
                self.ledger.warm_starts += 1
            else:
                self.ledger.cold_starts += 1
                await self._pull(state, ref, attempt_id, operation)
            roll = draw(self.seed, attempt_id, operation)
            if roll < self.sim.start_timeout_rate:
                await asyncio.sleep(self.config.start_timeout_s)
                self.ledger.failed(attempt_id, operation, Event.START_TIMEOUT)
                raise SandboxError(Event.START_TIMEOUT, f"simulated: the sandbox did not start in "
                                   f"{self.config.start_timeout_s:g}s", node=name, injected=True)
            await asyncio.sleep(self.sim.start_latency_s)
            if roll < self.sim.start_timeout_rate + self.sim.start_failure_rate:
                self.ledger.failed(attempt_id, operation, Event.START_FAILED)
                raise SandboxError(Event.START_FAILED, "simulated: the sandbox did not start", node=name,
                                   injected=True)
        except BaseException:
            self._release(state, cpus, memory_mb)
            raise
        self._sandboxes += 1
        return SimulatedSandbox(self, state, task, attempt_id=attempt_id, cpus=cpus, memory_mb=memory_mb,
                                sandbox_id=f"sim-{self.share[0]}-{self._sandboxes}")

    async def close(self) -> None:
        """Write the ledger (when `ledger_dir` is set); live sandboxes are not touched."""
        if self._closed or not self.sim.ledger_dir:
            self._closed = True
            return
        self._closed = True
        folder = Path(self.sim.ledger_dir)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"ledger-{self.run_id or 'none'}-{os.getpid()}-{self.share[0]}-{id(self):x}.json"
        path.write_text(json.dumps(self.ledger_dict()))

    def ledger_dict(self) -> dict[str, Any]:
        ledger = self.ledger
        return {
            "share": list(self.share), "starts": ledger.starts, "warm_starts": ledger.warm_starts,
            "cold_starts": ledger.cold_starts, "pulls": ledger.pulls, "pull_cap": ledger.pull_cap,
            "max_pulls_in_flight": ledger.max_pulls_in_flight, "execs": ledger.execs,
            "verifier_execs": ledger.verifier_execs, "max_live": ledger.max_live, "timeline": ledger.timeline,
            "failures_by_cause": dict(ledger.failures_by_cause), "failures": [list(f) for f in ledger.failures],
            "nodes": {name: {"cpus": s.capacity.cpus, "memory_mb": s.capacity.memory_mb, "peak_cpus": s.peak_cpus,
                             "peak_mb": s.peak_mb, "overcommits": s.overcommits}
                      for name, s in self.nodes_state.items()},
        }

    # ------------------------------------------------------------------ nodes and images

    def _reserve(self, state: SimulatedNode, cpus: float, memory_mb: int) -> None:
        state.reserved_cpus += cpus
        state.reserved_mb += memory_mb
        state.live += 1
        if (state.reserved_cpus > state.capacity.cpus + 1e-9
                or state.reserved_mb > state.capacity.memory_mb):
            state.overcommits += 1
        state.peak_cpus = max(state.peak_cpus, state.reserved_cpus)
        state.peak_mb = max(state.peak_mb, state.reserved_mb)
        self.ledger.live += 1
        self.ledger.max_live = max(self.ledger.max_live, self.ledger.live)

    def _release(self, state: SimulatedNode, cpus: float, memory_mb: int) -> None:
        state.reserved_cpus = max(0.0, state.reserved_cpus - cpus)
        state.reserved_mb = max(0, state.reserved_mb - memory_mb)
        state.live -= 1
        self.ledger.live -= 1

    async def _pull(self, state: SimulatedNode, ref: str, attempt_id: str, operation: str) -> None:
        """Wait for `ref` to be on the node; starts that find its pull already in flight share it."""
        pending = state.pulls.get(ref)
        if pending is None:
            pending = asyncio.ensure_future(self._transfer(state, ref, attempt_id, operation))
            state.pulls[ref] = pending
            pending.add_done_callback(lambda _: state.pulls.pop(ref, None))
        try:
            await asyncio.shield(pending)
        except SandboxError as e:
            self.ledger.failed(attempt_id, operation, e.event)
            raise SandboxError(e.event, e.detail, node=e.node, injected=True) from None

    async def _transfer(self, state: SimulatedNode, ref: str, attempt_id: str, operation: str) -> None:
        if self._pull_slots is None:
            # Made on first use, inside the event loop that runs the sandboxes.
            self._pull_slots = asyncio.Semaphore(self.ledger.pull_cap)
            self._link = SharedLink(self.sim.registry_bandwidth_mb_s)
        assert self._link is not None
        async with self._pull_slots:
            self.ledger.pulls += 1
            self.ledger.pulls_in_flight += 1
            self.ledger.max_pulls_in_flight = max(self.ledger.max_pulls_in_flight, self.ledger.pulls_in_flight)
            try:
                await self._link.transfer(self.sim.image_size_mb)
            finally:
                self.ledger.pulls_in_flight -= 1
        if draw(self.seed, attempt_id, operation + "-pull") < self.sim.pull_failure_rate:
            raise SandboxError(Event.IMAGE_PULL_FAILED, f"simulated: pulling {ref} onto {state.capacity.name} failed",
                               node=state.capacity.name)
        state.images.add(ref)

    def exec_latency(self) -> float:
        """One command's latency: lognormal with the recipe's median and p99 ratio."""
        return self.sim.exec_median_s * math.exp(self._sigma * self._rng.gauss(0.0, 1.0))


class SimulatedSandbox(Sandbox):
    """A sandbox of the simulated provider: timers and an in-memory file table, no process (see the module)."""

    def __init__(self, owner: SimulatedProvider, state: SimulatedNode, task: Task, *, attempt_id: str, cpus: float,
                 memory_mb: int, sandbox_id: str):
        self.owner = owner
        self.state = state
        self.id = sandbox_id
        self.node = state.capacity.name
        self.provider = owner.name
        self.task = task
        self.attempt_id = attempt_id
        self.cpus, self.memory_mb = cpus, memory_mb
        self.files: dict[str, bytes] = {}
        self.uploads: list[str] = []
        self._execs = 0
        self._lost = False
        self._stopped = False

    def _check_alive(self) -> None:
        if self._stopped:
            raise SandboxError(Event.SANDBOX_KILLED, f"simulated sandbox {self.id} was stopped", node=self.node)
        if self._lost:
            raise SandboxError(Event.NODE_UNREACHABLE, f"simulated: node {self.node} stopped answering",
                               node=self.node, injected=True)

    async def exec(self, command: str, *, timeout_s: float, env: Mapping[str, str] | None = None,
                   user: str | None = None) -> ExecResult:
        self._check_alive()
        owner, sim = self.owner, self.owner.sim
        self._execs += 1
        operation = f"exec{self._execs}"
        verifier = command == VERIFY_COMMAND
        owner.ledger.command(verifier=verifier)
        latency = sim.verifier_latency_s if verifier else owner.exec_latency()
        if draw(owner.seed, self.attempt_id, operation + "-node") < sim.node_lost_rate:
            await asyncio.sleep(min(latency, timeout_s) / 2)
            self._lost = True
            owner.ledger.failed(self.attempt_id, operation, Event.NODE_UNREACHABLE)
            self._check_alive()
        if latency > timeout_s:
            await asyncio.sleep(timeout_s)
            return ExecResult(exit_code=None, output="", timed_out=True, duration_s=timeout_s)
        await asyncio.sleep(latency)
        if verifier:
            if draw(owner.seed, self.attempt_id, "verifier-oom") < sim.oom_rate:
                owner.ledger.failed(self.attempt_id, operation, Event.VERIFIER_OOM)
                return ExecResult(exit_code=137, output="Killed", oom_killed=True, limit="memory", duration_s=latency)
            passed = draw(owner.seed, self.attempt_id, "reward") < sim.pass_rate
            self.files[REWARD_TXT] = b"1\n" if passed else b"0\n"
        # The canned result: whatever the command, it "succeeded" and printed nothing.
        return ExecResult(exit_code=0, output="", duration_s=latency)

    async def upload(self, local_path: Path | str, remote_path: str) -> None:
        self._check_alive()
        self.uploads.append(remote_path)

    async def download(self, remote_path: str, local_path: Path | str) -> None:
        self._check_alive()
        if remote_path not in self.files:
            raise SandboxError(Event.PROVIDER_FAILED, f"no such file in the simulated sandbox: {remote_path}",
                               node=self.node)
        Path(local_path).write_bytes(self.files[remote_path])

    async def read_file(self, remote_path: str, *, max_bytes: int = 1 << 20) -> bytes | None:
        self._check_alive()
        data = self.files.get(remote_path)
        return None if data is None else data[:max_bytes]

    async def reset_dir(self, remote_path: str) -> None:
        self._check_alive()
        prefix = remote_path.rstrip("/") + "/"
        for path in [p for p in self.files if p.startswith(prefix)]:
            del self.files[path]

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        try:
            await asyncio.sleep(self.owner.sim.stop_latency_s)
        finally:
            self.owner._release(self.state, self.cpus, self.memory_mb)

    def info(self) -> dict[str, Any]:
        return {**super().info(), "simulated": True}
