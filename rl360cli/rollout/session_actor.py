"""Ray session actors: each owns a share of the rollout sessions and assembles their trajectories.

An actor runs many sessions at once on its own event loop, each a harness's
attempt (`rl360cli.agent.session`) through the actor's session endpoint (one
OpenAI-compatible server per actor, on loopback: `rl360cli.agent.endpoint`), so
no central process sees every session's traffic. It compacts every trajectory — bulky
provider metadata such as per-turn MoE routing ids never leaves the actor —
and hands back serialized trajectories, one group at a time. Nothing central
holds the conversations in flight, so the cost of a step grows with the
number of actors, not with a single manager.

The driver gives each actor its configuration as plain data (`ActorSetup`):
an actor reads no recipe, profile or state file of its own.

With `[sandbox] docker_host` each actor also runs its node's reaper (rl360cli/sandbox/docker/reaper.py): every
`[sandbox] reap_every_s` it removes the run's containers on the node's daemon that are past their session's
deadline plus `[sandbox] reap_grace_s`, so a sandbox whose actor died does not outlive the run's sessions.

Each actor also keeps running counters for the step's figures (sessions in flight, the
generate requests it sent, its CPU seconds and peak memory, image pulls in flight, and its
admission controller's), and hands them over as one small dict when asked (`take_gauges`,
collected by rl360cli/rollout/gauges.py once a step).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
import resource
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from rl360cli.agent.config import AgentConfig, RolloutConfig
from rl360cli.agent.endpoint import SessionEndpoint
from rl360cli.agent.harnesses import harness_factory
from rl360cli.agent.installed import installed_agent, layer_root, with_agent
from rl360cli.agent.session import SessionSpec, drain_cut_sessions, run_session, session_options
from rl360cli.egress.client import EgressRoute, node_name
from rl360cli.images.config import RegistrySpec
from rl360cli.inference.apikey import read_api_key
from rl360cli.inference.client import EngineClient
from rl360cli.inference.collector import collect_for_many_requests
from rl360cli.inference.tokenizer import load_tokenizer
from rl360cli.metrics import Level
from rl360cli.nodes.config import NodeDaemonConfig, NodeSpec
from rl360cli.nodes.daemon import node_daemon_spec
from rl360cli.nodes.docker_runtime import docker_api
from rl360cli.sandbox.config import SandboxConfig
from rl360cli.sandbox.docker.reaper import DEADLINE_LABEL, reap_expired
from rl360cli.sandbox.process.provider import NODE as PROCESS_NODE
from rl360cli.sandbox.providers import make_provider
from rl360cli.sandbox.task import Task
from rl360cli.sandbox.task_loader import load_task_set
from rl360cli.sandbox.waves import AdmissionController

# How often an actor looks at its provider's pulls in flight (they change inside a start, where no
# event of the actor's sees them): a pull shorter than this may go unseen in the step's peak.
PULL_SAMPLE_S = 0.25


@dataclass(frozen=True, kw_only=True)
class ActorSetup:
    """What every session actor of a run needs; plain data, so Ray can ship it."""

    run_id: str
    policy_dir: str
    router_url: str
    actor_index: int
    # The run's task set (a Harbor dataset folder, and the task folders it uses; all when empty).
    tasks_path: str
    tasks_include: tuple[str, ...] = ()
    # Domain tags by task, in place of the tasks' own `[metadata] tags` (`[tasks] tags`, or a manifest's).
    tasks_tags: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # The held-out set of `[eval]` (rl360cli/loop/eval.py), attempted by the same sessions; None: none.
    eval_tasks_path: str | None = None
    eval_tasks_include: tuple[str, ...] = ()
    rollout: RolloutConfig
    sandbox: SandboxConfig
    # Who drives each session (`[agent]`): the built-in agent, mini-swe-agent, or a user's harness.
    agent: AgentConfig = field(default_factory=AgentConfig)
    # The cluster profile's Docker nodes (the docker provider), and what each node's image cache
    # holds (warm-first placement): {node: {image_ref: digest}}, from `state.queries.image_digests`.
    nodes: tuple[NodeSpec, ...] = ()
    # The profile's `[sandbox]`: with its docker_host set, the docker provider starts this actor's sandboxes on
    # the daemon of the node the actor runs on, and on no other (in place of `nodes`), within its part of
    # the node's room: one of `actors_per_node` (`node_cpus` / `node_memory_mb`: the rollout tier's request per
    # node, None: what the node has).
    node_daemon: NodeDaemonConfig = field(default_factory=NodeDaemonConfig)
    actors_per_node: int = 1
    node_cpus: float | None = None
    node_memory_mb: int | None = None
    # The profile's registry: the pull cap and the base-image mirrors the docker provider applies.
    registry: RegistrySpec = field(default_factory=RegistrySpec)
    node_images: dict[str, dict[str, str | None]] = field(default_factory=dict)
    # Where a network task's sandbox goes (the profile's [egress], through the node's proxy when "allow": on Slurm
    # the rollout nodes' control path naming `{node}`, which the actor fills in with its own).
    egress: EgressRoute = field(default_factory=EgressRoute)
    # The rollout tier's CPUs on a machine whose tiers are pinned (the sandboxes inherit them).
    cpu_list: tuple[int, ...] = ()
    # The run's API key file (mode 0600): the router requires the key; its path, not the key, travels by Ray.
    api_key_file: str | None = None
    # Generate requests this actor keeps open through the router at once (0: no cap): its share of
    # what the engines run at once (rl360cli.inference.router.generations_in_flight).
    max_generate_connections: int = 0


class SessionActor:
    """Created by `ray.remote(SessionActor)`; see `rl360cli.rollout.rollouts`."""

    def __init__(self, setup: ActorSetup):
        import ray

        self.setup = setup
        if ray.get_runtime_context().was_current_actor_reconstructed:
            # To the driver's log (Ray forwards an actor's output): the groups it held came back masked.
            print(f"session actor {setup.actor_index} started again after its process or node died: "
                  "the groups it held end masked", file=sys.stderr, flush=True)
        if setup.cpu_list:
            os.sched_setaffinity(0, set(setup.cpu_list))
        # A task rl360 refuses is left out, as the driver leaves it out of the steps (and says so).
        self.tasks = {t.id: with_tags(t, setup.tasks_tags.get(t.id))
                      for t in load_task_set(Path(setup.tasks_path), include=setup.tasks_include, refused={})}
        if setup.eval_tasks_path:  # its ids differ from the training set's (checked at recipe load)
            self.tasks.update((t.id, t) for t in load_task_set(Path(setup.eval_tasks_path),
                                                               include=setup.eval_tasks_include, refused={}))
        # Without torch where the policy's tokenizer class allows (inference/tokenizer.py): ~2 s of CPU an actor.
        self.tokenizer = load_tokenizer(setup.policy_dir)
        api_key = read_api_key(setup.api_key_file) if setup.api_key_file else None
        self.client = CountedClient(EngineClient(setup.router_url, api_key=api_key,
                                                max_connections=setup.max_generate_connections))
        # Each actor injects its own sequence of failures (when asked to inject any).
        sandbox = dataclasses.replace(setup.sandbox, inject_seed=setup.sandbox.inject_seed * 1000 + setup.actor_index)
        # `share`: each actor its slice of the pull cap (and of the simulated provider's stand-in nodes). Its
        # sandboxes go out through the proxy of the node it runs on (on Slurm, one per rollout node): the node whose
        # dockerd (unix://) and processes it starts them on. Taken here, so an actor Ray starts again elsewhere
        # takes that node's.
        self.node = node_name()
        nodes = setup.nodes
        if setup.node_daemon.docker_host:
            nodes = (node_daemon_spec(setup.node_daemon, self.node, share=setup.actors_per_node,
                                      tier_cpus=setup.node_cpus, tier_memory_mb=setup.node_memory_mb),)
        # An installed agent (agent/installed.py) runs inside the sandbox: its install is a layer over each task's
        # image (built once per node), and each sandbox gets the door to its own session (egress/door.py).
        installed = installed_agent(setup.agent)
        if installed is not None:
            self.tasks = {i: with_agent(t, installed, layers=layer_root(), ca_bundle=setup.egress.ca_bundle)
                          for i, t in self.tasks.items()}
        egress = dataclasses.replace(setup.egress.on_node(self.node), door=installed is not None)
        self.provider = make_provider(sandbox, nodes=nodes, run_id=setup.run_id, node_images=setup.node_images,
                                      registry=setup.registry, egress=egress,
                                      share=(setup.actor_index, setup.rollout.num_session_actors))
        rollout = setup.rollout
        # A user's harness that does not import fails the actor, and the run, here: one line naming the fix.
        self.new_harness = harness_factory(setup.agent, rollout, exec_timeout_s=setup.sandbox.exec_timeout_s)
        self.options = session_options(setup.agent, rollout, model=Path(setup.policy_dir).name)
        # Started on the actor's event loop with its first sessions.
        self.endpoint = SessionEndpoint(tokenizer=self.tokenizer, client=self.client)
        self._endpoint_started: asyncio.Task | None = None
        self.slots = asyncio.Semaphore(max(1, rollout.max_concurrent_sessions // max(1, rollout.num_session_actors)))
        # The step's figures (`take_gauges`): sessions holding a slot, sessions ended, and the marks the
        # next take measures from.
        self.sessions = Level()
        self.sessions_done = 0
        self._cpu_mark = cpu_seconds()
        self._generates_mark = 0
        self._pulls_peak = 0
        self._pull_sampler: asyncio.Task | None = None
        self._reaper: asyncio.Task | None = None
        self._peak_resets = reset_memory_peak()
        collect_for_many_requests()  # what is loaded now stays; sessions come and go by the thousand

    async def ready(self) -> int:
        """Answers once the actor is built (its tasks, tokenizer and provider loaded): its index."""
        return self.setup.actor_index

    async def node_of(self) -> str:
        """The node this actor runs on (its sandboxes' daemon's): the driver routes groups by it."""
        return self.node

    async def run_group(self, task_id: str, group_id: str, num_samples: int) -> tuple[float, list[bytes]]:
        """Attempt `task_id` `num_samples` times; (time the last one finished, serialized trajectories)."""
        specs = [SessionSpec(task_id=task_id, group_id=group_id, sample_index=i, attempt_id=f"{group_id}-{i}")
                 for i in range(num_samples)]
        if self._pull_sampler is None:  # started in the actor's event loop, with its first sessions
            self._pull_sampler = asyncio.ensure_future(self._sample_pulls())
            if self.setup.node_daemon.docker_host and self.setup.sandbox.provider == "docker":
                self._reaper = asyncio.ensure_future(self._reap())
        if self._endpoint_started is None:
            self._endpoint_started = asyncio.ensure_future(self.endpoint.start())
        await asyncio.shield(self._endpoint_started)
        self.provider.expect(self.tasks[task_id], num_samples)  # a warm pool sizes itself by what is coming
        sessions = await asyncio.gather(*(self._one(spec) for spec in specs))
        return time.time(), [blob for segments in sessions for blob in segments]

    async def _one(self, spec: SessionSpec) -> list[bytes]:
        """One session's trajectories (one per segment), compacted and serialized."""
        async with self.slots:
            self.sessions.add(1)
            try:
                trajectories = await run_session(
                    spec, self.tasks[spec.task_id], endpoint=self.endpoint, harness=self.new_harness(),
                    options=self.options, agent=self.setup.agent, rollout=self.setup.rollout,
                    provider=self.provider, exec_timeout_s=self.setup.sandbox.exec_timeout_s,
                    labels={"rl360.run": self.setup.run_id, "rl360.task": spec.task_id,
                            "rl360.attempt": spec.attempt_id,
                            # Its node's reaper removes the sandbox once well past this (it ends by then itself).
                            DEADLINE_LABEL: f"{time.time() + self.setup.rollout.session_timeout_s:.0f}"},
                    log=lambda line: print(f"[session {spec.attempt_id}] {line}", file=sys.stderr, flush=True),
                )
            finally:
                self.sessions.add(-1)
                self.sessions_done += 1
        for trajectory in trajectories:  # where it ran: its sample's record names both
            sandbox_node = trajectory.metadata.get("node")
            trajectory.metadata["actor_node"] = self.node
            # A process sandbox runs beside its actor (its provider calls its one node "local").
            trajectory.metadata["sandbox_node"] = self.node if sandbox_node == PROCESS_NODE else sandbox_node
        return [trajectory.compact()[0].to_bytes() for trajectory in trajectories]

    async def take_gauges(self) -> dict:
        """This actor's figures since the last call, and start the next interval: a dict of counters
        (nothing per session, no trajectory). `memory_peak_mb` is the peak since the last call where
        the kernel lets a process reset its peak (`memory_peak_is_lifetime` False), else since start."""
        cpu = cpu_seconds()
        generates = self.client.generates
        load = self.provider.pull_load()
        figures = {
            "sessions": self.sessions.take(), "sessions_done": self.sessions_done,
            "generate_requests": generates - self._generates_mark,
            "cpu_s": cpu - self._cpu_mark, "memory_peak_mb": memory_peak_mb(),
            "memory_peak_is_lifetime": not self._peak_resets,
            "pulls_in_flight_max": max(self._pulls_peak, load[0]) if load else None,
            "pull_cap": load[1] if load else None,
            "admission": self.provider.take_gauges() if isinstance(self.provider, AdmissionController) else None,
            "router_url": self.setup.router_url,
        }
        self.sessions_done, self._generates_mark, self._cpu_mark = 0, generates, cpu
        self._pulls_peak = load[0] if load else 0
        self._peak_resets = reset_memory_peak()
        return figures

    async def _sample_pulls(self) -> None:
        while True:
            load = self.provider.pull_load()
            if load is None:
                return  # this provider does not say
            self._pulls_peak = max(self._pulls_peak, load[0])
            await asyncio.sleep(PULL_SAMPLE_S)

    async def _reap(self) -> None:
        """This node's reaper (see the module docstring): a failed round is said and the next one tries again."""
        sandbox = self.setup.sandbox
        api = docker_api(self.setup.node_daemon.host_on(self.node))
        while True:
            await asyncio.sleep(sandbox.reap_every_s)
            try:
                removed = await asyncio.to_thread(reap_expired, api, self.setup.run_id, grace_s=sandbox.reap_grace_s)
            except Exception as e:  # noqa: BLE001 - a daemon that does not answer now may later
                print(f"[reaper {self.node}] round failed ({type(e).__name__}: {e})", file=sys.stderr, flush=True)
                continue
            if removed:
                print(f"[reaper {self.node}] removed {len(removed)} containers past their session's deadline "
                      f"(+{sandbox.reap_grace_s:g}s)", file=sys.stderr, flush=True)

    async def close(self) -> None:
        if self._pull_sampler is not None:
            self._pull_sampler.cancel()
        if self._reaper is not None:
            self._reaper.cancel()
        await drain_cut_sessions()  # sessions cut at their deadline stop their sandboxes first
        await self.endpoint.close()
        await self.client.close()
        await self.provider.close()


def with_tags(task: Task, tags: tuple[str, ...] | None) -> Task:
    """`task` with its domain tags replaced by `tags` (None: as its task.toml has them)."""
    return task if tags is None else dataclasses.replace(task, metadata={**task.metadata, "tags": list(tags)})


class CountedClient:
    """The engine client, counting the generate requests it sends through the router (the router's
    request rate when its own metrics cannot be read); everything else passes through."""

    def __init__(self, client):
        self.client = client
        self.generates = 0

    async def generate(self, *args, **kwargs):
        self.generates += 1
        return await self.client.generate(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self.client, name)


def cpu_seconds() -> float:
    """User and system CPU seconds this process has used (all its threads)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def memory_peak_mb() -> float | None:
    """This process's peak resident memory (VmHWM) in MB; None where /proc does not say."""
    try:
        found = re.search(r"^VmHWM:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.MULTILINE)
    except OSError:
        return None
    return int(found.group(1)) / 1024 if found else None


def reset_memory_peak() -> bool:
    """Reset VmHWM to the memory in use now (Linux: "5" to /proc/self/clear_refs); False where that is refused."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True
