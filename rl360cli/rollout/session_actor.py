"""Ray session actors: each owns a share of the rollout sessions and assembles their trajectories.

An actor runs many sessions at once on its own event loop, each a multi-turn
agent attempt (`rl360cli.agent.session`). It compacts every trajectory — bulky
provider metadata such as per-turn MoE routing ids never leaves the actor —
and hands back serialized trajectories, one group at a time. Nothing central
holds the conversations in flight, so the cost of a step grows with the
number of actors, not with a single manager.

The driver gives each actor its configuration as plain data (`ActorSetup`):
an actor reads no recipe, profile or state file of its own.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from rl360cli.agent.config import RolloutConfig
from rl360cli.agent.session import SessionSpec, run_session
from rl360cli.images.config import RegistrySpec
from rl360cli.nodes.config import NodeSpec
from rl360cli.sandbox.config import SandboxConfig


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
    # The held-out set of `[eval]` (rl360cli/loop/eval.py), attempted by the same sessions; None: none.
    eval_tasks_path: str | None = None
    eval_tasks_include: tuple[str, ...] = ()
    rollout: RolloutConfig
    sandbox: SandboxConfig
    # The cluster profile's Docker nodes (the docker provider), and what each node's image cache
    # holds (warm-first placement): {node: {image_ref: digest}}, from `node_images_from_state`.
    nodes: tuple[NodeSpec, ...] = ()
    # The profile's registry: the pull cap and the base-image mirrors the docker provider applies.
    registry: RegistrySpec = field(default_factory=RegistrySpec)
    node_images: dict[str, dict[str, str | None]] = field(default_factory=dict)
    # The rollout tier's CPUs on a machine whose tiers are pinned (the sandboxes inherit them).
    cpu_list: tuple[int, ...] = ()
    # The run's API key file (mode 0600): the router requires the key; its path, not the key, travels by Ray.
    api_key_file: str | None = None


class SessionActor:
    """Created by `ray.remote(SessionActor)`; see `rl360cli.rollout.rollouts`."""

    def __init__(self, setup: ActorSetup):
        from transformers import AutoTokenizer

        from rl360cli.inference.apikey import read_api_key
        from rl360cli.inference.client import EngineClient
        from rl360cli.sandbox.providers import make_provider
        from rl360cli.sandbox.task import load_task_set

        self.setup = setup
        if setup.cpu_list:
            os.sched_setaffinity(0, set(setup.cpu_list))
        self.tasks = {t.id: t for t in load_task_set(Path(setup.tasks_path), include=setup.tasks_include)}
        if setup.eval_tasks_path:  # its ids differ from the training set's (checked at recipe load)
            self.tasks.update((t.id, t) for t in load_task_set(Path(setup.eval_tasks_path),
                                                               include=setup.eval_tasks_include))
        self.tokenizer = AutoTokenizer.from_pretrained(setup.policy_dir)
        self.client = EngineClient(setup.router_url,
                                   api_key=read_api_key(setup.api_key_file) if setup.api_key_file else None)
        # Each actor injects its own sequence of failures (when asked to inject any).
        sandbox = dataclasses.replace(setup.sandbox, inject_seed=setup.sandbox.inject_seed * 1000 + setup.actor_index)
        # `share`: the simulated provider gives each actor its own slice of the stand-in nodes.
        self.provider = make_provider(sandbox, nodes=setup.nodes, run_id=setup.run_id, node_images=setup.node_images,
                                      registry=setup.registry,
                                      share=(setup.actor_index, setup.rollout.num_session_actors))
        rollout = setup.rollout
        self.slots = asyncio.Semaphore(max(1, rollout.max_concurrent_sessions // max(1, rollout.num_session_actors)))

    async def run_group(self, task_id: str, group_id: str, num_samples: int) -> tuple[float, list[bytes]]:
        """Attempt `task_id` `num_samples` times; (time the last one finished, serialized trajectories)."""
        specs = [SessionSpec(task_id=task_id, group_id=group_id, sample_index=i, attempt_id=f"{group_id}-{i}")
                 for i in range(num_samples)]
        trajectories = await asyncio.gather(*(self._one(spec) for spec in specs))
        return time.time(), trajectories

    async def _one(self, spec: SessionSpec) -> bytes:
        async with self.slots:
            trajectory = await run_session(
                spec, self.tasks[spec.task_id], tokenizer=self.tokenizer, client=self.client,
                provider=self.provider, config=self.setup.rollout,
                exec_timeout_s=self.setup.sandbox.exec_timeout_s,
                labels={"rl360.run": self.setup.run_id, "rl360.task": spec.task_id, "rl360.attempt": spec.attempt_id},
            )
        compacted, _ = trajectory.compact()
        return compacted.to_bytes()

    async def close(self) -> None:
        from rl360cli.agent.session import drain_cut_sessions

        await drain_cut_sessions()  # sessions cut at their deadline stop their sandboxes first
        await self.client.close()
        await self.provider.close()
