"""The state file's schema: statuses, one record type per section, and the shape check a read makes.

`StateDoc` is the document, with one record type per section (`TierRecord`,
`NodeRecord` with its `NodeImage`s, `ComponentRecord` with its `HolderRecord`s, `RunRecord`,
`SandboxRecord`, and `ProfileRecord`); each field says what it holds and, where
only some writers set it, which transition sets it (rl360cli/state/transitions.py).
Statuses are the enums `TierStatus`, `NodeStatus`, `ComponentStatus`,
`RunStatus` and `SandboxStatus` (a docstring per value), with the sets code
tests against beside them (`COMPONENT_FINAL`, `RUN_ACTIVE`, `RUN_FINAL`,
`TIER_FINAL`). The records stay plain dicts at run time (a TypedDict describes a
dict and builds no object), so a 3 MB state parses as fast as the JSON does; a
status enum member equals its string and is written as one.
"""

# No `from __future__ import annotations` here: TypedDicts built from evaluated annotations import in half the
# time (every CLI command imports this module).
import json
from datetime import datetime, timezone
from enum import StrEnum
from types import UnionType
from typing import (Any, Literal, NotRequired, Required, TypedDict, Union, get_args, get_origin, get_type_hints,
                    is_typeddict)

from rl360cli.errors import Rl360Error
from rl360cli.outcome import InfraCause

SCHEMA_VERSION = 3
SECTIONS = ("tiers", "nodes", "components", "runs", "sandboxes")


# ----------------------------------------------------------------------------- statuses


class TierStatus(StrEnum):
    """Where a tier's allocation stands (`tiers[name]["status"]`)."""

    READY = "ready"
    """Its allocation holds its nodes (local: this machine, once provisioned); components may start on it."""
    REQUEUEING = "requeueing"
    """It lost a node; a replacement allocation without that node is submitted and awaited (Slurm,
    backends/slurm_requeue.py)."""
    FAILED = "failed"
    """It lost a node with no requeue left, or its requeue failed; `reason` says which."""
    ENDED = "ended"
    """Its allocation ended for another reason (time limit, cancelled by hand); `reason` names the job's state."""


# A tier in one of these holds no allocation any more: it is never alive again, `rl360 provision` allocates anew.
TIER_FINAL: frozenset[TierStatus] = frozenset({TierStatus.FAILED, TierStatus.ENDED})


class NodeStatus(StrEnum):
    """What became of a node in a requeue (`nodes[name]["status"]`; absent on a node as provisioned)."""

    READY = "ready"
    """It holds its tier's replacement allocation (set by the requeue that brought it in)."""
    LOST = "lost"
    """It was lost (slurmd or its allocation's holder stopped answering) and replaced; kept for the record."""


class ComponentStatus(StrEnum):
    """What a component (an engine, the router, the trainer, a Ray node) is doing, as last observed
    (`components[id]["status"]`; `rl360 status` observes every one not in `COMPONENT_FINAL`)."""

    STARTING = "starting"
    """Launched, and its health URL has not answered yet (or its Slurm job step is still pending)."""
    RUNNING = "running"
    """Its process (every task of its job step) is alive, and its health URL answered if it has one."""
    EXITED = "exited"
    """It ended by itself with exit code 0 (every task of its step, on Slurm)."""
    FAILED = "failed"
    """It ended with another exit code or a signal, vanished, lost its node, or ended before it was ready;
    `reason` says which, and `cause` is `node_lost` for a lost node."""
    STOPPED = "stopped"
    """rl360 stopped it (`rl360 down`, or the end of its run)."""
    UNKNOWN = "unknown"
    """Its fate cannot be told now (Slurm did not answer, not healthy in time, its supervisor is still writing
    the exit code); never taken for an end: the next observation looks again."""


# A component in one of these will never run again: it is observed no more, and counts as no load.
COMPONENT_FINAL: frozenset[ComponentStatus] = frozenset(
    {ComponentStatus.EXITED, ComponentStatus.FAILED, ComponentStatus.STOPPED})


class RunStatus(StrEnum):
    """Where a training run stands (`runs[id]["status"]`)."""

    STARTING = "starting"
    """Created (or reopened with --resume) by `rl360 up` / `rl360 serve`; its trainer has not started the loop."""
    RUNNING = "running"
    """Its trainer runs the loop (run/driver.py), or restarts after a lost node to resume it (Slurm requeue)."""
    FINISHED = "finished"
    """Its trainer ran the last step, or its trainer component exited 0 without saying so (`rl360 status`)."""
    FAILED = "failed"
    """Its trainer raised, or its trainer component failed without saying so; `reason` says why."""
    STOPPED = "stopped"
    """`rl360 down` stopped it before it ended."""


