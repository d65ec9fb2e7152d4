"""Every change to the state file, by name: the one place records are written.

    transitions.start_run(state, run_id, name=..., recipe=..., run_dir=..., num_steps=30, resumed=False)
    transitions.record_component(state, cid, record)
    transitions.stop_active_runs(state, reason="stopped by rl360 down")

Each transition takes the file's lock, reads, changes the records it names and
writes the document back atomically (`StateFile.update`); the rules that keep
records consistent live here with the change they guard: a run `rl360 down`
stopped keeps that status whatever its trainer says afterwards, a component
`rl360 down` stopped is never marked anything else, a restart counts itself.
Callers decide *what* happened (a process ended, a tier lost a node); the
transition records it. The Slurm recovery's transitions are in recovery.py,
the node image caches' in images.py. Nothing outside rl360cli/state/ calls
`update()` (tests/test_architecture.py checks it).
"""

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rl360cli.outcome import InfraCause
from rl360cli.state.queries import Generation, generation, live_holders
from rl360cli.state.schema import (COMPONENT_FINAL, RUN_ACTIVE, ComponentRecord, ComponentStatus, HolderRecord,
                                   NodeRecord, ProfileRecord, RunStatus, SandboxRecord, SandboxStatus, StateDoc,
                                   TierRecord, now_iso)
from rl360cli.state.store import StateFile

# ----------------------------------------------------------------------------- runs

# A run `rl360 down` stopped keeps these as down wrote them: a trainer that meets its engines' end, or starts
# its loop after the stop, never overwrites them.
_STOP_FIELDS = ("status", "reason", "ended_at")


def start_run(state: StateFile, run_id: str, *, name: str, recipe: str, run_dir: str, num_steps: int,
              resumed: bool, overrides: Sequence[str] = (), calibrate: int | None = None) -> None:
    """Create run `run_id` (or reopen it, `resumed`) as `starting`, and make it the current run; `calibrate`:
    a calibration run of that many samples per task."""
    with state.update() as doc:
        run = doc["runs"].setdefault(run_id, {
            "name": name, "recipe": recipe, "run_dir": run_dir, "metrics_path": f"{run_dir}/metrics.jsonl",
            "started_at": now_iso(), "step": 0, "policy_version": 0, "num_steps": num_steps,
        })
        run.update(status=RunStatus.STARTING, resumed=resumed, num_steps=num_steps, overrides=list(overrides),
                   cause=None, resume_after=None)
        if calibrate:
            run["calibrate"] = calibrate
        doc["current_run"] = run_id


def set_run_overrides(state: StateFile, run_id: str, *, overrides: Sequence[str], num_steps: int) -> None:
    """The run's `--set` overrides (all of them, as typed) and the number of steps they give it."""
    with state.update() as doc:
        doc["runs"][run_id].update(overrides=list(overrides), num_steps=num_steps)


def mark_run_running(state: StateFile, run_id: str, *, pid: int) -> None:
    """The run's trainer (process `pid`) has set up and runs the loop."""
    _set_run(state, run_id, status=RunStatus.RUNNING, pid=pid)


def record_run_progress(state: StateFile, run_id: str, *, step: int, policy_version: int,
                        reward_mean: float | None) -> None:
    """Step `step` is done; the trainer's weights are at `policy_version`."""
    _set_run(state, run_id, step=step, policy_version=policy_version, reward_mean=reward_mean)


def end_run(state: StateFile, run_id: str, status: RunStatus, *, reason: str | None = None,
            **summary: Any) -> None:
    """The run's trainer ended it (`finished` or `failed`, with `reason`); `summary` adds what it reports at the
    end (its policy version, the version each engine serves). A run `rl360 down` stopped stays stopped."""
    # The trainer's own end is no loss the recovery acts on.
    fields = {"status": status, "ended_at": now_iso(), "cause": None, "resume_after": None, **summary}
    if reason is not None:
        fields["reason"] = reason
    _set_run(state, run_id, **fields)


def _set_run(state: StateFile, run_id: str, **fields: Any) -> None:
    with state.update() as doc:
        run = doc["runs"].setdefault(run_id, {})
        if run.get("status") == RunStatus.STOPPED:
            for key in _STOP_FIELDS:
                fields.pop(key, None)
        run.update(fields)


def stop_active_runs(state: StateFile, *, reason: str) -> list[str]:
    """Mark every run under way `stopped` with `reason`; returns their ids."""
    with state.update() as doc:
        stopped = [rid for rid, run in doc["runs"].items() if run["status"] in RUN_ACTIVE]
        for rid in stopped:
            doc["runs"][rid].update(status=RunStatus.STOPPED, reason=reason, ended_at=now_iso())
    return stopped


# ----------------------------------------------------------------------------- components


def record_component(state: StateFile, cid: str, record: ComponentRecord) -> None:
    """Component `cid` was launched: its backend's record, completed by the stage that started it."""
    with state.update() as doc:
        doc["components"][cid] = record


