"""Groups whose session actor died under them (rl360cli/rollout/rollouts.py): their sessions masked with the cause of
the actor's death, and the wait for the actors Ray starts again.

A restartable actor's call that its death cut fails with Ray's `ActorUnavailableError`, whether its node died or
only its process: the cause is told afterwards, once the tier is live again (`actor_death_cause`: the tier lost the
actor's node, or Ray started the actor on another node).

Test: tests/rollout/test_lost_actor.py (real Ray actors whose process dies under a group).
"""

from __future__ import annotations

import time

from rl360cli.errors import RunFailed
from rl360cli.outcome import InfraCause, Outcome
from rl360cli.rl.trajectory import Trajectory


def wait_actors(actors: list, deadline: float, timeout_s: float) -> None:
    """Until every session actor answers (Ray starts a dead one again where the rollout tier's resource is);
    `RunFailed` for one that died for good, or past `deadline`. A call that finds an actor unreachable (Ray does
    not know yet that its node died) is asked again."""
    import ray

    waiting = {ray_ref: actor for actor in actors for ray_ref in [actor.ready.remote()]}
    while waiting:
        left = deadline - time.monotonic()
        if left <= 0:
            raise RunFailed(f"{len(waiting)} of {len(actors)} session actors not back {timeout_s:g}s after one was "
                            "lost", fix="see `rl360 logs` for the rollout tier's ray-worker, or raise "
                                        "[rollout] recovery_timeout_s")
        ready, _ = ray.wait(list(waiting), num_returns=len(waiting), timeout=min(left, 5.0))
        for ref in ready:
            actor = waiting.pop(ref)
            try:
                ray.get(ref)
            except ray.exceptions.ActorUnavailableError:
                time.sleep(0.5)
                waiting[actor.ready.remote()] = actor
            except ray.exceptions.RayActorError as e:
                raise RunFailed(f"a session actor died and was not started again ({type(e).__name__})",
                                fix="see `rl360 logs` for why (its node lost, its process killed), or raise "
                                    "[rollout] actor_max_restarts") from e


def actor_death_cause(error: BaseException, *, node_lost: bool) -> InfraCause:
    """Why a group's sessions ended with their session actor: `node_lost` where its node was lost (`node_lost`:
    the tier lost it, or Ray started the actor on another node) or Ray says the actor's node died or was
    preempted; else `unknown`: its process died on a node that lives (an OOM kill, a kill by pid: worth a look).
    Ray's error alone cannot tell: a restartable actor's call cut by either is `ActorUnavailableError`, no more."""
    if node_lost or getattr(error, "preempted", False) or "its node has died" in str(error):
        return InfraCause.NODE_LOST
    return InfraCause.UNKNOWN


def lost_group(task_id: str, group_id: str, num_samples: int, *, cause: InfraCause, error: BaseException,
               node: str | None) -> list[bytes]:
    """The `num_samples` sessions of a group whose actor (on `node`, None: not known) died under it, each a masked
    infra failure, serialized: what they had generated died with the actor, so nothing of them is trained (nor
    run again)."""
    first = next((line.strip() for line in str(error).splitlines() if line.strip()), type(error).__name__)
    metadata = {"detail": f"its session actor died ({type(error).__name__}: {first[:200]})",
                "actor_node": node, "sandbox_node": node}
    return [Trajectory(task_id=task_id, group_id=group_id, sample_index=i, token_ids=[], loss_mask=[],
                       logprobs=[], versions=(), num_prompt_tokens=0, reward=None, outcome=Outcome.INFRA_FAILURE,
                       cause=cause, metadata=dict(metadata)).to_bytes()
            for i in range(max(1, num_samples))]
