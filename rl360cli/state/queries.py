"""Typed reads of a state document: everyone outside the state package looks records up here.

    doc = state.snapshot()
    run = queries.run(doc, run_id)               # a RunRecord or None
    for cid, rec in queries.live_components(doc, run=run_id).items(): ...

Each accessor names what it returns; none changes the document (writes are the
named transitions of rl360cli/state/transitions.py). A record handed out here
belongs to the document it was read from: read it, never change it.
"""

from collections.abc import Mapping
from typing import TypeVar

from rl360cli import procinfo
from rl360cli.state.schema import (COMPONENT_FINAL, RUN_ACTIVE, ComponentRecord, HolderRecord, NodeImage,
                                   NodeRecord, PrewarmRecord, ProfileRecord, RunRecord, RunStatus, SandboxRecord,
                                   StateDoc, TierRecord)

# ----------------------------------------------------------------------------- the cluster


def profile(doc: StateDoc) -> ProfileRecord | None:
    """The profile the tiers were provisioned with (None before the first provision)."""
    return doc["profile"]


def profile_path(doc: StateDoc) -> str | None:
    """The profile file the cluster was provisioned with (None before the first provision)."""
    recorded = doc["profile"]
    return recorded["path"] if recorded else None


def tiers(doc: StateDoc) -> dict[str, TierRecord]:
    return doc["tiers"]


def tier(doc: StateDoc, name: str) -> TierRecord | None:
    return doc["tiers"].get(name)


def tier_nodes(doc: StateDoc, name: str) -> list[str]:
    """The nodes tier `name` holds (empty when it is not provisioned)."""
    found = doc["tiers"].get(name)
    return list(found["nodes"]) if found else []


def prewarm_pending(doc: StateDoc) -> list[str]:
    """The nodes a requeue brought that wait for their prewarm (each tier's `prewarm_pending`), in tier order."""
    return [n for t in doc["tiers"].values() for n in t.get("prewarm_pending") or []]


def nodes(doc: StateDoc) -> dict[str, NodeRecord]:
    return doc["nodes"]


def node_address(doc: StateDoc, node: str) -> str:
    """The node's recorded address (its name when the state does not know it)."""
    return (doc["nodes"].get(node) or {}).get("address") or node


def node_images(doc: StateDoc, node: str) -> dict[str, NodeImage]:
    """The image cache recorded for `node` (empty when the state does not know the node)."""
    rec = doc["nodes"].get(node)
    return rec.get("images", {}) if rec else {}


def image_digests(doc: StateDoc) -> dict[str, dict[str, str | None]]:
    """`{node: {image_ref: digest}}` of every node's recorded image cache."""
    return {name: {ref: entry["digest"] for ref, entry in node_images(doc, name).items()} for name in doc["nodes"]}


def prewarm(doc: StateDoc) -> PrewarmRecord | None:
    """The last `rl360 prewarm-images`, if any."""
    return doc.get("prewarm")


def expected_digests(doc: StateDoc) -> dict[str, str]:
    """`{ref: digest}` the last prewarm resolved: a node whose record for `ref` holds another digest is stale."""
    last = doc.get("prewarm")
    return {entry["ref"]: entry["digest"] for entry in last["images"].values()} if last else {}


def sandboxes(doc: StateDoc) -> dict[str, SandboxRecord]:
    return doc["sandboxes"]


# ----------------------------------------------------------------------------- components


def components(doc: StateDoc) -> dict[str, ComponentRecord]:
    return doc["components"]


def component(doc: StateDoc, cid: str) -> ComponentRecord | None:
    return doc["components"].get(cid)


Generation = tuple[str | None, int]


def generation(rec: ComponentRecord) -> Generation:
    """Which start of component `rec` its record describes: a restart (by the control plane, the tier's
    requeue or by hand) writes a new one. A writer that acts on what it read compares it under the state lock,
    so that it never writes over a newer start (`transitions`' `of_generation`)."""
    return rec.get("started_at"), int(rec.get("restarts") or 0)


def components_of_kind(doc: StateDoc, kind: str) -> dict[str, ComponentRecord]:
    """Every component of `kind` ("egress": the sandboxes' egress proxies, one per node), live or not."""
    return {cid: rec for cid, rec in doc["components"].items() if rec["kind"] == kind}


def live_holders(rec: ComponentRecord) -> list[HolderRecord]:
    """The commands using component `rec` while they run (transitions.hold_component) whose process still runs:
    one that died without leaving counts for nothing."""
    return [h for h in rec.get("holders") or [] if procinfo.is_alive(h["pid"], h["start_time"])]


def run_components(doc: StateDoc, run_id: str) -> dict[str, ComponentRecord]:
    """Every component of run `run_id`, live or not."""
    return {cid: rec for cid, rec in doc["components"].items() if rec["run"] == run_id}


def live_components(doc: StateDoc, *, run: str | None = None) -> dict[str, ComponentRecord]:
    """The components that may still run (their status is not in `COMPONENT_FINAL`); only those of `run`
    when it is given."""
    return {cid: rec for cid, rec in doc["components"].items()
            if rec["status"] not in COMPONENT_FINAL and (run is None or rec["run"] == run)}


def run_router(doc: StateDoc, run_id: str | None) -> ComponentRecord | None:
    """The router of run `run_id`, live or not."""
    return next((rec for rec in doc["components"].values()
                 if rec["kind"] == "router" and rec["run"] == run_id and rec.get("url")), None)


Managed = TypeVar("Managed", ComponentRecord, TierRecord)


def by_backend(records: Mapping[str, Managed]) -> dict[str, dict[str, Managed]]:
    """`records` (components or tiers) grouped by the backend that manages them, each group in their order."""
    grouped: dict[str, dict[str, Managed]] = {}
    for key, rec in records.items():
        grouped.setdefault(rec["backend"], {})[key] = rec
    return grouped


# ----------------------------------------------------------------------------- runs


def runs(doc: StateDoc) -> dict[str, RunRecord]:
    return doc["runs"]


def run(doc: StateDoc, run_id: str | None) -> RunRecord | None:
    return doc["runs"].get(run_id or "")


def current_run_id(doc: StateDoc) -> str | None:
    """The run commands act on by default (the last one `rl360 up` started)."""
    return doc.get("current_run")


def component_run(doc: StateDoc, rec: ComponentRecord) -> RunRecord | None:
    """The run the component belongs to, if it belongs to one the state still has."""
    return doc["runs"].get(rec["run"] or "")


def active_runs(doc: StateDoc) -> dict[str, RunRecord]:
    """The runs under way (`RUN_ACTIVE`)."""
    return {rid: rec for rid, rec in doc["runs"].items() if rec["status"] in RUN_ACTIVE}


def run_was_stopped(doc: StateDoc, run_id: str | None) -> bool:
    """True when `rl360 down` stopped the run."""
    found = doc["runs"].get(run_id or "")
    return found is not None and found["status"] == RunStatus.STOPPED


def last_run_of(doc: StateDoc, name: str) -> str | None:
    """The id of the latest training run of recipe `name` (None when there is none): calibration runs
    (`rl360 tasks calibrate`) train nothing and are never resumed."""
    started = [(rec["started_at"], rid) for rid, rec in doc["runs"].items()
               if rec["name"] == name and not rec.get("calibrate")]
    return max(started)[1] if started else None