# A run in one of these is under way: no other run starts beside it (`rl360 serve` joins it), `rl360 down` stops it.
RUN_ACTIVE: frozenset[RunStatus] = frozenset({RunStatus.STARTING, RunStatus.RUNNING})
# A run in one of these has ended: `rl360 up`'s watch and `rl360 logs --follow` stop there (logview.FINAL_RUN
# maps each to the command's exit code).
RUN_FINAL: frozenset[RunStatus] = frozenset({RunStatus.FINISHED, RunStatus.FAILED, RunStatus.STOPPED})


class SandboxStatus(StrEnum):
    """What a recorded sandbox (a fleet member) is doing, as `rl360 sandboxes list` last checked
    (`sandboxes[id]["status"]`)."""

    RUNNING = "running"
    """Its container runs (docker), or its keeper process is alive (process)."""
    EXITED = "exited"
    """Its container stopped, or its keeper process ended and its folder is still there."""
    MISSING = "missing"
    """Its daemon no longer has its container, or its folder is gone."""
    UNKNOWN = "unknown"
    """Its daemon did not answer, or the record names neither a daemon nor a process to ask."""


# ----------------------------------------------------------------------------- records


class ProfileRecord(TypedDict):
    """`profile`: the cluster profile the tiers were provisioned with (stages/provision.py)."""

    name: str
    path: str  # the profile file, absolute
    backend: Literal["local", "slurm"]


class TierResources(TypedDict):
    """What each node of a tier gives it."""

    cpus: float | None  # local: the tier's share of this machine (or its cpu_list's length); Slurm: per node
    memory_mb: int | None
    gpus: int
    cpu_list: NotRequired[list[int]]  # local: the CPUs the tier is pinned to ([]: none)


class PendingAllocation(TypedDict):
    """A submitted allocation a requeue waits for (backends/slurm.py `submit_group`)."""

    group: list[str]  # the tiers it holds (one, or every tier of a het job); a tuple until written
    job_id: str  # the job (a het job's leader)
    script: str  # the sbatch script it was submitted with
    submitted_at: float  # time.time()
    het: bool
    exclude: list[str]  # the nodes it must not get


class TierRecord(TypedDict):
    """`tiers[name]`: one tier's allocation (backends/local.py or backends/slurm.py `provision`)."""

    kind: str  # the tier's name: service | training | rollout
    backend: Literal["local", "slurm"]
    status: TierStatus
    nodes: list[str]  # the nodes it holds (local: ["local"])
    resources: TierResources
    # Slurm only (backends/slurm.py `_tier_record`): the allocation.
    mode: NotRequired[Literal["per-tier", "hetjob"]]
    job_id: NotRequired[str]
    het_leader: NotRequired[str | None]  # the het job's leader id (None: a job of its own)
    het_group: NotRequired[int | None]  # its index among the het job's components
    partition: NotRequired[str]
    script: NotRequired[str]  # the sbatch script
    holder_log: NotRequired[str]  # the allocation holder's log
    submitted_at: NotRequired[str]
    requeues: NotRequired[int]  # requeues used so far (of the profile's max_requeues)
    lost_nodes: NotRequired[list[str]]  # nodes lost so far, excluded from every new allocation
    # Slurm requeue (backends/slurm_requeue.py).
    reason: NotRequired[str | None]  # why it failed or ended
    requeued_at: NotRequired[str]
    replaced_nodes: NotRequired[list[str]]  # its nodes before the requeue, in order
    # The new nodes a requeue brought, waiting for the prewarm the replaced ones had (None: none waits).
    prewarm_pending: NotRequired[list[str] | None]
    pending: NotRequired[PendingAllocation | None]  # the replacement allocation, until it holds its nodes
    previous_job_ids: NotRequired[list[str]]  # allocations it had before (`rl360 down` cancels them too)


