"""The local backend: every tier on this machine, every component a supervised subprocess.

Tiers are shares of this machine's CPUs and memory. Each component runs under
`rl360cli.supervise` in its own process group, with its output in a
log file of the run folder; the state records the component's pid and start
time (so a reused pid is never mistaken for ours) and the supervisor's status
file, which holds the exit code once the component ends.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from collections.abc import Mapping

from rl360cli import procinfo
from rl360cli.backends.base import Allocation, ComponentSpec, Observation, RayCluster
from rl360cli.backends.config import BackendProfile
from rl360cli.errors import Rl360Error
from rl360cli.state.schema import ComponentRecord, ComponentStatus, NodeRecord, StateDoc, TierRecord, TierStatus

if TYPE_CHECKING:
    from rl360cli.backends.slurm_placement import PlacedRecipe


NODE = "local"


def machine_resources() -> tuple[int, int]:
    """(CPUs this process may use, total memory in MB)."""
    cpus = len(os.sched_getaffinity(0))
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return cpus, int(line.split()[1]) // 1024
    return cpus, 0


class LocalBackend:
    name = "local"
    on_this_machine = True

    def __init__(self, profile: BackendProfile | None):
        self.profile = profile

    @property
    def python(self) -> str:
        """Components run on this machine, under the interpreter running rl360."""
        return sys.executable

    def check_engine(self, kind: str) -> None:
        if kind == "sglang":
            raise Rl360Error("SGLang engines need GPUs, which the local backend does not have",
                             "set [engine] kind = \"local\" in the recipe, or use a Slurm profile")

    def ray_cluster(self, doc: StateDoc, *, run: str | None, token_path: Path, port: int) -> RayCluster:
        """None to join: the trainer starts a private Ray instance on this machine."""
        return RayCluster()

    def docker_steps(self, doc: StateDoc, node_names: list[str]) -> dict[str, tuple[str, int | None] | None]:
        """None: this machine's daemons are reached through their sockets."""
        return {}

    # ------------------------------------------------------------------ tiers

    def placement_plan(self, recipe: PlacedRecipe) -> list[tuple[str, str]]:
        """No placement rows: every part runs on this machine, in the share of its tier."""
        return []

    def heal(self) -> list[str]:
        """Nothing to heal: the tiers are shares of this machine, which has no node to lose."""
        return []

    def provision_plan(self) -> list[Allocation]:
        tiers, _ = self.provision()
        return [Allocation(tiers=name, detail=f"{t['resources']['cpus']:g} CPUs, {t['resources']['memory_mb']} MB "
                                              "on this machine")
                for name, t in tiers.items()]

    def python_note(self) -> str | None:
        """Nothing to say: every component runs this machine's own interpreter."""
        return None

    def tiers_alive(self, tiers: Mapping[str, TierRecord]) -> dict[str, bool]:
        # This machine is the allocation: a recorded local tier is there as long as it is recorded.
        return {name: t["backend"] == "local" and t["status"] == TierStatus.READY for name, t in tiers.items()}

    def release(self, tiers: Mapping[str, TierRecord]) -> None:
        """Nothing to give back: the tiers are shares of this machine."""

    def provision(self) -> tuple[dict[str, TierRecord], dict[str, NodeRecord]]:
        """The tiers and the one node as the state records them."""
        cpus, memory_mb = machine_resources()
        tiers: dict[str, TierRecord] = {}
        reserved_cpus, reserved_mb = 0.0, 0
        for name, spec in self.profile.tiers.items():
            tier_cpus = round(cpus * spec.share, 2)
            tier_mb = int(memory_mb * spec.share)
            reserved_cpus += tier_cpus
            reserved_mb += tier_mb
            tiers[name] = {
                "kind": name,
                "backend": "local",
                "status": TierStatus.READY,
                "nodes": [NODE],
                "resources": {"cpus": float(len(spec.cpu_list)) if spec.cpu_list else tier_cpus,
                              "memory_mb": tier_mb, "gpus": 0, "cpu_list": list(spec.cpu_list)},
            }
        node: NodeRecord = {
            "address": "127.0.0.1",
            "tier": "all",
            "cpus": cpus,
            "memory_mb": memory_mb,
            "reserved_cpus": round(reserved_cpus, 2),
            "reserved_memory_mb": reserved_mb,
            "images": {},
        }
        return tiers, {NODE: node}

    # ------------------------------------------------------------------ components

    def command_line(self, spec: ComponentSpec, log_path: str) -> list[str]:
        status_path = str(Path(log_path).with_suffix(".status.json"))
        return [sys.executable, "-m", "rl360cli.supervise", status_path, log_path, "--", *spec.argv]

    def launch(self, spec: ComponentSpec, log_path: str) -> dict:
        log = Path(log_path)
        log.parent.mkdir(parents=True, exist_ok=True)
        status_path = log.with_suffix(".status.json")
        status_path.unlink(missing_ok=True)
        env = {**os.environ, **spec.env, "PYTHONUNBUFFERED": "1"}
        cpus = self._cpus_of(spec.tier)
        with open(log.with_suffix(".supervisor.log"), "ab") as out:
            supervisor = subprocess.Popen(
                self.command_line(spec, log_path),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                # The tier's CPUs, inherited by everything the component starts.
                preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None,
            )
        status = _wait_for_status(status_path, supervisor)
        return {
            "backend": "local",
            "node": NODE,
            "pid": status.get("pid"),
            "start_time": status.get("start_time"),
            "supervisor_pid": supervisor.pid,
            "supervisor_start_time": procinfo.start_time(supervisor.pid),
            "pgid": supervisor.pid,
            "status_path": str(status_path),
            "log_path": str(log),
            "command": list(spec.argv),
        }

    def _cpus_of(self, tier: str) -> set[int]:
        spec = self.profile.tiers.get(tier) if self.profile else None
        if not spec or not spec.cpu_list:
            return set()
        available = os.sched_getaffinity(0)
        cpus = set(spec.cpu_list) & available
        if not cpus:
            raise Rl360Error(f"tier {tier}'s cpu_list {list(spec.cpu_list)} names no CPU of this machine "
                             f"(it has {sorted(available)})", "fix cpu_list in the profile")
        return cpus

    def observe(self, records: Mapping[str, ComponentRecord]) -> dict[str, Observation]:
        return {cid: self._observe_one(rec) for cid, rec in records.items()}

    def _observe_one(self, rec: ComponentRecord) -> Observation:
        if rec["status"] == ComponentStatus.STOPPED:
            return Observation(ComponentStatus.STOPPED, rec["exit_code"])
        if procinfo.is_alive(rec["pid"], rec["start_time"]):
            return Observation(ComponentStatus.RUNNING)
        ended = _read_status(rec["status_path"])
        code = ended.get("exit_code")
        if code is None:
            if procinfo.is_alive(rec.get("supervisor_pid"), rec.get("supervisor_start_time")):
                # The supervisor is still writing the exit code: the component just ended.
                return Observation(ComponentStatus.UNKNOWN, None, "ending")
            return Observation(ComponentStatus.FAILED, None, "the process vanished without an exit code")
        if code == 0:
            return Observation(ComponentStatus.EXITED, 0)
        how = f"killed by {ended['signal']}" if ended.get("signal") else f"exit code {code}"
        return Observation(ComponentStatus.FAILED, code, how)

    def stop(self, records: Mapping[str, ComponentRecord], *, grace_s: float = 10.0) -> None:
        """TERM every process of every component, KILL what is left after `grace_s`."""
        targets = self._family_of(records)
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
            for pid in targets:
                _signal(pid, sig)
            deadline = time.monotonic() + wait
            while targets and time.monotonic() < deadline:
                time.sleep(0.05)
                targets = [p for p in targets if procinfo.is_alive(p)]
            if not targets:
                return
        raise Rl360Error(f"processes {targets} did not end after SIGKILL", "check them with `ps` (uninterruptible I/O?)")

    def _family_of(self, records: Mapping[str, ComponentRecord]) -> list[int]:
        pids: set[int] = set()
        for rec in records.values():
            supervisor_ours = procinfo.is_alive(rec.get("supervisor_pid"), rec.get("supervisor_start_time"))
            child_ours = procinfo.is_alive(rec["pid"], rec["start_time"])
            if supervisor_ours:
                pids.update(procinfo.family(rec["supervisor_pid"], rec.get("pgid")))
            elif child_ours:
                pids.update(procinfo.family(rec["pid"], rec.get("pgid")))
            elif rec.get("pgid"):
                # Both gone: only what is still in the component's own process group is left.
                pids.update(p.pid for p in procinfo.all_processes() if p.pgid == rec["pgid"] and p.state != "Z")
        pids.discard(os.getpid())
        return sorted(pids)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _read_status(path: str | None) -> dict:
    if not path:
        return {}
    try:
        return json.loads(Path(path).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def _wait_for_status(path: Path, supervisor: subprocess.Popen, timeout_s: float = 10.0) -> dict:
    """The supervisor's first status line (the component's pid), once it is written."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = _read_status(str(path))
        if status:
            return status
        if supervisor.poll() is not None:
            break
        time.sleep(0.01)
    status = _read_status(str(path))
    if not status:
        raise Rl360Error(f"the supervisor of {path.name} did not start", f"see {path.with_name(path.name.replace('.status.json', '.supervisor.log'))}")
    return status
