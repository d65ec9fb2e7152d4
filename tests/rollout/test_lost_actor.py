"""A group whose session actor dies under it (its node lost) over real Ray actors (rl360cli/rollout/rollouts.py):
its sessions come back masked with the actor's death's cause, never run again; the next submit waits for the
rollout tier (the tier watch) and for the actor Ray started again, and its groups run there; an actor that died
for good fails the run in one line. And which cause an actor's death is (`actor_death_cause`)."""

from __future__ import annotations

import pytest

from rl360cli.errors import RunFailed
from rl360cli.outcome import InfraCause, Outcome
from rl360cli.rollout.lost_groups import actor_death_cause
from rl360cli.rollout.rollouts import Rollouts
from tests.rollout.lost_standins import DyingSessionActorStandIn

TASK_IDS = ["die", "t1"]  # sorted: a step's first group (task "die") goes to the first actor, round robin


class TierWatchStandIn:
    """Stands in for the driver's rollout tier watch (rl360cli/run/tier_watch.py): says what it is told and
    counts the waits."""

    def __init__(self, *, recovering: bool = False, fails: bool = False, lost: frozenset[str] = frozenset()):
        self.is_recovering, self.fails, self.waits, self.lost = recovering, fails, 0, lost

    def recovering(self) -> bool:
        return self.is_recovering

    def wait_live(self, deadline: float) -> None:
        self.waits += 1
        if self.fails:
            raise RunFailed("the rollout tier is not live 0s after a lost node: tier rollout is requeued",
                            fix="raise [rollout] recovery_timeout_s")

    def lost_nodes(self) -> frozenset[str]:
        return self.lost

    def actor_nodes(self, actors: list) -> tuple[str, ...]:
        import ray

        return tuple(ray.get([actor.node_of.remote() for actor in actors]))

    def route_table(self, actors: list):
        return None


def actors(ray, *, max_restarts: int) -> list:
    remote = ray.remote(DyingSessionActorStandIn)
    # As the driver launches the session actors: Ray starts a dead one again, and retries none of its calls.
    return [remote.options(max_restarts=max_restarts, max_task_retries=0).remote(node) for node in ("n1", "n2")]


def rollouts_over(group_actors: list, watch: TierWatchStandIn | None = None) -> Rollouts:
    rollouts = Rollouts(group_actors, TASK_IDS, num_tasks_per_step=2, num_samples_per_task=3, max_generation_rounds=1,
                        seed=0, recovery_timeout_s=60)
    if watch is not None:
        rollouts.use_tier_watch(watch)
    return rollouts


@pytest.mark.parametrize(("lost_nodes", "cause"), [(frozenset(), InfraCause.UNKNOWN),
                                                   (frozenset({"n1"}), InfraCause.NODE_LOST)])
def test_a_group_lost_with_its_actor_is_masked_once_the_tier_is_live_and_the_next_step_runs_on_the_actor_back(
        ray_up, lost_nodes, cause):
    ray = ray_up
    group_actors, watch = actors(ray, max_restarts=1), TierWatchStandIn(lost=lost_nodes)
    rollouts = rollouts_over(group_actors, watch)
    trajectories, report = rollouts.collect(rollouts.submit(0))
    lost = [t for t in trajectories if t.task_id == "die"]
    # Every session of the lost group, masked: `node_lost` where the tier lost the actor's node (n1), else
    # `unknown` (a process that died on a node that lives, as here); none valid, none with a token to train, each
    # naming the actor's node. The collect waited for the tier (before and after the actors were back).
    assert sorted(t.sample_index for t in lost) == [0, 1, 2] and report.num_groups == 2
    assert all(t.outcome is Outcome.INFRA_FAILURE and t.cause is cause and not t.is_valid and t.num_tokens == 0
               and "session actor died" in t.metadata["detail"] and t.metadata["actor_node"] == "n1"
               for t in lost), lost
    assert all(t.is_valid for t in trajectories if t.task_id == "t1")
    assert rollouts.groups_lost == 1 and watch.waits == 2

    # The next step's groups run on the actor Ray started again; nothing lost, nothing waited for.
    trajectories, _ = rollouts.collect(rollouts.submit(1))
    assert len(trajectories) == 6 and all(t.is_valid for t in trajectories)
    assert ray.get(group_actors[0].life.remote()) == "restarted" and watch.waits == 2


def test_an_actor_that_died_for_good_fails_the_run_in_one_line(ray_up):
    rollouts = rollouts_over(actors(ray_up, max_restarts=0))
    with pytest.raises(RunFailed, match="a session actor died and was not started again") as caught:
        rollouts.collect(rollouts.submit(0))
    assert "\n" not in str(caught.value) and "actor_max_restarts" in caught.value.fix


def test_a_submit_while_the_tier_is_recovering_waits_for_it_and_sends_nothing_past_its_deadline(ray_up):
    group_actors = actors(ray_up, max_restarts=1)
    watch = TierWatchStandIn(recovering=True, fails=True)
    rollouts = rollouts_over(group_actors, watch)
    with pytest.raises(RunFailed, match="not live"):
        rollouts.submit(0)
    assert watch.waits == 1 and rollouts._next_actor == 0  # no group was sent
    watch.fails = False
    generation = rollouts.submit(0)
    assert watch.waits == 3 and len(generation.groups) == 2


def test_an_actors_death_is_node_lost_where_its_node_was_lost_or_ray_says_it_died():
    from ray.core.generated.common_pb2 import ActorDiedErrorContext
    from ray.exceptions import ActorDiedError, ActorUnavailableError

    def died(message: str) -> ActorDiedError:
        return ActorDiedError(ActorDiedErrorContext(error_message=message, actor_id=b"\x01" * 16,
                                                    class_name="SessionActor"))

    cut = ActorUnavailableError("RpcError: Socket closed", None)  # what a restartable actor's call gets, either way
    assert actor_death_cause(cut, node_lost=True) is InfraCause.NODE_LOST
    assert actor_death_cause(cut, node_lost=False) is InfraCause.UNKNOWN
    assert actor_death_cause(died("The actor died because its node has died. Node Id: 3f2a"),
                             node_lost=False) is InfraCause.NODE_LOST
    assert actor_death_cause(died("The actor is dead because its worker process has died."),
                             node_lost=False) is InfraCause.UNKNOWN
    assert actor_death_cause(ActorDiedError(), node_lost=False) is InfraCause.UNKNOWN