class NodeImage(TypedDict, total=False):
    """`nodes[name]["images"][ref]`: what the node's image cache holds for one fully qualified tag reference
    (images/cache.py `set_pulled` / `set_found`, from `rl360 prewarm-images`). Every field but `digest` is
    missing on an entry migrated from version 1's bare digest."""

    digest: Required[str]  # the manifest digest the tag points at on the node
    size: int | None  # bytes on disk
    pulled_at: str | None  # when it was pulled (or first seen tagged on the node)
    seconds: float  # how long the pull took (0 for one found on the node)
    started_at: str | None  # when the pull began (None for one found)
    attempts: int  # pull attempts (0 for one found)
    image_id: str | None
    source: Literal["prewarm", "found"]  # pulled by rl360, or already on the node
    superseded: list[str]  # digests this ref held before that are still on the node's disk


class NodePrewarm(TypedDict):
    """`nodes[name]["prewarm"]`: how the node's last prewarm went (stages/prewarm_images.py)."""

    status: Literal["ok", "failed"]
    reason: str | None
    at: str


class NodeRecord(TypedDict):
    """`nodes[name]`: one machine (the provisioning backend, or images/cache.py `node_record` for a node
    of the profile that `rl360 prewarm-images` reaches before any provision)."""

    address: str  # where its services are reached
    tier: str  # the tier it belongs to (local: "all")
    cpus: float
    memory_mb: int
    images: dict[str, NodeImage]  # its image cache: fully qualified tag reference -> what it holds
    reserved_cpus: NotRequired[float]  # what its tiers reserve (set by the provisioning backend)
    reserved_memory_mb: NotRequired[int]
    gpus: NotRequired[int]  # Slurm
    status: NotRequired[NodeStatus]  # set by a Slurm requeue; absent on a node as provisioned
    docker_host: NotRequired[str]  # its Docker daemon (images/cache.py, from the profile's [[nodes]])
    disk_budget_gb: NotRequired[float | None]  # images/cache.py, from the profile
    prewarm: NotRequired[NodePrewarm]


class HolderRecord(TypedDict):
    """`components[id]["holders"][i]`: a command that uses the component while it runs (stages/egress.py
    `for_one_command`, through transitions.hold_component)."""

    pid: int
    start_time: int | None  # the pid's start time, so a reused pid is never taken for it
    command: str  # what it is, for people: "rl360 tasks check"
    since: str


class ComponentRecord(TypedDict):
    """`components[tier/name]`: one long-running process: the backend's launch record (pid or job step),
    completed by stages/base.py `start_component`, its status kept by `rl360 status`."""

    backend: Literal["local", "slurm"]
    node: str  # where it runs (Slurm: its first node)
    pid: int | None  # the component's own process (the supervisor's child; Slurm: on its first node)
    start_time: int | None  # the pid's start time, so a reused pid is never taken for it
    status_path: str  # the supervisor's status file (its exit code once it ends)
    log_path: str
    command: list[str]  # its argv
    stage: str  # the stage that started it: serve | train
    tier: str
    name: str
    kind: str  # engine-local | engine-sglang | router | trainer | ray-head | ray-worker | ...
    run: str | None  # the run it belongs to (None: the cluster's)
    ports: dict[str, int]
    url: str | None  # where clients reach it, if it serves
    health_url: str | None
    started_at: str
    status: ComponentStatus
    exit_code: int | None
    reason: str | None  # why it failed, or why its status is unknown (for people: code reads `cause`)
    # Why it failed, where rl360 acts on it: `node_lost` (its node was lost: its tier's recovery restarts it).
    # Set with the status by what observed it (transitions.record_observations, recovery.py); None otherwise.
    cause: NotRequired[InfraCause | None]
    # Local only (backends/local.py): the supervisor and the process group.
    supervisor_pid: NotRequired[int]
    supervisor_start_time: NotRequired[int | None]
    pgid: NotRequired[int]
    # Slurm only (backends/slurm.py `start_step`): the job step.
    nodes: NotRequired[list[str]]  # every node of the step
    num_tasks: NotRequired[int]
    job_id: NotRequired[str]
    het_leader: NotRequired[str | None]
    het_group: NotRequired[int | None]
    step: NotRequired[str]  # the step id
    step_key: NotRequired[str]  # `job_id.step`, what scancel and sacct take
    srun_pid: NotRequired[int]
    srun_start_time: NotRequired[int | None]
    step_path: NotRequired[str]
    srun_log: NotRequired[str]
    env: NotRequired[dict[str, str]]
    requested_node: NotRequired[str | None]
    launched_at: NotRequired[float]  # time.time()
    restarts: NotRequired[int]  # times it was started again (transitions.record_restart)
    restarted_at: NotRequired[str]
    restart_reason: NotRequired[str]  # why it was started again (the death the control plane saw)
    # The policy version it serves, once back in the weight-update group after a restart (None until then).
    served_version: NotRequired[int | None]
    # The control plane asks the trainer to take a restarted engine back into the weight-update group
    # (transitions.request_rejoin); the trainer answers (record_rejoined), or says why it could not.
    rejoin_requested_at: NotRequired[str | None]
    rejoin_error: NotRequired[str | None]
    restart: NotRequired[bool]  # to be restarted once its tier's replacement allocation holds its nodes
    # The commands using it while they run (the machine's egress proxy: transitions.hold_component); a dead one
    # counts for nothing.
    holders: NotRequired[list[HolderRecord]]
    # True: it was started for the commands that hold it, and the last of them to leave stops it. Absent or
    # False: the cluster's (`rl360 up` started or took it), kept until `rl360 down`.
    for_commands: NotRequired[bool]


class RunRecord(TypedDict):
    """`runs[id]`: one training run (stages/lifecycle.py `start_run`), kept current by its trainer
    (run/driver.py) and by `rl360 status` / `rl360 down`."""

    name: str  # the recipe's run name
    recipe: str  # the recipe file it was started from
    run_dir: str
    metrics_path: str
    started_at: str
    num_steps: int
    step: int  # the last step done
    policy_version: int
    status: RunStatus
    resumed: bool  # reopened with --resume
    calibrate: NotRequired[int]  # a calibration run (`rl360 tasks calibrate`): samples per task, nothing trained
    overrides: NotRequired[list[str]]  # the `--set` overrides as typed, `--inject-failures` among them (stages/lifecycle.py)
    pid: NotRequired[int]  # the trainer's driver process (run/driver.py)
    reward_mean: NotRequired[float | None]  # of the last step (run/driver.py)
    ended_at: NotRequired[str]  # run/driver.py
    engine_versions: NotRequired[dict[str, int | None]]  # policy version each engine serves at the end
    reason: NotRequired[str | None]  # why it failed (or why it runs again after a lost node), for people
    # Why it failed, where rl360 acts on it: `node_lost` (its trainer's node was lost: a requeue of its tier
    # resumes it, recovery.begin_requeue). None for any other end.
    cause: NotRequired[InfraCause | None]
    # It runs again after this loss (its trainer restarts with --resume on the requeued tier): set by
    # recovery.begin_requeue, cleared when the run ends; a tier that cannot recover fails such a run.
    resume_after: NotRequired[InfraCause | None]


class SandboxRecord(TypedDict):
    """`sandboxes[id]`: one fleet sandbox left running by `rl360 sandboxes launch` (stages/sandboxes.py): the
    provider's `info()` plus the launch's fields; `rl360 down` and `rl360 sandboxes stop` remove it."""

    run: str  # the fleet's run id (also the container's `rl360.run` label)
    node: str
    provider: Literal["process", "docker"]
    task: str
    attempt: str
    image: str
    container_id: str | None  # docker
    pid: int | None  # process: the keeper that holds it (docker: None)
    status: SandboxStatus
    started_at: str
    start_latency_s: float
    queued_s: float  # seconds it waited for admission
    warm: NotRequired[bool]  # its node's cache held the image (the admission controller, the docker provider)
    # Docker only (sandbox/docker/provider.py).
    name: NotRequired[str]
    image_id: NotRequired[str | None]
    docker_host: NotRequired[str]
    network: NotRequired[str | None]
    network_denied: NotRequired[bool]
    # Process only (sandbox/process/provider.py).
    folder: NotRequired[str]
    uid: NotRequired[int | None]
    pid_start: NotRequired[int | None]


class PrewarmImage(TypedDict):
    """`prewarm["images"][name]`: where the last prewarm pinned one image of the list."""

    ref: str
    digest: str
    nodes: list[str]
    rule: str
    size: int
    capacity: int


class PrewarmRecord(TypedDict):
    """`prewarm`: the last `rl360 prewarm-images` (stages/prewarm_images.py)."""

    at: str
    images_file: str
    wave_size: int
    images: dict[str, PrewarmImage]
    failed_nodes: dict[str, str]  # node -> why


class StateDoc(TypedDict):
    """The whole document."""

    schema_version: int
    created_at: str
    updated_at: str  # set by every write
    profile: ProfileRecord | None  # None until the first provision
    current_run: NotRequired[str | None]  # the run commands act on by default (stages/lifecycle.py `start_run`)
    tiers: dict[str, TierRecord]
    nodes: dict[str, NodeRecord]
    components: dict[str, ComponentRecord]  # by `tier/name`
    runs: dict[str, RunRecord]
    sandboxes: dict[str, SandboxRecord]
    prewarm: NotRequired[PrewarmRecord]  # stages/prewarm_images.py


class StateError(Rl360Error):
    """The state file cannot be used as it is."""


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def empty_state() -> StateDoc:
    stamp = now_iso()
    return {"schema_version": SCHEMA_VERSION, "created_at": stamp, "updated_at": stamp, "profile": None,
            "tiers": {}, "nodes": {}, "components": {}, "runs": {}, "sandboxes": {}}



def _runtime_types(annotation: Any) -> tuple[type, ...]:
    """The JSON types a field annotated `annotation` may hold (a TypedDict or dict[...] is an object,
    a status enum or Literal of strings a string); empty for one that is not checked."""
    origin = get_origin(annotation)
    if origin in (Required, NotRequired):
        return _runtime_types(get_args(annotation)[0])
    if origin in (Union, UnionType):
        return tuple(t for arg in get_args(annotation) for t in _runtime_types(arg))
    if origin is Literal:
        return tuple({type(arg) for arg in get_args(annotation)})
    if annotation is type(None):
        return (type(None),)
    if annotation is float:
        return (float, int)
    if origin in (list, tuple) or annotation in (list, tuple):
        return (list,)
    if origin is dict or annotation is dict or is_typeddict(annotation):
        return (dict,)
    if isinstance(annotation, type) and issubclass(annotation, (str, int, bool)):
        return (str,) if issubclass(annotation, str) else (annotation,)
    return ()


_KINDS = {str: "a string", int: "an integer", float: "a number", bool: "a boolean", list: "a list",
          dict: "an object", type(None): "null"}
# Section -> its record type; the fields of each, with the JSON types they may hold (built on first use).
_SECTION_RECORDS: dict[str, Any] = {}
_FIELD_TYPES: dict[Any, dict[str, frozenset[type]]] = {}
_ANY_JSON = frozenset({type(None), str, int, float, bool, list, dict})


def json_field_types(record_type: Any) -> dict[str, frozenset[type]]:
    """Field of `record_type` (one of the TypedDicts above) -> the exact types the JSON parser makes
    that the field may hold (what `StateFile.read` checks; tests/fuzz/test_fuzz_state.py draws others)."""
    if record_type not in _FIELD_TYPES:
        hints = get_type_hints(record_type, include_extras=True)
        _FIELD_TYPES[record_type] = {name: frozenset(types) for name, hint in hints.items()
                                     if (types := _runtime_types(hint))}
    return _FIELD_TYPES[record_type]


def _expected(types: frozenset[type]) -> str:
    return " or ".join(_KINDS[t] for t in sorted(types, key=list(_KINDS).index) if not (t is int and float in types))


def shape_problem(doc: dict[str, Any]) -> str | None:
    """The first record or field of `doc` whose JSON type its TypedDict does not allow, said in one
    line (None when every one fits). Fields not in the schema and missing fields are left alone:
    writers add fields as they go, and one check per present field keeps a 3 MB state quick."""
    if not _SECTION_RECORDS:
        _SECTION_RECORDS.update(tiers=TierRecord, nodes=NodeRecord, components=ComponentRecord, runs=RunRecord,
                                sandboxes=SandboxRecord)
    # Exact types (`type(v) in allowed`), not isinstance: as fast as it gets over 8,192 sandboxes, and
    # JSON's true is no integer here.
    top = json_field_types(StateDoc)
    for name, value in doc.items():
        allowed = top.get(name)
        if allowed and type(value) not in allowed:
            return f"'{name}' must be {_expected(allowed)} (got {_shown(value)})"
    checks = [("profile", {"": doc["profile"]}, ProfileRecord)] if doc["profile"] is not None else []
    checks += [(section, doc[section], _SECTION_RECORDS[section]) for section in _SECTION_RECORDS]
    for section, records, record_type in checks:
        fields = json_field_types(record_type)
        for key, record in records.items():
            if type(record) is not dict:
                return f"{section}[{key!r}] must be an object (got {_shown(record)})"
            for name, value in record.items():
                if type(value) not in fields.get(name, _ANY_JSON):
                    where = f"{section}[{key!r}]" if key else section
                    return f"{where}.{name} must be {_expected(fields[name])} (got {_shown(value)})"
    return None


def _shown(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."
