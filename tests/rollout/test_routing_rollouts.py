"""`Rollouts.use_routing` over real Ray actors that stand in for session actors on three nodes: each group runs on
the actor whose node holds its task's image, step after step; a task without an image goes round robin. And the
driver's table (`route_table`) for the dev Slurm docker recipe: each actor's node, each task's image, the cache
the state file records."""

from __future__ import annotations

from pathlib import Path

from rl360cli.config import load_profile, load_recipe
from rl360cli.rollout.rollouts import Rollouts
from rl360cli.rollout.routing import ANY, WARM, Choice, NodeImages, RouteTable, choose_actor
from rl360cli.run.session_actors import route_table
from rl360cli.state.images import ImagePull, NodeFacts, record_pulls
from rl360cli.state.store import StateFile
from tests.loop.carry_standins import GatedSessionActorStandIn

REPO = Path(__file__).resolve().parents[2]

TASK_IDS = [f"t{i:02d}" for i in range(12)]
A, B = "reg/a:1", "reg/b:1"
# t00..t09 alternate a and b; t10 and t11 have no image (a process task).
IMAGES = {t: (A if i % 2 == 0 else B) for i, t in enumerate(TASK_IDS[:10])}


class NodeActorStandIn(GatedSessionActorStandIn):
    """The gated stand-in, on a named node, remembering the groups it ran."""

    def __init__(self, node: str):
        super().__init__()
        self.node, self.ran = node, []

    async def node_of(self) -> str:
        return self.node

    async def run_group(self, task_id: str, group_id: str, num_samples: int):
        self.ran.append(task_id)
        return await super().run_group(task_id, group_id, num_samples)

    async def groups_ran(self) -> list[str]:
        return list(self.ran)


def test_groups_run_on_the_actor_whose_node_holds_their_image(ray_up):
    ray = ray_up
    nodes = ("n1", "n2", "n3")
    actors = [ray.remote(NodeActorStandIn).remote(n) for n in nodes]
    assert ray.get([a.node_of.remote() for a in actors]) == list(nodes)
    rollouts = Rollouts(actors, TASK_IDS, num_tasks_per_step=6, num_samples_per_task=2, max_generation_rounds=1,
                        seed=0)
    rollouts.use_routing(RouteTable(actor_nodes=nodes, task_images=IMAGES, images=NodeImages(
        caches={"n2": {A: "sha256:a"}, "n3": {B: None}}, pins={A: ("n2",), B: ("n3",)}, digests={A: "sha256:a"})))
    for step in range(3):
        trajectories, report = rollouts.collect(rollouts.submit(step))
        assert report.num_groups == 6 and len(trajectories) == 12
    ran = dict(zip(nodes, ray.get([a.groups_ran.remote() for a in actors])))
    assert sum(len(r) for r in ran.values()) == 18
    assert {IMAGES.get(t) for t in ran["n1"]} <= {None}
    assert {IMAGES.get(t) for t in ran["n2"]} <= {A, None} and {IMAGES.get(t) for t in ran["n3"]} <= {B, None}
    with_image = sum(t in IMAGES for r in ran.values() for t in r)
    assert rollouts.routed[WARM] == with_image and rollouts.routed[ANY] == 18 - with_image and with_image > 0


def test_the_drivers_table_for_the_slurm_docker_recipe(ray_up, tmp_path):
    ray = ray_up
    recipe = load_recipe(REPO / "recipes" / "slurm-docker-smoke.toml")
    profile = load_profile(REPO / "cluster" / "dev-slurm-docker.toml")
    python = "127.0.0.1:5000/rl360/python:3.11"
    state = StateFile(tmp_path / "state.json")
    facts = NodeFacts(name="n2", address="n2", tier="rollout", cpus=2.0, memory_mb=4096,
                      docker_host="unix:///tmp/rl360-dev/docker/n2/docker.sock", disk_budget_gb=None)
    record_pulls(state, {"n2": facts}, [ImagePull(node="n2", ref=python, digest="sha256:p", size=1, started_at="t0",
                                                  pulled_at="t1", seconds=1.0, attempts=1, image_id="id-p")])
    actors = [ray.remote(NodeActorStandIn).remote(n) for n in ("n1", "n2")]
    table = route_table(state.read(), recipe, profile, actors, in_cluster=True)
    assert table.actor_nodes == ("n1", "n2") and len(table.task_images) == 32
    assert set(table.task_images.values()) == {python}
    assert table.capacity == -(-recipe.rollout.max_concurrent_sessions // 2)
    assert choose_actor(table, "arith-00", load=[0, 0], turn=0) == Choice(actor=1, rank=WARM)
    assert route_table(state.read(), recipe, profile, actors, in_cluster=False) is None
