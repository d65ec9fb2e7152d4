"""The Slurm backend: each tier an allocation submitted through submitit, each component a job step in it.

    rl360 provision --profile cluster/dev-slurm.toml     # one job per tier (or one het job), nodes recorded
    rl360 serve / rl360 train                           # components as `srun --overlap` steps on a tier's nodes
    rl360 status                                        # one batched squeue + sacct (+ sinfo) per poll interval
    rl360 down                                          # scancel the steps and the jobs, confirmed through sacct

The parts, one module each: `slurm_script` (the sbatch scripts), `slurm_submit`
(submitit), `slurm_preflight` (checks against `sinfo`, sbatch's refusals),
`slurm_poll` (the shared, cached poll), `slurm_observe` (what a component is
doing), `slurm_launch` (the srun line), `slurm_requeue` (node loss: a bounded
requeue of the tier and a restart of its components), `slurm_ray` (a Ray
cluster as job steps), `slurm_placement` (where engines, trainer ranks and
sandbox slots go). This module ties them to the Backend protocol the stages
call.

    python -m pytest tests/slurm -m "not slow"    # needs `bash cluster/dev/slurm.sh up`
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from rl360cli import procinfo
from rl360cli.backends import slurm_cmd, slurm_ray, slurm_script
from rl360cli.backends.base import Allocation, ComponentSpec, Observation, RayCluster
from rl360cli.backends.config import BackendProfile, SlurmOptions
from rl360cli.backends.slurm_cmd import ACTIVE, ENDED
from rl360cli.backends.slurm_launch import StepFiles, srun_argv
from rl360cli.backends.slurm_observe import observe_component, read_json
from rl360cli.backends.slurm_placement import PlacedRecipe, placement
from rl360cli.backends.slurm_poll import Poller, Snapshot
from rl360cli.backends.slurm_preflight import check_profile, cluster_info
from rl360cli.backends.slurm_requeue import TierRecovery
from rl360cli.backends.slurm_step import rank_path
from rl360cli.errors import Rl360Error
from rl360cli.state import queries
from rl360cli.state.schema import (COMPONENT_FINAL, TIER_FINAL, ComponentRecord, ComponentStatus, NodeRecord, StateDoc,
                                   TierRecord, TierStatus, now_iso)

if TYPE_CHECKING:
    from rl360cli.state.store import StateFile


class SlurmBackend:
    name = "slurm"
    on_this_machine = False

    def __init__(self, profile: BackendProfile, state: StateFile):
        self.profile = profile
        self.state = state
        self.options = profile.slurm or SlurmOptions()
        self.poller = Poller(state.home, self.options)
        self.recovery = TierRecovery(self)

    @property
    def python(self) -> str:
        """The profile's `[slurm] python` (else this machine's, as in the sbatch script): the holder, each
        step's supervisor and every component start with the same interpreter on the nodes."""
        return slurm_script.component_python(self.profile)

    def check_engine(self, kind: str) -> None:
        """Any engine: a GPU engine on nodes without GPUs fails as it starts, with its own error."""

    def ray_cluster(self, doc: StateDoc, *, run: str | None, token_path: Path, port: int) -> RayCluster:
        """The session actors live on the rollout tier: a Ray cluster across the allocations (head on the
        service tier) that the trainer joins as the driver."""
        specs = slurm_ray.ray_cluster_specs(doc=doc, run=run, token_path=token_path, port=port, python=self.python,
                                            worker_port_range=slurm_ray.worker_ports(self.profile.base_port,
                                                                                     self.profile.sync_port))
        return RayCluster(components=tuple(specs), address=slurm_ray.ray_address(doc, port=port),
                          env=slurm_ray.ray_env(token_path))

    def docker_steps(self, doc: StateDoc, node_names: list[str]) -> dict[str, tuple[str, int | None] | None]:
        """A node's unix:// socket is on the node: reach it by a step of the job holding it (in a heterogeneous
        job: the het leader and the tier's het group)."""
        return {name: next(((str(t.get("het_leader") or t["job_id"]), t.get("het_group"))
                            for t in queries.tiers(doc).values() if t.get("job_id") and name in t["nodes"]), None)
                for name in node_names}

    def python_note(self) -> str | None:
        """What `rl360 plan` says when the profile names no interpreter for the nodes."""
        return slurm_script.python_note(self.profile)

    # ------------------------------------------------------------------ paths

    @property
    def run_root(self) -> Path:
        root = Path(self.profile.run_root) if self.profile.run_root else self.state.home / "runs"
        return root.absolute()

    @property
    def jobs_dir(self) -> Path:
        """submitit's folder: `<job id>/` holds each allocation's script, pickles and holder log."""
        return self.run_root / "cluster" / "slurm"

    @property
    def submit_folder(self) -> Path:
        return self.jobs_dir / "%j"

    @property
    def nodes_dir(self) -> Path:
        """Where each holder task reports its node (`<node>.<job id>.json`)."""
        return self.jobs_dir / "nodes"

    # ------------------------------------------------------------------ plan

    def groups(self) -> list[tuple[str, ...]]:
        """The submissions: one per tier, or one for all tiers (hetjob)."""
        tiers = tuple(self.profile.tiers)
        return [tiers] if self.options.mode == "hetjob" else [(t,) for t in tiers]

    def sbatch_script(self, group: tuple[str, ...], *, exclude: tuple[str, ...] = ()) -> str:
        if len(group) == 1 and self.options.mode != "hetjob":
            return slurm_script.render_tier(self.profile, group[0], self.submit_folder, exclude=exclude)
        return slurm_script.render_het(self.profile, self.submit_folder, exclude=exclude)

    def provision_plan(self) -> list[Allocation]:
        """One sbatch per submission, with its exact script; touches neither Slurm nor disk."""
        return [Allocation(tiers="+".join(group), detail="; ".join(self._tier_detail(t) for t in group),
                           command=("sbatch",), script=self.sbatch_script(group))
                for group in self.groups()]

    def _tier_detail(self, tier: str) -> str:
        spec = self.profile.tiers[tier]
        opts = self.options
        parts = [f"{spec.num_nodes} node{'s' if spec.num_nodes > 1 else ''}"]
        if spec.gpus_per_node:
            parts.append(f"{spec.gpus_per_node} GPUs each")
        if spec.sandbox_gpus_per_node:
            parts.append(f"{spec.sandbox_gpus_per_node} more for GPU sandboxes")
        if spec.gres():
            parts.append(f"GRES {spec.gres()}")
        if spec.cpus_per_node:
            parts.append(f"{spec.cpus_per_node} CPUs each")
        parts.append(f"partition {spec.partition or opts.partition or '(default)'}")
        parts.append(f"time {spec.time_limit or opts.time_limit}")
        if opts.exclusive:
            parts.append("exclusive")
        return f"{tier}: " + ", ".join(parts) if self.options.mode == "hetjob" else ", ".join(parts)

    def placement_plan(self, recipe: PlacedRecipe) -> list[tuple[str, str]]:
        return placement(self.profile, recipe).rows()

    # ------------------------------------------------------------------ tiers

    def provision(self) -> tuple[dict[str, TierRecord], dict[str, NodeRecord]]:
        """Submit every tier, wait until each holds its nodes, and return the tiers and nodes to record.

        On any failure (a refusal, a timeout, Ctrl-C) what was submitted is cancelled before the error
        goes up, so the state file and the cluster stay as they were.
        """
        slurm_cmd.need_tool("sbatch")
        info = cluster_info(timeout_s=self.options.command_timeout_s, slurm_conf=self.options.slurm_conf)
        partitions = check_profile(self.profile, info)
        submitted = []
        try:
            for group in self.groups():
                submitted.append(self.submit_group(group))
            allocated = self.wait_allocated(submitted)
        except BaseException:
            # The original error is the one to report; a failing cancel must not hide it.
            with contextlib.suppress(Rl360Error):
                self.cancel_jobs([s["job_id"] for s in submitted], confirm=False)
            raise
        tiers: dict[str, TierRecord] = {}
        nodes: dict[str, NodeRecord] = {}
        for sub, alloc in zip(submitted, allocated):
            for tier, (job_id, tier_nodes) in alloc.items():
                tiers[tier] = self._tier_record(tier, sub, job_id, tier_nodes, partitions[tier], info)
                for node in tier_nodes:
                    nodes[node] = self._node_record(tier, node, info)
        return tiers, nodes

    def submit_group(self, group: tuple[str, ...], *, exclude: tuple[str, ...] = ()) -> dict:
        slurm_cmd.need_tool("sbatch")
        slurm_cmd.need_tool("srun")  # submitit refuses to work without it
        from rl360cli.backends import slurm_submit

        self._export_conf()
        tier = group[0] if len(group) == 1 and self.options.mode != "hetjob" else None
        job_id, script = slurm_submit.submit(self.profile, self.submit_folder, self.nodes_dir, tier=tier,
                                             exclude=exclude)
        return {"group": group, "job_id": job_id, "script": script, "submitted_at": time.time(),
                "het": tier is None, "exclude": list(exclude)}

    def wait_allocated(self, submitted: list[dict]) -> list[dict[str, tuple[str, list[str]]]]:
        """Block until every submission runs and each of its nodes has reported; per submission,
        tier -> (its job id, its nodes). Polls with back-off, from 0.25 s up to the poll interval."""
        deadline = time.monotonic() + self.options.allocation_timeout_s
        delay = 0.25
        while True:
            snap = self.poller.snapshot([s["job_id"] for s in submitted], force=True)
            results = [self.allocation_of(sub, snap) for sub in submitted]
            if all(r is not None for r in results):
                return results  # type: ignore[return-value]
            if time.monotonic() > deadline:
                waiting = [s for s, r in zip(submitted, results) if r is None]
                reasons = ", ".join(f"job {s['job_id']} {self._pending_reason(s, snap)}" for s in waiting)
                raise Rl360Error(f"the allocation did not start within {self.options.allocation_timeout_s:g}s "
                                 f"({reasons}); it was cancelled",
                                 "free nodes (squeue), lower num_nodes, or raise allocation_timeout_s in [slurm]")
            time.sleep(delay)
            delay = min(delay * 1.5, self.options.poll_interval_s)

    def allocation_of(self, sub: dict, snap: Snapshot) -> dict[str, tuple[str, list[str]]] | None:
        """tier -> (job id, nodes) once the submission runs and every holder has reported; None while
        pending; an error if it ended."""
        queue = snap.queue or {}
        if sub["het"]:
            comps = {int(d["display_id"].split("+", 1)[1]): jid for jid, d in queue.items()
                     if d["display_id"].startswith(f"{sub['job_id']}+")}
            ids = [comps.get(g) for g in range(len(sub["group"]))]
            leader_state, _ = snap.job(sub["job_id"])
            if None in ids and leader_state in ENDED:
                raise Rl360Error(f"the heterogeneous job {sub['job_id']} ended {leader_state} before it was ready: "
                                 f"{self._holder_log_tail(sub['job_id'])}", f"see {self.jobs_dir / sub['job_id']}")
            if None in ids:
                return None  # squeue has not listed every group yet (or could not be asked)
        else:
            ids = [sub["job_id"]]
        result = {}
        for tier, job_id in zip(sub["group"], ids):
            state, job = snap.job(job_id)
            if state in ENDED or state == "COMPLETING":
                raise Rl360Error(f"the allocation of tier {tier} (job {job_id}) ended {state} "
                                 f"before it was ready: {self._holder_log_tail(sub['job_id'])}",
                                 f"see {self.jobs_dir / sub['job_id']}")
            if state != "RUNNING" or not job.get("nodes"):
                return None
            reporter = sub["job_id"]  # the holder's SLURM_JOB_ID: the het leader's id in a het job
            if not all(self._reported(node, reporter, sub["submitted_at"]) for node in job["nodes"]):
                return None
            result[tier] = (job_id, list(job["nodes"]))
        return result

    def _reported(self, node: str, job_id: str, since: float) -> bool:
        report = read_json(self.nodes_dir / f"{node}.{job_id}.json")
        return bool(report) and report.get("started_at", 0) >= since - 5

    def _pending_reason(self, sub: dict, snap: Snapshot) -> str:
        state, job = snap.job(sub["job_id"])
        if state is None:
            return "not listed"
        return f"{state.lower()} ({job.get('reason') or 'waiting for its nodes to report'})"

    def _holder_log_tail(self, job_id: str) -> str:
        log = self.jobs_dir / job_id / f"{job_id}_0_log.out"
        try:
            return slurm_cmd.last_line(log.read_text(errors="replace")[-4000:]) or "(empty holder log)"
        except FileNotFoundError:
            return "(no holder log)"

    def _tier_record(self, tier: str, sub: dict, job_id: str, nodes: list[str], partition: str, info) -> TierRecord:
        spec = self.profile.tiers[tier]
        first = info.nodes.get(nodes[0], {}) if info is not None else {}
        return {
            "kind": tier, "backend": "slurm", "status": TierStatus.READY, "mode": self.options.mode,
            "job_id": job_id, "het_leader": sub["job_id"] if sub["het"] else None,
            "het_group": sub["group"].index(tier) if sub["het"] else None,
            "nodes": nodes, "partition": partition,
            "resources": {"cpus": spec.cpus_per_node or first.get("cpus"),
                          "memory_mb": int(spec.memory_gb_per_node * 1024) if spec.memory_gb_per_node
                          else first.get("memory_mb"),
                          "gpus": spec.total_gpus_per_node},
            "script": sub["script"], "holder_log": str(self.jobs_dir / sub["job_id"] / f"{sub['job_id']}_0_log.out"),
            "submitted_at": now_iso(), "requeues": 0, "lost_nodes": list(sub.get("exclude", [])),
        }

    def _node_record(self, tier: str, node: str, info) -> NodeRecord:
        spec = self.profile.tiers[tier]
        known = info.nodes.get(node, {}) if info is not None else {}
        cpus = known.get("cpus") or spec.cpus_per_node or 0
        memory = known.get("memory_mb") or 0
        return {
            "address": known.get("address") or node, "tier": tier, "cpus": cpus, "memory_mb": memory,
            "reserved_cpus": cpus if self.options.exclusive else (spec.cpus_per_node or cpus),
            "reserved_memory_mb": int(spec.memory_gb_per_node * 1024) if spec.memory_gb_per_node else memory,
            "gpus": spec.total_gpus_per_node, "images": {},
        }

    def tiers_alive(self, tiers: Mapping[str, TierRecord]) -> dict[str, bool]:
        """Whether each recorded tier still holds (or waits for) its allocation; a tier Slurm cannot tell
        about counts as alive, so a silent scheduler never causes a second allocation."""
        ours = {n: t for n, t in tiers.items() if t["backend"] == "slurm" and t.get("job_id")}
        if not ours:
            return {name: False for name in tiers}
        snap = self.snapshot()
        lost_nodes = self.lost_nodes(snap, self.holders_of(*ours.values()))
        alive = {}
        for name, tier in tiers.items():
            if name not in ours or tier["status"] in TIER_FINAL:
                alive[name] = False
                continue
            state, _ = snap.job(str(tier["job_id"]))
            lost = any(n in lost_nodes for n in tier["nodes"])
            alive[name] = (state is None or state in ACTIVE) and not lost
        return alive

    def release(self, tiers: Mapping[str, TierRecord]) -> None:
        """scancel every tier's job and wait until sacct shows each ended and squeue no longer runs it."""
        ids = []
        for tier in tiers.values():
            if tier["backend"] == "slurm":
                pending = (tier.get("pending") or {}).get("job_id")  # a requeue's replacement, maybe pending
                ids += [str(j) for j in (tier.get("het_leader"), tier.get("job_id"), pending) if j]
                ids += [str(j) for j in tier.get("previous_job_ids") or []]
        self.cancel_jobs(sorted(set(ids)), confirm=True)

    def cancel_jobs(self, job_ids: list[str], *, confirm: bool, timeout_s: float = 90.0) -> None:
        if not job_ids:
            return
        self._scancel(job_ids)
        if not confirm:
            return
        deadline = time.monotonic() + timeout_s
        while True:
            snap = self.poller.snapshot(job_ids, force=True)
            left = [j for j in job_ids if not self._job_gone(j, snap)]
            if not left:
                return
            if time.monotonic() > deadline:
                states = ", ".join(f"{j} {snap.job(j)[0] or 'unknown'}" for j in left)
                raise Rl360Error(f"jobs did not end within {timeout_s:g}s of scancel ({states})",
                                 f"check them with `squeue -j {','.join(left)}`, then run `rl360 down` again")
            time.sleep(0.5)

    @staticmethod
    def _job_gone(job_id: str, snap: Snapshot) -> bool:
        """Ended for sure: sacct says so and squeue no longer holds it (or forgot it)."""
        acct = (snap.acct_jobs or {}).get(job_id)
        queued = (snap.queue or {}).get(job_id)
        if snap.acct_jobs is None or snap.queue is None:
            return False
        return acct is not None and acct["state"] in ENDED and (queued is None or queued["state"] in ENDED)

    def _scancel(self, targets: list[str], *, sig: str | None = None) -> None:
        argv = ["scancel", *([f"--signal={sig}"] if sig else []), *targets]
        try:
            slurm_cmd.run(argv, timeout_s=self.options.command_timeout_s, slurm_conf=self.options.slurm_conf)
        except slurm_cmd.SlurmCommandFailed as e:
            # Already gone is what we wanted; anything else is a real failure.
            if "Invalid job id" not in e.stderr and "already completing or completed" not in e.stderr:
                raise

    # ------------------------------------------------------------------ components

    def launch(self, spec: ComponentSpec, log_path: str) -> dict:
        doc = self.state.read()
        tier = queries.tier(doc, spec.tier)
        if not tier or tier["backend"] != "slurm":
            raise Rl360Error(f"tier {spec.tier} is not provisioned on Slurm",
                             "run `rl360 provision --profile PROFILE.toml` first")
        if tier["status"] != TierStatus.READY:
            raise Rl360Error(f"tier {spec.tier} is {tier['status']}, not ready",
                             "wait for it (`rl360 status`) or provision it again")
        nodes = self.choose_nodes(spec, tier, queries.components(doc))
        return self.start_step(spec, tier, nodes, log_path)

    def choose_nodes(self, spec: ComponentSpec, tier: TierRecord,
                     components: Mapping[str, ComponentRecord]) -> list[str]:
        """The nodes of the step: those `spec.node` names (a hostlist, or `*` for all of the tier's),
        else the tier's node with the fewest live components."""
        tier_nodes = list(tier["nodes"])
        if spec.node == "*":
            return tier_nodes
        if spec.node:
            wanted = slurm_cmd.expand_hostlist(spec.node)
            strangers = [n for n in wanted if n not in tier_nodes]
            if strangers:
                raise Rl360Error(f"{spec.id}: node {', '.join(strangers)} is not in tier {spec.tier}",
                                 f"use one of its nodes: {', '.join(tier_nodes)}")
            return wanted
        load = {n: 0 for n in tier_nodes}
        for rec in components.values():
            if rec["backend"] == "slurm" and rec["status"] not in COMPONENT_FINAL:
                for n in rec.get("nodes") or [rec["node"]]:
                    if n in load:
                        load[n] += 1
        return [min(tier_nodes, key=lambda n: (load[n], tier_nodes.index(n)))]

    def start_step(self, spec: ComponentSpec, tier: TierRecord, nodes: list[str], log_path: str) -> dict:
        """Start the component as a job step on `nodes` and wait until its first task has started."""
        files = StepFiles.for_log(log_path)
        files.log.parent.mkdir(parents=True, exist_ok=True)
        for rank in range(len(nodes)):
            for path in (files.status, files.step):
                Path(rank_path(str(path), rank)).unlink(missing_ok=True)
        argv = srun_argv(python=slurm_script.python_of(self.profile), job_id=str(tier["job_id"]),
                         het_leader=tier.get("het_leader"), het_group=tier.get("het_group"), nodes=nodes,
                         name=spec.id, files=files, argv=spec.argv, container_image=self.options.container_image,
                         container_mounts=self.options.container_mounts)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_"))}
        env.update(spec.env)
        env["PYTHONUNBUFFERED"] = "1"
        if self.options.slurm_conf or os.environ.get("SLURM_CONF"):
            env["SLURM_CONF"] = slurm_cmd.expand(self.options.slurm_conf) or os.environ["SLURM_CONF"]
        slurm_cmd.need_tool("srun")
        launched_at = time.time()
        with open(files.srun_log, "ab") as out:
            # Its own session: the CLI exits long before the step does, and Ctrl-C in the shell is not for it.
            srun = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True)
        step = self._wait_for_file(files.step, srun, spec.id, files.srun_log)
        status = self._wait_for_file(files.status, srun, spec.id, files.srun_log, timeout_s=10.0, required=False)
        job_id = str(tier["job_id"])
        return {
            "backend": "slurm", "node": nodes[0], "nodes": nodes, "num_tasks": len(nodes),
            "job_id": job_id, "het_leader": tier.get("het_leader"), "het_group": tier.get("het_group"),
            "step": str(step["step_id"]), "step_key": f"{job_id}.{step['step_id']}",
            "srun_pid": srun.pid, "srun_start_time": procinfo.start_time(srun.pid),
            "pid": status.get("pid"), "start_time": status.get("start_time"),
            "status_path": str(files.status), "step_path": str(files.step), "log_path": str(files.log),
            "srun_log": str(files.srun_log), "command": list(spec.argv), "env": dict(spec.env),
            "requested_node": spec.node, "launched_at": launched_at, "restarts": 0,
        }

    def _wait_for_file(self, path: Path, srun: subprocess.Popen, cid: str, srun_log: Path, *,
                       timeout_s: float | None = None, required: bool = True) -> dict:
        deadline = time.monotonic() + (timeout_s or self.options.step_timeout_s)
        while time.monotonic() < deadline:
            data = read_json(path)
            if data:
                return data
            if srun.poll() is not None:
                data = read_json(path)
                if data or not required:
                    return data
                raise Rl360Error(f"{cid}: srun could not start the job step ({self._tail(srun_log)})",
                                 f"see {srun_log}")
            time.sleep(0.05)
        if not required:
            return {}
        _signal(srun.pid, signal.SIGTERM)
        raise Rl360Error(f"{cid}: the job step did not start within {timeout_s or self.options.step_timeout_s:g}s",
                         f"see {srun_log}; check the tier's nodes with `rl360 status`")

    @staticmethod
    def _tail(path: Path) -> str:
        try:
            return slurm_cmd.last_line(path.read_text(errors="replace")[-4000:]) or "no output"
        except FileNotFoundError:
            return "no output"

    def snapshot(self, *, newer_than: float = 0.0, force: bool = False) -> Snapshot:
        """The shared poll, always about every Slurm job and node this state file knows, so that status,
        provision and requeue all read (and refresh) the same cached snapshot."""
        doc = self.state.read()
        job_ids: set[str] = set()
        nodes: set[str] = set()
        for tier in queries.tiers(doc).values():
            if tier["backend"] == "slurm":
                pending = (tier.get("pending") or {}).get("job_id")
                job_ids.update(str(j) for j in (tier.get("job_id"), tier.get("het_leader"), pending) if j)
                nodes.update(tier["nodes"])
        for rec in queries.live_components(doc).values():
            if rec["backend"] == "slurm":
                job_ids.update(str(j) for j in (rec.get("job_id"),) if j)
                nodes.update(rec.get("nodes") or [])
        return self.poller.snapshot(job_ids, nodes, newer_than=newer_than, force=force)

    def lost_nodes(self, snap: Snapshot, holders: dict[str, str]) -> set[str]:
        """Of `holders` (node -> the job id its holder reports under), the nodes that are lost: Slurm says
        so, or the holder's heartbeat is older than three beats (a crashed node stops beating before
        slurmctld gives up on it)."""
        # Three beats, and never under 3 s: a busy node may run a beat late, and a false loss costs a requeue.
        stale_after = max(3 * self.options.heartbeat_s, 3.0)
        now = time.time()
        lost = set()
        for node, holder in holders.items():
            if snap.node_lost(node):
                lost.add(node)
                continue
            state, _ = snap.job(holder)
            if state in ENDED or state == "COMPLETING":
                continue  # the allocation ended, so its holder stopped beating: that says nothing of the node
            try:
                age = now - (self.nodes_dir / f"{node}.{holder}.json").stat().st_mtime
            except FileNotFoundError:
                continue  # not reported yet (or already gone): no evidence either way
            if age > stale_after:
                lost.add(node)
        return lost

    @staticmethod
    def holders_of(*records: ComponentRecord | TierRecord) -> dict[str, str]:
        """node -> holder job id for component or tier records."""
        out = {}
        for rec in records:
            holder = rec.get("het_leader") or rec.get("job_id")
            if holder:
                for node in rec.get("nodes") or [rec.get("node")]:
                    if node:
                        out[node] = str(holder)
        return out

    def observe(self, records: Mapping[str, ComponentRecord]) -> dict[str, Observation]:
        if not records:
            return {}
        newer_than = max((float(r.get("launched_at") or 0) for r in records.values()), default=0.0)
        try:
            snap = self.snapshot(newer_than=newer_than)
            # A component launched after the snapshot began is unknown to it: ask again.
            extra_ids = {str(r["job_id"]) for r in records.values() if r.get("job_id")} - set(snap.job_ids)
            extra_nodes = {n for r in records.values() for n in r.get("nodes") or []} - set(snap.node_names)
            if extra_ids or extra_nodes:
                snap = self.poller.snapshot(set(snap.job_ids) | extra_ids, set(snap.node_names) | extra_nodes,
                                            newer_than=newer_than)
        except Rl360Error as e:
            return {cid: Observation(ComponentStatus.UNKNOWN, None, f"Slurm did not answer ({e.problem})")
                    for cid in records}
        live = (r for r in records.values() if r["status"] not in COMPONENT_FINAL)
        lost = self.lost_nodes(snap, self.holders_of(*live))
        return {cid: observe_component(rec, snap, lost) for cid, rec in records.items()}

    def stop(self, records: Mapping[str, ComponentRecord], *, grace_s: float = 10.0) -> None:
        """SIGTERM every live step, scancel what is left after `grace_s`, and confirm each ended."""
        live = {cid: rec for cid, rec in records.items()
                if rec["status"] not in COMPONENT_FINAL and rec.get("step_key")}
        if live:
            targets = [rec["step_key"] for rec in live.values()]
            self._scancel(targets, sig="TERM")
            left = self._wait_steps_end(live, grace_s)
            if left:
                self._scancel([live[cid]["step_key"] for cid in left])
                # Slurm sends SIGKILL KillWait seconds after its own SIGTERM.
                left = self._wait_steps_end({cid: live[cid] for cid in left}, 60.0)
            if left:
                raise Rl360Error(f"job steps of {', '.join(sorted(left))} did not end after scancel",
                                 "check them with `squeue -s`, then run `rl360 down` again")
        for rec in records.values():
            # The srun clients end with their steps; one still here (a step on a lost node) is ours to end.
            if procinfo.is_alive(rec.get("srun_pid"), rec.get("srun_start_time")):
                _signal(rec["srun_pid"], signal.SIGTERM)

    def _wait_steps_end(self, live: Mapping[str, ComponentRecord], timeout_s: float) -> list[str]:
        """The components whose step has not ended after `timeout_s` (polling sacct twice a second)."""
        deadline = time.monotonic() + timeout_s
        left = dict(live)
        while left:
            snap = self.poller.snapshot({str(r["job_id"]) for r in left.values()},
                                        {n for r in left.values() for n in r.get("nodes") or []}, force=True)
            lost = self.lost_nodes(snap, self.holders_of(*left.values()))
            for cid, rec in list(left.items()):
                obs = observe_component({**rec, "status": ComponentStatus.RUNNING}, snap, lost)
                if obs.status in COMPONENT_FINAL:
                    del left[cid]
            if not left or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        return sorted(left)

    # ------------------------------------------------------------------ node loss

    def heal(self) -> list[str]:
        """Advance the recovery of tiers that lost a node (see slurm_requeue); returns progress lines."""
        return self.recovery.heal()

    def _export_conf(self) -> None:
        # submitit runs sbatch with this process's environment.
        if self.options.slurm_conf:
            os.environ["SLURM_CONF"] = slurm_cmd.expand(self.options.slurm_conf)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass

