"""The faults of the chaos bench (bench/chaos.py): each fires once into a live run and says when the run
first recorded it (detected) and when it was whole again (recovered), both in seconds after the fault.

Each fault is a small object over the `ChaosRun` it is given (bench/chaos.py): `fire()` does the damage,
`poll()` is called about twice a second until `recovered_at` is set (or the bench gives up), `restore()`
puts back whatever the fault took away (a node) and is called in a `finally`, also when the run failed.

What "detected" and "recovered" mean differs by fault; each class's docstring says it, and
docs/reliability.md "Chaos on the dev cluster" repeats it under the table.

`victims` are the samples (attempt ids, `<group>-<index>`, the sandboxes' `rl360.attempt` label) the
fault hit before their verifier had written a reward: such a sample must end masked, never trained.
Faults that hit processes rather than sandboxes (engine, router, slurmd, trainer) cannot name their
victims from outside; for them the bench checks that no trained sample of the fault's steps is one
the run itself recorded as infra-failed.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from rl360cli.loop.ledger import trained_rewards

if TYPE_CHECKING:
    from bench.chaos import ChaosRun

REPO = Path(__file__).resolve().parents[1]
DOCKER_NODES = REPO / "cluster" / "dev" / "docker-nodes.sh"
SLURM = REPO / "cluster" / "dev" / "slurm.sh"
# A fault's window: how long it may take to be recovered before the bench records it as not recovered.
RECOVERY_TIMEOUT_S = 240.0
# Whether a sandbox has already answered (the arith tasks' /app/answer.py) or been scored: the sandbox faults
# pick an attempt with its agent's commands and its verifier still ahead of it.
ANSWERED = "test -e /app/answer.py -o -e /logs/verifier/reward.txt -o -e /logs/verifier/reward.json"
# Fills the sandbox's two tmpfs mounts (/tmp, /run: counted against its memory limit, unreclaimable
# without swap) until they are full or the file-size limit stops the writer: with a 128 MB reservation
# every later command in the sandbox is OOM-killed by the kernel. Only an attempt that has not answered
# yet (checked in the same shell, so no verifier can slip in between); else it prints "answered".
FILL_MEMORY = (f"if {ANSWERED}; then echo answered; exit 0; fi; "
               "for d in /tmp /run; do head -c 1000m /dev/zero > $d/.chaos-fill 2>/dev/null; done; echo filled")
# The files whose presence says the attempt has answered or been scored, read while the container is
# paused (the daemon's archive calls see the volumes: /app, /logs).
ANSWER_FILES = ("/app/answer.py", "/logs/verifier/reward.txt", "/logs/verifier/reward.json")
SCORE_FILES = ANSWER_FILES[1:]


class Fault:
    """One row of the chaos table."""

    name = ""
    what = ""

    def __init__(self) -> None:
        self.fired_at: float | None = None
        self.detected_at: float | None = None
        self.recovered_at: float | None = None
        self.victims: set[str] = set()
        self.notes: list[str] = []
        self.ok = True  # False when the fault itself found something wrong (beyond not recovering)

    def fire(self, run: ChaosRun) -> None:
        raise NotImplementedError

    def poll(self, run: ChaosRun) -> None:
        raise NotImplementedError

    def restore(self, run: ChaosRun) -> None:
        """Put back what the fault took away (a node); a no-op for most."""

    def unearned(self, trained: dict[str, float | None]) -> set[str]:
        """Of the samples trained (sample -> reward), the victims whose reward the fault may have made:
        for most faults every trained victim (hit before its verifier wrote a reward)."""
        return self.victims & set(trained)

    def _detected(self, when: float | None = None) -> None:
        if self.detected_at is None:
            self.detected_at = when or time.time()

    def _recovered(self, when: float | None = None) -> None:
        self._detected(when)
        if self.recovered_at is None:
            self.recovered_at = when or time.time()

    def row(self) -> dict:
        since = (lambda t: None if t is None or self.fired_at is None else round(t - self.fired_at, 1))
        return {"fault": self.name, "what": self.what, "detected_s": since(self.detected_at),
                "recovered_s": since(self.recovered_at), "victims": sorted(self.victims), "notes": self.notes,
                "ok": self.ok}


# ----------------------------------------------------------------------------- sandboxes


class _SandboxFault(Fault):
    """A fault on one sandbox: the first of the run's containers to start from now on that has not answered.

    Detected: the container is gone (the attempt saw the failure and its sandbox was stopped).
    Recovered: the step that collected the victim is in the ledger with the victim masked."""

    def fire(self, run: ChaosRun) -> None:
        for node, container in run.containers_as_started(until=time.time() + 120):
            fired_at = time.time()
            if self.damage(run, node, container):
                self.node, self.container = node, container
                self.victims = {container.labels["rl360.attempt"]}
                self.fired_at = fired_at
                return
        raise RuntimeError(f"{self.name}: no sandbox of the run started and still unanswered in 120 s")

    def damage(self, run: ChaosRun, node: str, container) -> bool:
        """Damage the container if its attempt has not answered yet; whether it did."""
        raise NotImplementedError

    def poll(self, run: ChaosRun) -> None:
        if self.detected_at is None and not run.container_exists(self.node, self.container.id):
            self._detected()
        victim = next(iter(self.victims))
        for seen_at, entry in run.ledger_seen():
            fate = sample_fate(entry, victim)
            if fate is not None:
                if self.unearned(trained_rewards(entry)):
                    self.ok = False
                self.notes.append(f"{victim}: {fate} (step {entry['step']})")
                self._recovered(seen_at)
                return


def sample_fate(entry: dict, sample: str) -> str | None:
    """What the ledger entry of a step says became of one of its samples (None: not this step's)."""
    rewards = trained_rewards(entry)
    if sample in rewards:
        return f"trained, reward {rewards[sample]:g}"
    if sample in entry.get("samples", []):  # an entry from before rewards were kept
        return "trained"
    if sample in entry.get("masked", {}):
        return f"masked as {entry['masked'][sample]}"
    if sample.rsplit("-", 1)[0] in entry.get("generated", []):  # collected, then neither trained nor masked
        return "not masked, not trained (filtered: its group without reward variance, or stale)"
    return None


class SandboxKilled(_SandboxFault):
    """`docker kill` of a running sandbox (SIGKILL of its init: the container dies mid-attempt)."""

    name = "sandbox container killed"
    what = "docker kill of a live attempt's container"

    def damage(self, run: ChaosRun, node: str, container) -> bool:
        # Paused while its files are looked at, so that its verifier cannot run between the look and the kill.
        try:
            container.pause()
        except Exception:  # noqa: BLE001 — gone already
            return False
        if run.has_any_file(node, container, ANSWER_FILES):
            try:
                container.unpause()
            except Exception:  # noqa: BLE001 — its attempt ended and rl360 removed it meanwhile
                pass
            return False
        return _kill_quietly(container)


class SandboxOOM(_SandboxFault):
    """The sandbox's memory filled (its tmpfs, counted against its 128 MB limit): the kernel OOM-kills
    its next command or its verifier; the daemon records `oom` events for the container."""

    name = "OOM inside a sandbox"
    what = "a live attempt's tmpfs filled to its 128 MB limit"

    def unearned(self, trained: dict[str, float | None]) -> set[str]:
        # The memory filled, yet the verifier ran and wrote a reward. A passing reward is the agent's:
        # a full memory makes tests fail, never pass. A failing one may be the memory's doing.
        return {v for v in self.victims & set(trained) if not (trained[v] or 0) > 0}

    def damage(self, run: ChaosRun, node: str, container) -> bool:
        code, output = run.container_exec_output(node, container, FILL_MEMORY)
        if "answered" in output:
            return False
        if code is None or (code == 126 and "OCI runtime exec failed" in output):
            # The daemon refused the exec, or runc could not start it (the container stopping, its attempt
            # done, or its memory already full): this fill filled nothing.
            self.notes.append(f"a fill not run: {' '.join(output.split())[:120]}")
            return False
        # Asked at once: the daemon keeps only its last 256 events, a step's worth of sandboxes.
        oom = run.oom_events(node, container.id, time.time() - 60)
        self.notes.append(f"fill exited {code}" + (" (OOM-killed itself)" if code == 137 else "")
                          + f", daemon oom events {oom}")
        return True


class DockerdStopped(Fault):
    """One node's dockerd stopped (`docker-nodes.sh stop-node`: its containers killed, then TERM), then
    started again `outage_s` later.

    Victims: the run's unscored containers on it at the stop. Detected: the first ledger entry that
    masks a victim. Recovered: the daemon is back and the run has started a new sandbox on it."""

    what = "docker-nodes.sh stop-node, start-node 10 s later"

    def __init__(self, node: str = "n1", outage_s: float = 10.0):
        super().__init__()
        self.node, self.outage_s = node, outage_s
        self.name = f"dockerd of {node} stopped, then started"
        self.started_again: float | None = None
        self.settled: set[str] = set()
        self.fates: dict[str, int] = {}

    def fire(self, run: ChaosRun) -> None:
        deadline = time.time() + 120
        while time.time() < deadline and not [c for n, c in run.containers_newest_first() if n == self.node]:
            time.sleep(0.3)
        on_node = [c for n, c in run.containers_newest_first() if n == self.node]
        self.fired_at = time.time()
        # What stop-node does first (kill the running containers), with each container paused while its
        # files are looked at: a victim is one whose verifier had not written a reward when it was killed.
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            list(pool.map(_pause_quietly, on_node))
            scored = list(pool.map(lambda c: run.has_any_file(self.node, c, SCORE_FILES), on_node))
            list(pool.map(_kill_quietly, on_node))
        self.victims = {c.labels["rl360.attempt"] for c, done in zip(on_node, scored, strict=True) if not done}
        dev_script(DOCKER_NODES, "stop-node", self.node)
        self.notes.append(f"{len(on_node)} sandboxes on {self.node} at the stop, {len(self.victims)} unscored")

    def poll(self, run: ChaosRun) -> None:
        if self.started_again is None and time.time() >= self.fired_at + self.outage_s:
            dev_script(DOCKER_NODES, "start-node", self.node)
            self.started_again = time.time()
        for seen_at, entry in run.ledger_seen():
            for victim in sorted(self.victims - self.settled):
                fate = sample_fate(entry, victim)
                if fate is not None:
                    self.settled.add(victim)
                    self.fates[fate.split(" (")[0]] = self.fates.get(fate.split(" (")[0], 0) + 1
                    if fate.startswith("masked"):
                        self._detected(seen_at)
        if self.started_again is not None and self.recovered_at is None:
            created = run.newest_container_created(self.node)
            if created is not None and created > self.started_again:
                self._recovered()
        if self.recovered_at is not None:
            self.notes.append("victims: " + (", ".join(f"{n} {f}" for f, n in sorted(self.fates.items()))
                                             or "no sandbox was on the node at the stop"))

    def restore(self, run: ChaosRun) -> None:
        dev_script(DOCKER_NODES, "start-node", self.node)


# ----------------------------------------------------------------------------- processes


class _ComponentKilled(Fault):
    """SIGKILL of a component's process, by the pid its state record holds.

    Detected: the health watcher's `dead` event for it. Recovered: it runs again under its record
    (`restarts` counted) and, for an engine, serves the trainer's policy version."""

    cid = ""

    def fire(self, run: ChaosRun) -> None:
        rec = run.doc()["components"][self.cid]
        self.old_pid, self.restarts_before = rec["pid"], rec.get("restarts", 0)
        self.fired_at = time.time()
        os.kill(rec["pid"], signal.SIGKILL)

    def poll(self, run: ChaosRun) -> None:
        for event in run.events_since(self.fired_at):
            if event.get("subject") == self.cid and event.get("outcome") == "dead":
                self._detected(event["_time"])
        doc = run.doc()
        rec = doc["components"].get(self.cid, {})
        if rec.get("restarts", 0) > self.restarts_before and rec.get("status") == "running" and self.back(doc, rec):
            self._recovered()

    def back(self, doc: dict, rec: dict) -> bool:
        return True


class EngineKilled(_ComponentKilled):
    name = "engine killed"
    what = "SIGKILL of rollout/engine-0"
    cid = "rollout/engine-0"

    def back(self, doc: dict, rec: dict) -> bool:
        run = doc["runs"][doc["current_run"]]
        return rec.get("served_version") is not None and rec["served_version"] >= run.get("policy_version", 0)


class RouterKilled(_ComponentKilled):
    name = "router killed"
    what = "SIGKILL of service/router"
    cid = "service/router"


class RolloutSlurmdKilled(Fault):
    """The rollout tier's node lost: `slurm.sh kill-node` SIGKILLs its slurmd and every job step on it
    (the engine, the Ray worker and its session actors).

    Detected: the `requeue` event of the rollout tier (raised by any reconcile: the bench runs
    `rl360 status` every few seconds, as an operator's watch or `rl360 logs --follow` would).
    Recovered: the tier is ready on another node, its engine runs there, and the run has finished a
    step since. The node's slurmd is started again then (`revive-node`). When the run itself failed
    (its session actors were on the lost node's Ray worker), the bench resumes it (`up --resume`), as
    an operator would, and the row is marked: recovered only by hand."""

    name = "rollout node's slurmd killed"
    what = "slurm.sh kill-node on the rollout tier's node"

    def fire(self, run: ChaosRun) -> None:
        doc = run.doc()
        self.node = doc["tiers"]["rollout"]["nodes"][0]
        self.step_before = run.step()
        self.fired_at = time.time()
        dev_script(SLURM, "kill-node", self.node)
        self.revived = False
        self.resumed = False
        self.notes.append(f"node {self.node}")

    def poll(self, run: ChaosRun) -> None:
        run.reconcile(every_s=3.0)
        for event in run.events_since(self.fired_at):
            if event.get("action") == "requeue" and "rollout" in event.get("subject", ""):
                self._detected(event["_time"])
        doc = run.doc()
        tier = doc["tiers"].get("rollout", {})
        engine = doc["components"].get("rollout/engine-0", {})
        record = run.run_record()
        moved = (self.detected_at is not None and tier.get("status") == "ready"
                 and self.node not in tier.get("nodes", []) and engine.get("status") == "running")
        if moved and record.get("status") == "failed" and not self.resumed:
            # The tier came back, but the run did not: its session actors died with the node's Ray worker.
            # What an operator does then (and what this row's recovery time includes): `up --resume`.
            self.notes.append(f"requeued on {','.join(tier['nodes'])}; the run failed "
                              f"({str(record.get('reason'))[:70]}); recovered by `rl360 up --resume`")
            self.ok = False
            up = run.cli("up", "--recipe", str(run.recipe), "--resume", "--detach", timeout=600)
            self.resumed = True
            if up.returncode != 0:
                self.notes.append(f"up --resume exited {up.returncode}: {(up.stderr or up.stdout).strip()[-200:]}")
        if moved and record.get("status") == "running" and run.step() > self.step_before:
            self._recovered()
            if not self.resumed:
                self.notes.append(f"requeued on {','.join(tier['nodes'])}")
            self.restore(run)

    def restore(self, run: ChaosRun) -> None:
        if not getattr(self, "revived", True):
            dev_script(SLURM, "revive-node", self.node)
            self.revived = True


class TrainerKilledThenResumed(Fault):
    """SIGKILL of the trainer process, then `rl360 up --resume --detach` once the run is seen as ended.

    Detected: `rl360 status` no longer reports the run running (its reconcile sees the trainer gone).
    Recovered: the resumed run has trained a step past the last one before the kill."""

    name = "trainer killed, then --resume"
    what = "SIGKILL of training/trainer; rl360 up --resume"

    def fire(self, run: ChaosRun) -> None:
        rec = run.doc()["components"]["training/trainer"]
        self.step_before = run.step()
        self.fired_at = time.time()
        os.kill(rec["pid"], signal.SIGKILL)
        self.resumed = False

    def poll(self, run: ChaosRun) -> None:
        if self.detected_at is None:
            status = run.status_json()
            if status is not None:
                current = status["runs"][status["current_run"]]
                if current["status"] not in ("starting", "running"):
                    self._detected()
                    self.notes.append(f"run {current['status']}: {str(current.get('reason', ''))[:80]}")
        if self.detected_at is not None and not self.resumed:
            up = run.cli("up", "--recipe", str(run.recipe), "--resume", "--detach", timeout=600)
            self.resumed = True
            if up.returncode != 0:
                self.ok = False
                self.notes.append(f"up --resume exited {up.returncode}: {(up.stderr or up.stdout).strip()[-200:]}")
        if self.resumed and run.run_record().get("status") == "running" and run.step() > self.step_before:
            self._recovered()


# ----------------------------------------------------------------------------- the state file


class StateLockHeld(Fault):
    """The state file's lock taken by a process that then stops (SIGSTOP) for `hold_s`, the way a
    writer stuck mid-update would, then killed.

    Detected: a writer that gives up after 2 s names the stuck holder's pid (StateError). Recovered:
    the run writes the state file again after the holder is gone (its next step recorded). Held past
    the run's own 30 s lock timeout by default: the run must go on without recording its steps."""

    def __init__(self, hold_s: float = 45.0):
        super().__init__()
        self.hold_s = hold_s
        self.what = f"flock on state.json.lock by a stopped process, killed after {hold_s:g} s"
        self.name = f"state lock held by a stuck process ({hold_s:g} s)"

    def fire(self, run: ChaosRun) -> None:
        holder = ("import fcntl, os, signal, sys; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644); "
                  "fcntl.flock(fd, fcntl.LOCK_EX); os.ftruncate(fd, 0); "
                  "os.pwrite(fd, f'{os.getpid()} chaos-stuck-writer\\n'.encode(), 0); "
                  "print('held', flush=True); os.kill(os.getpid(), signal.SIGSTOP)")
        self.proc = subprocess.Popen([sys.executable, "-c", holder, str(run.state_path) + ".lock"],
                                     stdout=subprocess.PIPE, text=True)
        self.proc.stdout.readline()
        self.fired_at = time.time()
        self.released_at: float | None = None
        self.step_before = run.step()

    def poll(self, run: ChaosRun) -> None:
        if self.detected_at is None:
            probe = subprocess.run([sys.executable, "-c", PROBE_WRITER, str(run.state_path)], check=False,
                                   capture_output=True, text=True, timeout=60)
            if str(self.proc.pid) in probe.stdout:
                self._detected()
                self.notes.append(probe.stdout.strip()[:160])
        if self.released_at is None and time.time() >= self.fired_at + self.hold_s:
            self.restore(run)
            self.released_at = time.time()
        if self.released_at is not None and run.step() > self.step_before and run.state_updated_after(self.released_at):
            self._recovered()

    def restore(self, run: ChaosRun) -> None:
        proc = getattr(self, "proc", None)
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


# A writer with a 2 s lock timeout: prints the StateError (naming the holder) or "wrote".
PROBE_WRITER = """
import sys
from rl360cli.errors import Rl360Error
from rl360cli.state.store import StateFile
try:
    with StateFile(sys.argv[1], lock_timeout_s=2.0).update():
        pass
    print("wrote")
except Rl360Error as e:
    print(e)
"""


class ConcurrentStatus(Fault):
    """16 `rl360 status --json` at once against the live run.

    Detected: not a failure (—). Recovered: every call has answered, exit 0 with a JSON document,
    and the state file still parses; the time is the slowest call's."""

    what = "16 x rl360 status --json at the same time"

    def __init__(self, count: int = 16):
        super().__init__()
        self.count = count
        self.name = f"{count} concurrent rl360 status"

    def fire(self, run: ChaosRun) -> None:
        self.fired_at = time.time()
        with concurrent.futures.ThreadPoolExecutor(self.count) as pool:
            calls = list(pool.map(lambda _: run.cli("status", "--json", timeout=300), range(self.count)))
        done = time.time()
        # Exit 3 is an answer too: status reporting a failed component or run (the run's end can fall
        # in the middle of these calls); 1 is status itself failing.
        bad = [c for c in calls if c.returncode not in (0, 3) or not _is_json(c.stdout)]
        if bad:
            self.ok = False
            self.notes.append(f"{len(bad)} of {self.count} failed (exit {bad[0].returncode}): "
                              f"{(bad[0].stderr or bad[0].stdout).strip()[-160:]}")
        json.loads(run.state_path.read_text())  # still a whole document
        codes = sorted({c.returncode for c in calls})
        self.notes.append(f"all {self.count} answered (exit {', '.join(map(str, codes))})" if not bad else "")
        self.recovered_at = done

    def poll(self, run: ChaosRun) -> None:
        pass

    def row(self) -> dict:
        out = super().row()
        out["detected_s"] = None
        return out


def _pause_quietly(container) -> None:
    try:
        container.pause()
    except Exception:  # noqa: BLE001 — it ended meanwhile
        pass


def _kill_quietly(container) -> bool:
    """SIGKILL a container the look paused: the signal first (it waits in the frozen cgroup), then the
    thaw, so that no process of it runs in between; also thawed when the kill fails. A paused container
    left behind made stop-node's own `docker kill` hang for good (cgroup v1 freezer). True if killed."""
    killed = True
    try:
        container.kill()
    except Exception:  # noqa: BLE001 — it ended meanwhile
        killed = False
    try:
        container.unpause()
    except Exception:  # noqa: BLE001 — it ended, or was not paused
        pass
    return killed


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
        return True
    except ValueError:
        return False


def dev_script(script: Path, verb: str, node: str) -> None:
    """One per-node fault verb of the dev services (cluster/dev/*.sh); raises when it fails."""
    proc = subprocess.run(["bash", str(script), verb, node], check=False, capture_output=True, text=True, timeout=180)
    if proc.returncode != 0:
        raise RuntimeError(f"{script.name} {verb} {node} exited {proc.returncode}: {proc.stderr.strip()[-300:]}")


# The bench's schedule, in order (names for --faults); each fires after the previous recovered and
# the run has finished one more step.
SCHEDULE = {
    "status": ConcurrentStatus,
    "lock": StateLockHeld,
    "sandbox-kill": SandboxKilled,
    "sandbox-oom": SandboxOOM,
    "dockerd": DockerdStopped,
    "engine": EngineKilled,
    "router": RouterKilled,
    "slurmd": RolloutSlurmdKilled,
    "trainer": TrainerKilledThenResumed,
}
