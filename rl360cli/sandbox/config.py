"""Configuration of the sandbox layer: which provider, what each sandbox reserves, how starts are admitted.

It is a recipe's `[sandbox]` table. Imports nothing heavy (the CLI loads recipes).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from rl360cli.configload import check_at_least, check_non_negative, check_one_of, check_positive, check_range


@dataclass(frozen=True, kw_only=True, slots=True)
class SimulatedSandboxConfig:
    """`[sandbox.simulated]`: the stand-in cluster of `provider = "simulated"` (rl360cli/sandbox/simulated.py).

    Latencies are drawn as the recipe sets them; failures fire at the set rates, each drawn from
    (seed, attempt, operation) so a run is reproducible.
    """

    # Rollout nodes and what each offers sandboxes (the default: a 2 x 112-core, 2 TiB 8-GPU node).
    num_nodes: int = 24
    node_cpus: float = 224.0
    node_memory_mb: int = 2_097_152
    # Every task image is this big; a cold start pulls it from a registry of this bandwidth (MB/s),
    # shared evenly by the pulls in flight, at most `max_concurrent_pulls` of them at once.
    image_size_mb: float = 2048.0
    registry_bandwidth_mb_s: float = 1250.0
    max_concurrent_pulls: int = 8
    # Node caches start holding every task image (a prewarmed fleet) instead of empty.
    prewarmed: bool = False
    # Creating and starting a sandbox once its image is on the node, and removing it.
    start_latency_s: float = 0.5
    stop_latency_s: float = 0.05
    # Each agent command's latency: lognormal with this median and p99 / median ratio. The verifier's
    # run (tests/test.sh) takes `verifier_latency_s`: a task's tests are short, and drawing them from
    # the agent's heavy tail would time many out (an infra failure, timeout_infra).
    exec_median_s: float = 0.5
    exec_p99_ratio: float = 10.0
    verifier_latency_s: float = 0.5
    # The simulated verifier's reward is 1 with this probability, else 0.
    pass_rate: float = 0.5
    # Failure rates, by cause: per start (sandbox_start, timeout_infra), per cold pull (image_pull),
    # per verifier run (oom_killed) and per command (node_lost).
    start_failure_rate: float = 0.0
    start_timeout_rate: float = 0.0
    pull_failure_rate: float = 0.0
    oom_rate: float = 0.0
    node_lost_rate: float = 0.0
    seed: int = 0
    # Where each provider writes its ledger (pulls in flight, per-node peak reservations, failures
    # by cause) when it closes; "" writes none.
    ledger_dir: str = ""

    def __post_init__(self) -> None:
        check_at_least(self, 1, "num_nodes", "node_memory_mb", "max_concurrent_pulls")
        check_positive(self, "node_cpus", "registry_bandwidth_mb_s", "exec_median_s")
        check_non_negative(self, "image_size_mb", "start_latency_s", "stop_latency_s", "verifier_latency_s")
        check_at_least(self, 1, "exec_p99_ratio", fix="the p99 is never below the median")
        check_range(self, 0, 1, "pass_rate", "start_failure_rate", "start_timeout_rate", "pull_failure_rate",
                    "oom_rate", "node_lost_rate")
        if self.start_failure_rate + self.start_timeout_rate > 1.0:
            raise ValueError("simulated.start_failure_rate + start_timeout_rate must not exceed 1")


@dataclass(frozen=True, kw_only=True, slots=True)
class WarmPoolConfig:
    """`[sandbox.warm_pool]`: idle sandboxes kept started ahead of demand (rl360cli/sandbox/docker/warm_pool.py).

    Each node keeps up to `size` per task image and reservation, within what the node's reservation
    leaves free and, over all nodes, no more of a task than the step's sessions of it still to start;
    a start takes one (a lookup) and the pool refills behind it. Used by the docker provider; 0 turns
    it off.
    """

    size: int = 2

    def __post_init__(self) -> None:
        check_non_negative(self, "size", fix="0 turns the pool off")


@dataclass(frozen=True, kw_only=True, slots=True)
class DaytonaSandboxConfig:
    """`[sandbox.daytona]`: sandboxes on Daytona's service, `provider = "daytona"` (daytona/provider.py).

    The API key is never in a recipe: the SDK reads `DAYTONA_API_KEY` from the environment.
    """

    # "" takes $DAYTONA_API_URL, else the SDK's default (Daytona's cloud).
    api_url: str = ""
    # The region sandboxes and snapshots are made in; "" takes $DAYTONA_TARGET, else the organisation's default.
    target: str = ""
    # The user commands run as (Harbor tasks expect root: they install packages and write /tests, /logs).
    user: str = "root"
    # Start from a snapshot per image and reservation (made by `DaytonaProvider.prewarm_snapshots`) rather
    # than building from the image each time: Daytona's equivalent of a node's image cache.
    use_snapshots: bool = True
    # What the organisation's quota allows live sandboxes at once: the admission controller's one "node".
    quota_cpus: float = 64.0
    quota_memory_mb: int = 131_072
    # Daytona stops a sandbox idle this long and deletes a stopped one at once: what a crashed orchestrator
    # left behind goes away on its own (the janitor's label sweep removes it sooner).
    auto_stop_minutes: int = 30

    def __post_init__(self) -> None:
        if self.api_url and not self.api_url.startswith(("http://", "https://")):
            raise ValueError(f"daytona.api_url must start with http:// or https:// (got {self.api_url!r})")
        check_positive(self, "quota_cpus", "quota_memory_mb")
        check_at_least(self, 1, "auto_stop_minutes", fix="0 would keep orphaned sandboxes forever")


@dataclass(frozen=True, kw_only=True, slots=True)
class SandboxConfig:
    # `simulated`: a stand-in cluster with no processes at all ([sandbox.simulated]), for scale runs.
    # `daytona`: sandboxes on Daytona's service ([sandbox.daytona]; needs DAYTONA_API_KEY).
    provider: Literal["process", "docker", "simulated", "daytona"] = "process"
    # Per-sandbox reservation; None takes the task's own [environment] cpus / memory_mb.
    cpus: float | None = None
    memory_mb: int | None = None
    pids_limit: int = 256
    # Admission waves: at most `max_concurrent` live sandboxes, `wave_size` starts every `wave_interval_s`.
    max_concurrent: int = 64
    wave_size: int = 16
    wave_interval_s: float = 0.5
    adaptive_waves: bool = False
    # Adaptive waves grow up to this size (or wave_size, if larger) while the median start latency stays
    # under the target and no start fails, and halve (down to 1) when a start fails or the median latency
    # exceeds twice the target.
    max_wave_size: int = 64
    target_start_latency_s: float = 2.0
    # Infra failures are retried (on another node where there is one) at most this many times.
    max_infra_retries: int = 1
    # Wait before retry k (k = 0, 1, ...): retry_backoff_s * 2**k.
    retry_backoff_s: float = 0.5
    # A node whose daemon stopped answering gets no new sandbox for this long.
    node_down_s: float = 30.0
    # Wall-clock limit of one agent command inside the sandbox.
    exec_timeout_s: float = 30.0
    # Limit of creating and starting one sandbox, after its image is on the node (pulls and builds have
    # their own: pull_timeout_s, and the task's build_timeout_sec).
    start_timeout_s: float = 60.0
    pull_timeout_s: float = 600.0
    # Docker on each rollout node's own daemon (`[sandbox] docker_host`): a container of the run still there this
    # long past its session's deadline (its `rl360.deadline` label) is removed by its node's reaper (every session
    # actor on the node runs one, every `reap_every_s`), also when the actor that started it died.
    reap_grace_s: float = 300.0
    reap_every_s: float = 30.0
    # "task": a task that wants the internet (Harbor's rule) goes where the profile's [egress] lets it;
    # "none": no sandbox gets a network, whatever [egress] says.
    network: Literal["task", "none"] = "task"
    # Docker: false (the default), every container's root is writable, as Harbor's images expect (their
    # setup and verifiers run `apt-get` as root). true, a hardening: a read-only root for sandboxes without
    # a network, the workdir, /tests, /logs and /solution being volumes and /tmp, /run tmpfs (a task with a
    # network, or whose workdir or artifacts lie elsewhere, keeps a writable one).
    # (A process sandbox's root is always read-only: it is the host's /usr, bound read-only.)
    read_only_root: bool = False
    # Docker: false (the default, Harbor's rule), what the agent left running is alive while the verifier
    # runs (a server, a database, a supervisor the tests query) and ends once test.sh has exited, before
    # the reward is read. true (a hardening for task sets none of whose tasks leave a service behind): it
    # is killed before the verifier, so no leftover process can rewrite the reward while the tests run
    # (docs/sandboxes.md, "The attempt"). A process sandbox keeps nothing between commands unless
    # process_namespace = "sandbox", whose keeper follows the same two rules.
    end_agent_before_verifier: bool = False
    # Harbor's `--force-build`: a task whose `docker_image` has the Dockerfile it was built from beside it
    # (environment/Dockerfile) is built from that Dockerfile, once per node, under the same content-hash tag
    # as any Dockerfile task, instead of pulled (`rl360 tasks check --force-build` sets it for a check).
    force_build: bool = False
    # Largest file a sandbox may write (RLIMIT_FSIZE / the fsize ulimit), capped by the task's storage_mb.
    max_file_mb: int = 1024
    max_open_files: int = 1024
    # An exec's output is kept up to this many characters (head and tail; the middle is cut).
    max_output_chars: int = 65536
    # Fault injection: this fraction of sandbox starts and execs fail with an infra cause.
    inject_failure_rate: float = 0.0
    # Which starts and execs fail is a function of (seed, attempt id, operation): reproducible.
    inject_seed: int = 0
    # Process provider: where sandbox folders live ("": /dev/shm/rl360-sandboxes where /dev/shm is a
    # roomy tmpfs, else $TMPDIR/rl360-sandboxes; rl360cli/sandbox/process/provider.py: default_root), and the first of the
    # uids sandboxes run as when rl360 runs as root (one uid per live sandbox, so process limits are
    # per sandbox).
    process_root: str = ""
    process_uid_base: int = 200000
    # Process provider: what a command's namespaces (pid, mount, network, IPC) belong to. "command": each
    # command gets its own, which end with it, so nothing it leaves running outlives it. "sandbox": one keeper
    # process per sandbox (as root, with bubblewrap; elsewhere "command" is used, with a warning) whose
    # namespaces every command joins, so what an agent's command leaves running lives until the sandbox stops,
    # as in a container (Harbor's rule: alive while the verifier runs); it saves a bubblewrap start per
    # command (rl360cli/sandbox/process/keeper.py, docs/sandboxes.md).
    process_namespace: Literal["command", "sandbox"] = "command"
    simulated: SimulatedSandboxConfig = field(default_factory=SimulatedSandboxConfig)
    warm_pool: WarmPoolConfig = field(default_factory=WarmPoolConfig)
    daytona: DaytonaSandboxConfig = field(default_factory=DaytonaSandboxConfig)

    def __post_init__(self) -> None:
        check_positive(self, "cpus", fix="remove it to use the task's own")
        check_at_least(self, 16, "memory_mb", fix="remove it to use the task's own")
        check_at_least(self, 1, "pids_limit", "max_concurrent", "wave_size", "max_wave_size", "max_file_mb",
                       "max_open_files", "max_output_chars")
        check_non_negative(self, "wave_interval_s", "max_infra_retries", "retry_backoff_s", "node_down_s")
        check_positive(self, "exec_timeout_s", "start_timeout_s", "pull_timeout_s", "target_start_latency_s",
                       "reap_every_s")
        check_non_negative(self, "reap_grace_s")
        check_range(self, 0, 1, "inject_failure_rate", high_open=True)
        check_at_least(self, 1000, "process_uid_base", fix="sandboxes must not share a system user's uid")
        check_one_of(self, ("command", "sandbox"), "process_namespace",
                     fix='"command": namespaces per command (the default); "sandbox": one keeper per sandbox')