# Each `mark_*` leaves a component that is gone or that `rl360 down` stopped as down wrote it, and, given
# `of_generation` (`queries.generation` of the record its caller acted on), one started again since: what the
# caller saw was the old process. Each returns True if it recorded.


def mark_ready(state: StateFile, cid: str, *, of_generation: Generation | None = None) -> bool:
    """Component `cid` answers its health URL (or wrote its ready file): `running`."""
    return _set_component(state, cid, of_generation=of_generation, status=ComponentStatus.RUNNING)


def mark_failed(state: StateFile, cid: str, *, reason: str | None, exit_code: int | None = None,
                of_generation: Generation | None = None) -> bool:
    """Component `cid` ended, or is dead to rl360 (hung): `failed`, with its `exit_code` where one is known
    (None: the recorded one stays)."""
    fields: dict[str, Any] = {"status": ComponentStatus.FAILED, "reason": reason, "cause": None}
    if exit_code is not None:
        fields["exit_code"] = exit_code
    return _set_component(state, cid, of_generation=of_generation, **fields)


def mark_unknown(state: StateFile, cid: str, *, reason: str, of_generation: Generation | None = None) -> bool:
    """Component `cid`'s fate cannot be told now (not healthy in time): `unknown`, looked at again later."""
    return _set_component(state, cid, of_generation=of_generation, status=ComponentStatus.UNKNOWN, reason=reason,
                          cause=None)


def mark_restart_failed(state: StateFile, cid: str, *, reason: str) -> bool:
    """Its tier's recovery could not start component `cid` again: `failed`, and no longer to be restarted."""
    return _set_component(state, cid, status=ComponentStatus.FAILED, restart=False, reason=reason, cause=None)


def record_served_version(state: StateFile, cid: str, *, version: int) -> bool:
    """Engine `cid`, back in the weight-update group, serves policy `version`."""
    return _set_component(state, cid, served_version=version)


def _set_component(state: StateFile, cid: str, *, of_generation: Generation | None = None, **fields: Any) -> bool:
    with state.update() as doc:
        rec = _writable(doc, cid, of_generation)
        if rec is None:
            return False
        rec.update(fields)
        return True


def _writable(doc: StateDoc, cid: str, of_generation: Generation | None) -> ComponentRecord | None:
    """Component `cid`'s record where a write may land: there, not stopped by `rl360 down`, and (given
    `of_generation`) still the start its writer read."""
    rec = doc["components"].get(cid)
    if rec is None or rec["status"] == ComponentStatus.STOPPED:
        return None
    if of_generation is not None and generation(rec) != of_generation:
        return None
    return rec


def mark_components_stopped(state: StateFile, cids: Iterable[str]) -> None:
    """rl360 stopped these components (their run ended): every one not already ended is `stopped`."""
    with state.update() as doc:
        for cid in cids:
            rec = doc["components"].get(cid)
            if rec is not None and rec["status"] not in COMPONENT_FINAL:
                rec["status"] = ComponentStatus.STOPPED


def record_restart(state: StateFile, cid: str, launched: Mapping[str, Any], *, command: Sequence[str],
                   env: Mapping[str, str], url: str | None, health_url: str | None, reason: str,
                   while_run_active: bool = False, of_generation: Generation | None = None) -> ComponentRecord | None:
    """Component `cid` was started again (`launched`: its backend's new record); its record keeps its place,
    name and ports and counts the restart. Returns the new record, or None when it was not recorded: the
    component is gone or stopped, or — `while_run_active` — its run is no longer under way (`rl360 down`
    marks runs stopped before it stops anything), or — `of_generation` — someone else started it again since
    the caller read it (a tier's requeue, racing the control plane); the caller then stops what it started."""
    with state.update() as doc:
        current = _writable(doc, cid, of_generation)
        if current is None:
            return None
        run = doc["runs"].get(current["run"] or "")
        if while_run_active and (run is None or run["status"] not in RUN_ACTIVE):
            return None
        keep = {key: current.get(key) for key in ("stage", "tier", "name", "kind", "run", "ports")}
        record: ComponentRecord = {**current, **launched, **keep}
        record.update(command=list(command), env=dict(env), url=url, health_url=health_url, started_at=now_iso(),
                      exit_code=None, reason=None, cause=None,
                      status=ComponentStatus.STARTING if health_url else ComponentStatus.RUNNING,
                      restarts=int(current.get("restarts") or 0) + 1, restarted_at=now_iso(), restart_reason=reason,
                      served_version=None, restart=False)
        doc["components"][cid] = record
        return record


def request_rejoin(state: StateFile, cid: str) -> None:
    """The control plane asks the trainer to take restarted engine `cid` back into the weight-update group."""
    _set_component(state, cid, rejoin_requested_at=now_iso(), rejoin_error=None, served_version=None)


def record_rejoined(state: StateFile, cid: str, *, version: int | None, error: str | None = None) -> None:
    """The trainer answered a rejoin: engine `cid` serves `version` now, or (`error`) it could not take it."""
    _set_component(state, cid, rejoin_requested_at=None, served_version=version, rejoin_error=error)


# ----------------------------------------------------------------------------- commands that hold a component


def hold_component(state: StateFile, cid: str, holder: HolderRecord, *, started: bool) -> bool:
    """Command `holder` uses component `cid` (the machine's egress proxy) until it leaves (`release_component`);
    `started`: it started it, for the commands that hold it (the last to leave stops it). False when `cid` is
    gone or ended."""
    with state.update() as doc:
        rec = doc["components"].get(cid)
        if rec is None or rec["status"] in COMPONENT_FINAL:
            return False
        rec["holders"] = [*live_holders(rec), holder]
        if started:
            rec["for_commands"] = True
        return True


def release_component(state: StateFile, cid: str, holder: HolderRecord) -> bool:
    """Command `holder` no longer uses component `cid`. True when `cid` was started for the commands that hold
    it and no live one is left: the caller stops it."""
    with state.update() as doc:
        rec = doc["components"].get(cid)
        if rec is None:
            return False
        rec["holders"] = [h for h in live_holders(rec) if (h["pid"], h["start_time"]) !=
                          (holder["pid"], holder["start_time"])]
        return bool(rec.get("for_commands")) and not rec["holders"]


def keep_for_cluster(state: StateFile, cids: Iterable[str]) -> None:
    """`rl360 up` uses these components: the cluster's from now on, kept until `rl360 down` whichever command
    that holds them leaves."""
    with state.update() as doc:
        for cid in cids:
            if (rec := doc["components"].get(cid)) is not None:
                rec["for_commands"] = False


# ----------------------------------------------------------------------------- what `rl360 status` observes


# What a backend saw a component do: (status, exit code, reason, cause); a run's end: (status, reason, cause).
Observed = tuple[ComponentStatus, int | None, str | None, InfraCause | None]
RunEnd = tuple[RunStatus, str, InfraCause | None]


def record_observations(state: StateFile, observed: Mapping[str, Observed],
                        run_ends: Mapping[str, RunEnd]) -> list[str]:
    """What the backends saw: `observed` by cid; `run_ends` for a running run whose trainer ended without saying
    so. A component that ended meanwhile (another command stopped it) keeps what that command wrote. Returns the
    cids whose record changed."""
    changed = []
    with state.update() as doc:
        for cid, (status, exit_code, reason, cause) in observed.items():
            rec = doc["components"].get(cid)
            if rec is None or rec["status"] in COMPONENT_FINAL:
                continue
            rec.update(status=status, exit_code=exit_code, reason=reason, cause=cause)
            changed.append(cid)
        for run_id, (status, reason, cause) in run_ends.items():
            run = doc["runs"].get(run_id)
            if run is not None and run["status"] == RunStatus.RUNNING:
                run.update(status=status, reason=reason, cause=cause, resume_after=None)
    return changed


# ----------------------------------------------------------------------------- tiers, nodes, sandboxes


def record_provision(state: StateFile, profile: ProfileRecord, tiers: Mapping[str, TierRecord],
                     nodes: Mapping[str, NodeRecord]) -> None:
    """The tiers were allocated under `profile`, on `nodes`. A node's image cache survives re-provisioning:
    the images are still on its disk."""
    with state.update() as doc:
        doc["profile"] = profile
        doc["tiers"] = dict(tiers)
        for name, node in nodes.items():
            known = doc["nodes"].get(name)
            doc["nodes"][name] = {**node, "images": known.get("images", {}) if known else {}}


def record_sandbox(state: StateFile, sid: str, record: SandboxRecord) -> None:
    """A fleet sandbox (`rl360 sandboxes launch`) was started and left running."""
    with state.update() as doc:
        doc["sandboxes"][sid] = record


def set_sandbox_statuses(state: StateFile, statuses: Mapping[str, SandboxStatus]) -> None:
    """What `rl360 sandboxes list` saw of each recorded sandbox."""
    with state.update() as doc:
        for sid, status in statuses.items():
            if sid in doc["sandboxes"]:
                doc["sandboxes"][sid]["status"] = status


def forget(state: StateFile, *, components: Iterable[str] = (), tiers: Iterable[str] = (),
           sandboxes: Iterable[str] = ()) -> None:
    """Drop the records of what was stopped, released or removed (`rl360 down`; the events log keeps their
    history)."""
    with state.update() as doc:
        for cid in components:
            doc["components"].pop(cid, None)
        for name in tiers:
            doc["tiers"].pop(name, None)
        for sid in sandboxes:
            doc["sandboxes"].pop(sid, None)
