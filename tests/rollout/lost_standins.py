"""A Ray actor that stands in for a session actor whose process dies under a group (tests/rollout/test_lost_actor.py).

Kept apart from the tests so that its worker process imports only this module, numpy and the trajectory type.
"""

from __future__ import annotations

import os
import time

from tests.loop.carry_standins import synthetic_sample


class DyingSessionActorStandIn:
    """`SessionActor`'s `run_group` contract (end time, serialized trajectories): a group of task "die"
    ends the actor's process under it (as when its node is lost) in the actor's first life only; every
    other group, and every group once Ray has started the actor again, returns two-turn samples at once."""

    def __init__(self, node: str = "n1"):
        import ray

        self.node = node
        self.restarted = ray.get_runtime_context().was_current_actor_reconstructed

    async def ready(self) -> int:
        return 0

    async def node_of(self) -> str:
        return self.node

    async def life(self) -> str:
        return "restarted" if self.restarted else "first"

    async def run_group(self, task_id: str, group_id: str, num_samples: int) -> tuple[float, list[bytes]]:
        if task_id == "die" and not self.restarted:
            os._exit(1)
        return time.time(), [synthetic_sample(task_id, group_id, i, (0, 0), flat=False).to_bytes()
                             for i in range(num_samples)]
