"""Ray session actors: each owns a share of the rollout sessions and assembles their trajectories.

An actor runs many sessions at once on its own event loop, each a multi-turn
agent attempt (`rl360cli.rl.session`). It compacts every trajectory — bulky
provider metadata such as per-turn MoE routing ids never leaves the actor —
and hands back serialized trajectories, one group at a time. Nothing central
holds the conversations in flight, so the cost of a step grows with the
number of actors, not with a single manager.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, kw_only=True)
class ActorSetup:
    """What every session actor of a run needs; plain data, so Ray can ship it."""

    run_id: str
    run_dir: str
    policy_dir: str
    router_url: str
    actor_index: int
    # The cluster profile (its Docker nodes, for the docker provider) and what each node's image
    # cache holds (for warm-first placement), as the state file records them.
    profile_path: str | None = None
    node_images: dict | None = None
    # The rollout tier's CPUs on a machine whose tiers are pinned (the sandboxes inherit them).
    cpu_list: tuple[int, ...] = ()


class SessionActor:
    """Created by `ray.remote(SessionActor)`; see `rl360cli.rl.rollouts`."""

    def __init__(self, setup: ActorSetup):
        from transformers import AutoTokenizer

        from rl360cli.config import load_profile
        from rl360cli.inference.client import EngineClient
        from rl360cli.sandbox.provider import make_provider
        from rl360cli.sandbox.task import load_task_set
        from rl360cli.stages.run import load_run_recipe

        self.setup = setup
        if setup.cpu_list:
            os.sched_setaffinity(0, set(setup.cpu_list))
        self.recipe = load_run_recipe(Path(setup.run_dir))
        self.tasks = {t.id: t for t in load_task_set(Path(self.recipe.tasks.path), include=self.recipe.tasks.include)}
        self.tokenizer = AutoTokenizer.from_pretrained(setup.policy_dir)
        self.client = EngineClient(setup.router_url)
        # Each actor injects its own sequence of failures (when asked to inject any).
        sandbox = dataclasses.replace(self.recipe.sandbox,
                                      inject_seed=self.recipe.sandbox.inject_seed * 1000 + setup.actor_index)
        nodes = load_profile(setup.profile_path).nodes if setup.profile_path else ()
        self.provider = make_provider(sandbox, nodes=nodes, run_id=setup.run_id, node_images=setup.node_images)
        share = max(1, self.recipe.rollout.max_concurrent_sessions // max(1, self.recipe.rollout.num_session_actors))
        self.slots = asyncio.Semaphore(share)

    async def run_group(self, task_id: str, group_id: str, num_samples: int) -> tuple[float, list[bytes]]:
        """Attempt `task_id` `num_samples` times; (time the last one finished, serialized trajectories)."""
        from rl360cli.rl.session import SessionSpec

        specs = [SessionSpec(task_id=task_id, group_id=group_id, sample_index=i, attempt_id=f"{group_id}-{i}")
                 for i in range(num_samples)]
        trajectories = await asyncio.gather(*(self._one(spec) for spec in specs))
        return time.time(), trajectories

    async def _one(self, spec) -> bytes:
        from rl360cli.rl.session import run_session

        async with self.slots:
            trajectory = await run_session(
                spec, self.tasks[spec.task_id], tokenizer=self.tokenizer, client=self.client,
                provider=self.provider, config=self.recipe.rollout,
                exec_timeout_s=self.recipe.sandbox.exec_timeout_s,
                labels={"rl360.run": self.setup.run_id, "rl360.task": spec.task_id, "rl360.attempt": spec.attempt_id},
            )
        compacted, _ = trajectory.compact()
        return compacted.to_bytes()

    async def close(self) -> None:
        await self.client.close()
        await self.provider.close()
