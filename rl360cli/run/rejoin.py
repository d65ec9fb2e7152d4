"""The trainer's side of an engine restart: leave a dead engine out of the weight syncs, take it back when asked.

    rejoins = EngineRejoins(state=state, run_id=run_id, rejoin=rejoin_at_trainers_version,
                            forget=broadcaster.mark_restarting, log=log)
    rejoins.start()            # a daemon thread reading the run's engine records every `poll_s`
    ...
    rejoins.stop()

The run's control plane (control.py) restarts engines; the trainer holds the weights. The two meet in each
engine's record: an engine the control plane found dead (`failed`), started again (`starting`) or left to its
tier's recovery (`restart`) is left out of the syncs at once (`forget`: no sync waits for it); an engine whose
record asks for a rejoin (`rejoin_requested_at`) is taken back into the weight-update group at the trainer's
version (`rejoin`, run between two train steps), and the version it serves is recorded
(`transitions.record_rejoined`), which the control plane waits for before the router gets the engine back.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from rl360cli.state import queries, transitions
from rl360cli.state.schema import ComponentStatus
from rl360cli.state.store import StateFile

# An engine in one of these is away: the syncs leave it out until it rejoins.
AWAY = frozenset({ComponentStatus.FAILED, ComponentStatus.STARTING, ComponentStatus.UNKNOWN})


@dataclass
class EngineRejoins:
    """See the module docstring. `poll_once()` is one look (tests call it); `start()` looks every `poll_s`."""

    state: StateFile
    run_id: str
    # An engine's URL in; the policy version it serves once back in the weight-update group out.
    rejoin: Callable[[str], int]
    forget: Callable[[str], None]
    log: Callable[[str], None] = print
    poll_s: float = 0.2
    # The engines left out of the syncs, by URL (a moved engine has a new one).
    _away: set[str] = field(default_factory=set)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="rl360-engine-rejoins", daemon=True)
        self._thread.start()

    def stop(self, *, timeout_s: float = 60.0) -> None:
        """Stop after the look under way (a rejoin in progress completes)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)

    def poll_once(self) -> list[str]:
        """Forget the engines that went away, rejoin those asked for; returns the cids rejoined."""
        rejoined = []
        for cid, rec in queries.run_components(self.state.snapshot(), self.run_id).items():
            url = (rec.get("url") or "").rstrip("/")
            if not rec["kind"].startswith("engine") or not url:
                continue
            if (rec["status"] in AWAY or rec.get("restart")) and url not in self._away:
                self.forget(url)
                self._away.add(url)
            if rec.get("rejoin_requested_at") and rec["status"] != ComponentStatus.STOPPED:
                try:
                    version = self.rejoin(url)
                except Exception as e:  # noqa: BLE001 - said to the control plane, which asks again
                    self.log(f"{cid}: not taken back into the weight-update group ({type(e).__name__}: {e})")
                    transitions.record_rejoined(self.state, cid, version=None, error=f"{type(e).__name__}: {e}")
                    continue
                self._away.discard(url)
                transitions.record_rejoined(self.state, cid, version=version)
                self.log(f"{cid}: back in the weight-update group at policy version {version}")
                rejoined.append(cid)
        return rejoined

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.poll_once()
            except Exception as e:  # noqa: BLE001 - the next look tries again (a state file locked for a while)
                self.log(f"engine rejoins: look failed ({type(e).__name__}: {e})")
