"""Carry-over of unfinished groups (`[loop] over_sample`, rl360cli/rollout/rollouts.py) with real Ray actors.

The real `Rollouts` over real Ray actors that stand in for the session actors: a group named in the
actor's holds ends only once the policy version has moved on, so which groups are late is set by the
test, not by a clock. Checked: `collect` returns without the late groups; they come back in a later
step with the versions that generated their turns; a carried group that could only be stale is
cancelled on its actor; nothing beyond `grpo.max_staleness` is trained; the run's end leaves no
group running; dynamic-filtering rounds still run, only where the first round left too few groups
with signal (`resample_below`), and then up to the quota; a bad `over_sample` or `resample_below` is refused at load time.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from rl360cli.config import load_recipe
from rl360cli.configload import ConfigError, from_mapping
from rl360cli.loop.config import LoopConfig, TaskPoolConfig
from rl360cli.loop.ledger import read_ledger
from rl360cli.loop.task_pool import TaskPool
from rl360cli.loop.train_loop import LoopParts, train_loop
from rl360cli.rl.batch import build_batch
from rl360cli.rl.config import GRPOConfig
from rl360cli.rollout.rollouts import Rollouts
from rl360cli.trainer.broadcast import SyncStats
from rl360cli.trainer.config import SimulatedTrainerConfig
from rl360cli.trainer.simulated import SimulatedTrainer
from tests.loop.carry_standins import GatedSessionActorStandIn, synthetic_sample

TASK_IDS = [f"t{i:02d}" for i in range(12)]
QUOTA = 4
FOREVER = 1000  # versions a hung group waits: it never ends by itself


class ActorVersionSyncStandIn:
    """Stands in for the weight broadcast: hands the new version to the stand-in actors (as engines
    would tag their tokens with it) and moves no weights."""

    def __init__(self, actors: list):
        self.actors = actors

    def broadcast(self, named_tensors, version: int) -> SyncStats:
        import ray

        ray.get([actor.set_version.remote(version) for actor in self.actors])
        return SyncStats(version=version, seconds=0.0, bytes=0, buckets=0, num_engines=len(self.actors))


class StalenessRecordingTrainer(SimulatedTrainer):
    """The simulated trainer (no sleep) that also records, per update, how stale its batch's samples
    were: its version minus each sample's (oldest turn's) version."""

    def __init__(self):
        super().__init__(SimulatedTrainerConfig(step_s=0.0), sleep=lambda seconds: None)
        self.staleness: list[list[int]] = []

    def train_step(self, batch):
        self.staleness.append((self.version - batch.versions).tolist())
        return super().train_step(batch)


@pytest.fixture(scope="module")
def shared_actor(ray_up):
    """One stand-in actor for the module's tests (each starts it over with `configure`)."""
    return ray_up.remote(GatedSessionActorStandIn).remote()


def gated_actor(actor, holds: dict[str, int], flat: frozenset[str] = frozenset()):
    import ray

    ray.get(actor.configure.remote(holds, flat))
    return actor


def rollouts_over(actors: list, *, over_sample: float = 0.5, max_staleness: int | None = 1,
                  max_generation_rounds: int = 1, resample_below: float = 1.0,
                  resample_from_step: int = 0) -> Rollouts:
    return Rollouts(actors, TASK_IDS, num_tasks_per_step=QUOTA, num_samples_per_task=2,
                    max_generation_rounds=max_generation_rounds, seed=0, over_sample=over_sample,
                    resample_below=resample_below, resample_from_step=resample_from_step,
                    max_staleness=max_staleness)


def until(check, ray_actor, timeout_s: float = 30.0) -> dict:
    """The actor's report once `check(report)` holds (waiting on the actor's event loop, not a clock
    of the test's: the deadline only stops a broken run)."""
    import ray

    deadline = time.monotonic() + timeout_s
    while True:
        report = ray.get(ray_actor.report.remote())
        if check(report) or time.monotonic() > deadline:
            return report
        time.sleep(0.05)


def test_the_default_draws_and_submits_as_without_carry_over():
    plain = rollouts_over([], over_sample=0.0)
    assert plain.in_flight_for(QUOTA) == QUOTA
    over = rollouts_over([], over_sample=0.5)
    assert over.in_flight_for(QUOTA) == 6 and over.in_flight_for(3) == 5  # rounded up
    assert rollouts_over([], over_sample=0.1).in_flight_for(30) == 33  # not 34 (30 x 0.1 > 3 in floats)
    for step in range(5):
        # The over-sampled draw starts with the step's usual tasks, then adds others, all distinct.
        drawn = over.tasks_for_step(step, 6)
        assert drawn[:QUOTA] == plain.tasks_for_step(step) and len(set(drawn)) == 6
        assert over.tasks_for_step(step, 2) == plain.tasks_for_step(step)[:2]
    # Past the whole task set the same order comes round again (those groups get a copy suffix).
    everything = over.tasks_for_step(0, len(TASK_IDS) + 3)
    assert sorted(everything[:len(TASK_IDS)]) == TASK_IDS and everything[len(TASK_IDS):] == everything[:3]


class GroupIdRecorderStandIn:
    """Stands in for a session actor's handle: `run_group.remote` returns the group id (no Ray, no run)."""

    def __init__(self):
        self.run_group = self
        self.group_ids: list[str] = []

    def remote(self, task_id: str, group_id: str, num_samples: int) -> str:
        self.group_ids.append(group_id)
        return group_id


def test_over_sampling_past_the_task_set_gives_second_groups_their_own_ids():
    recorder = GroupIdRecorderStandIn()
    rollouts = Rollouts([recorder], TASK_IDS, num_tasks_per_step=len(TASK_IDS), num_samples_per_task=2,
                        max_generation_rounds=1, seed=0, over_sample=0.5)
    generation = rollouts.submit(0)
    assert len(generation.groups) == 18 and len(set(recorder.group_ids)) == 18
    assert sorted(g for g in recorder.group_ids if g.endswith(".2")) == sorted(
        f"s0-r0-{t}.2" for t in rollouts.tasks_for_step(0, 18)[len(TASK_IDS):])


def test_a_bad_over_sample_is_refused_at_load_time():
    assert LoopConfig().over_sample == 0.0
    for value in (-0.1, 25, "0.25"):
        with pytest.raises(ConfigError, match="over_sample") as error:
            from_mapping(LoopConfig, {"over_sample": value}, where="recipe.toml", table="loop")
        assert "\n" not in str(error.value)
    with pytest.raises(ConfigError, match=r"0\.25: a quarter more groups"):
        from_mapping(LoopConfig, {"over_sample": 25}, where="recipe.toml", table="loop")


def test_a_resample_below_outside_0_to_1_is_refused_at_load_time():
    assert LoopConfig().resample_below == 1.0
    for value in (0, -0.5, 1.5):
        with pytest.raises(ConfigError, match=r"resample_below must be in \(0, 1\] \(got .+\); a fraction of "
                                              r"num_tasks_per_step") as error:
            from_mapping(LoopConfig, {"resample_below": value}, where="recipe.toml", table="loop")
        assert "\n" not in str(error.value)


def test_over_sampling_without_a_staleness_bound_is_refused_at_load_time(tmp_path):
    recipe = tmp_path / "recipe.toml"
    recipe.write_text('[run]\nname = "r"\n[tasks]\npath = "."\n[loop]\nover_sample = 0.25\n')
    with pytest.raises(ConfigError, match="set grpo.max_staleness") as error:
        load_recipe(recipe)
    assert "\n" not in str(error.value)
    recipe.write_text(recipe.read_text() + "[grpo]\nmax_staleness = 2\n")
    assert load_recipe(recipe).loop.over_sample == 0.25


def test_late_groups_are_carried_with_their_versions_and_hopeless_ones_cancelled(ray_up, shared_actor):
    ray = ray_up
    drawn = rollouts_over([]).tasks_for_step(0, 6)
    late, hung = f"s0-r0-{drawn[4]}", f"s0-r0-{drawn[5]}"
    actor = gated_actor(shared_actor, {late: 1, hung: FOREVER})
    rollouts = rollouts_over([actor])

    first = rollouts.submit(0, policy_version=0)
    assert len(first.groups) == 6  # the quota and half as many again
    trajectories, report = rollouts.collect(first)
    assert {t.group_id for t in trajectories} == {f"s0-r0-{t}" for t in drawn[:4]}
    assert set(report.carried_out) == {late, hung} and report.carried_in == 0

    ray.get(actor.set_version.remote(1))  # step 0 trained: the late group ends on version 1
    ray.wait([g.ref for g in rollouts.carried if g.group_id == late], timeout=30)
    second = rollouts.submit(1, policy_version=1)
    assert second.carried_in == 2 and len(second.groups) == 6 and second.cancelled == []
    trajectories, report = rollouts.collect(second)
    arrived = [t for t in trajectories if t.group_id == late]
    assert len(arrived) == 2 and all(t.versions == (0, 1) and t.policy_version == 0 for t in arrived)
    assert hung in report.carried_out and late not in report.carried_out
    # Trained at version 1 its samples are 1 version old: within the bound, kept.
    batch, batch_report = build_batch(trajectories, current_version=1, max_staleness=1)
    assert {trajectories[i].group_id for i in batch.indices.tolist()} >= {late}
    assert batch_report.dropped_stale == 0

    # At version 2 the hung group's tokens (from version 0) could only be stale: cancelled, on its actor.
    third = rollouts.submit(2, policy_version=2)
    assert third.cancelled == [hung] and hung not in {g.group_id for g in third.groups}
    seen = until(lambda r: hung in r["cancelled"] and hung not in r["running"], actor)
    assert hung in seen["cancelled"] and hung not in seen["running"]
    trajectories, report = rollouts.collect(third)
    assert hung not in {t.group_id for t in trajectories} and report.cancelled == (hung,)
    rollouts.cancel_carried()
    assert until(lambda r: not r["running"], actor)["running"] == []


def test_dynamic_filtering_rounds_still_run_with_over_sampling(shared_actor):
    drawn = rollouts_over([]).tasks_for_step(0, 6)
    # Half the first round has no reward variance: at most 3 groups with signal, so a second round runs.
    actor = gated_actor(shared_actor, {}, flat=frozenset(drawn[:3]))
    rollouts = rollouts_over([actor], max_generation_rounds=2)
    generation = rollouts.submit(0, policy_version=0)
    trajectories, report = rollouts.collect(generation)
    assert report.rounds == 2
    # The second round over-samples too (at least one group missing: 1 + ceil(0.5) groups), and
    # every group of the step was either collected or carried: none is lost.
    collected = {t.group_id for t in trajectories}
    assert len([g for g in generation.groups if "-r1-" in g.group_id]) >= rollouts.in_flight_for(1) == 2
    assert {g.group_id for g in generation.groups} == collected | set(report.carried_out)
    assert not collected & set(report.carried_out)
    rollouts.cancel_carried()
    assert until(lambda r: not r["running"], actor)["running"] == []


@pytest.mark.parametrize(("resample_below", "rounds"), [(1.0, 2), (0.75, 1)])
def test_a_further_round_runs_only_while_too_few_groups_have_signal(shared_actor, resample_below: float,
                                                                     rounds: int):
    # One group of the first round's four has no reward variance: 3 of the quota's 4 have signal.
    drawn = rollouts_over([], over_sample=0.0).tasks_for_step(0)
    actor = gated_actor(shared_actor, {}, flat=frozenset(drawn[:1]))
    rollouts = rollouts_over([actor], over_sample=0.0, max_generation_rounds=2, resample_below=resample_below)
    trajectories, report = rollouts.collect(rollouts.submit(0, policy_version=0))
    assert report.rounds == rounds
    assert len({t.group_id for t in trajectories}) == QUOTA + (rounds - 1)  # the second round: the one missing


def test_steps_before_resample_from_step_train_their_first_round_as_it_is(shared_actor):
    # Every group of steps 0 and 1 but one has no reward variance: from step 1 on they are topped up.
    flat = frozenset(TASK_IDS) - {rollouts_over([], over_sample=0.0).tasks_for_step(step)[0] for step in (0, 1)}
    actor = gated_actor(shared_actor, {}, flat=flat)
    rollouts = rollouts_over([actor], over_sample=0.0, max_generation_rounds=2, resample_from_step=1)
    rounds = [rollouts.collect(rollouts.submit(step, policy_version=step))[1].rounds for step in (0, 1)]
    assert rounds == [1, 2]


def test_a_negative_resample_from_step_is_refused_at_load_time():
    with pytest.raises(ConfigError, match=r"resample_from_step must be >= 0 \(got -1\); 0: further rounds from the first step") as error:
        from_mapping(LoopConfig, {"resample_from_step": -1}, where="recipe.toml", table="loop")
    assert "\n" not in str(error.value)


def test_a_first_round_short_of_signal_is_topped_up_to_the_quota_not_to_the_threshold(shared_actor):
    # resample_below 0.5: further rounds only where the first round left fewer than 2 of the 4 with signal.
    drawn = rollouts_over([], over_sample=0.0).tasks_for_step(0)
    everything_but = lambda *tasks: frozenset(TASK_IDS) - set(tasks)  # noqa: E731
    # First: only drawn[3] ever has signal, so the step runs all three rounds and shows what round 2 samples.
    actor = gated_actor(shared_actor, {}, flat=everything_but(drawn[3]))
    rollouts = rollouts_over([actor], over_sample=0.0, max_generation_rounds=3, resample_below=0.5)
    generation = rollouts.submit(0, policy_version=0)
    _, report = rollouts.collect(generation)
    second_round = [g.task_id for g in generation.groups if "-r1-" in g.group_id]
    assert report.rounds == 3 and len(second_round) == 3
    # Again, with one of the tasks round 2 draws (the draw is the same: same seed, step and first round)
    # given signal: 2 of 4 after round 2 is the threshold, but not the quota, so round 3 still runs.
    actor = gated_actor(shared_actor, {}, flat=everything_but(drawn[3], second_round[0]))
    rollouts = rollouts_over([actor], over_sample=0.0, max_generation_rounds=3, resample_below=0.5)
    generation = rollouts.submit(0, policy_version=0)
    trajectories, report = rollouts.collect(generation)
    assert [g.task_id for g in generation.groups if "-r1-" in g.group_id] == second_round
    assert report.rounds == 3
    assert len([g for g in generation.groups if "-r2-" in g.group_id]) == 2  # the quota's 2 still missing


def test_the_loop_trains_nothing_beyond_the_staleness_bound_and_ends_with_no_group_running(shared_actor,
                                                                                           tmp_path: Path):
    sampler = rollouts_over([])
    late, hung = (f"s0-r0-{t}" for t in sampler.tasks_for_step(0)[:2])
    hung_at_end = f"s4-r0-{sampler.tasks_for_step(4)[0]}"  # the first QUOTA of a draw are always submitted
    actor = gated_actor(shared_actor, {late: 1, hung: FOREVER, hung_at_end: FOREVER})
    rollouts = rollouts_over([actor])
    trainer = StalenessRecordingTrainer()
    rows: dict[int, dict] = {}
    parts = LoopParts(rollouts=rollouts, trainer=trainer, weight_sync=ActorVersionSyncStandIn([actor]),
                      loop=LoopConfig(num_steps=5, num_tasks_per_step=QUOTA, num_samples_per_task=2,
                                      max_generation_rounds=1, over_sample=0.5),
                      grpo=GRPOConfig(max_staleness=1), checkpoint_every=100, checkpoint_dir=tmp_path / "checkpoints",
                      log=lambda step, values: rows.update({step: values}), on_step=lambda *args: None)
    train_loop(parts)

    # Nothing trained was more than max_staleness versions old (measured by the trainer itself).
    assert len(trainer.staleness) == 5 and max(max(s) for s in trainer.staleness) <= 1
    assert all(row["batch"].get("staleness_max", 0) <= 1 for row in rows.values())
    ledger = read_ledger(tmp_path / "ledger.jsonl")
    trained = [g for entry in ledger for g in entry["groups"]]
    assert len(trained) == len(set(trained))  # no group trained twice
    # Step 0 went on without the two held groups; the late one (ended by version 1) came back once,
    # in step 1 (trained) or step 2 (dropped as stale), or was cancelled when step 2 was submitted.
    assert rows[0]["groups_carried_out"] == 2 and late not in ledger[0]["generated"]
    arrived = [e["step"] for e in ledger if late in e["generated"]]
    assert arrived in ([1], [2]) or (arrived == [] and late in ledger[2]["cancelled"])
    assert late not in [g for e in ledger[2:] for g in e["groups"]]  # 2 versions old there: never trained
    assert rows[1]["groups_carried_in"] >= 1 and rows[0]["group_s_p50"] is not None
    # The hung group was cancelled once its tokens could only be stale: step 2 trains at version 2
    # and it began on version 0; the one left at the last step was cancelled with the run's end.
    assert hung in ledger[2]["cancelled"] and rows[2]["groups_cancelled_stale"] >= 1
    assert hung_at_end in ledger[4]["cancelled"] and rows[4]["groups_cancelled_at_end"] >= 1
    assert ledger[4]["carried"] == [] and rollouts.carried == []
    assert not {hung, hung_at_end} & {g for e in ledger for g in e["generated"]}
    seen = until(lambda r: not r["running"], actor)
    assert seen["running"] == [] and {hung, hung_at_end} <= set(seen["cancelled"])


class CrashingTrainer(StalenessRecordingTrainer):
    """The recording trainer that dies (raises) at the update that would make `crash_at_version`, as a
    killed trainer does between checkpoints."""

    def __init__(self, crash_at_version: int | None = None):
        super().__init__()
        self.crash_at_version = crash_at_version

    def train_step(self, batch):
        if self.version + 1 == self.crash_at_version:
            raise RuntimeError("the trainer died")
        return super().train_step(batch)


def test_a_resume_starts_with_nothing_carried_and_trains_no_group_twice(shared_actor, tmp_path: Path):
    sampler = rollouts_over([])
    in_flight_at_checkpoint = f"s1-r0-{sampler.tasks_for_step(1)[0]}"
    actor = gated_actor(shared_actor, {in_flight_at_checkpoint: FOREVER})

    def parts(rollouts: Rollouts, trainer) -> LoopParts:
        return LoopParts(rollouts=rollouts, trainer=trainer, weight_sync=ActorVersionSyncStandIn([actor]),
                         loop=LoopConfig(num_steps=4, num_tasks_per_step=QUOTA, num_samples_per_task=2,
                                         max_generation_rounds=1, over_sample=0.5),
                         grpo=GRPOConfig(max_staleness=2), checkpoint_every=2, checkpoint_dir=tmp_path / "checkpoints",
                         log=lambda step, values: None, on_step=lambda *args: None)

    first = rollouts_over([actor], max_staleness=2)
    with pytest.raises(RuntimeError, match="the trainer died"):
        train_loop(parts(first, CrashingTrainer(crash_at_version=4)))  # after the checkpoint of step 2
    first.cancel_carried()  # what a killed trainer's process takes with it

    trainer = CrashingTrainer()
    start = trainer.load_checkpoint(tmp_path / "checkpoints" / "step_000002")["next_step"]
    # As the driver does on resume: the engines get the checkpoint's weights and version back.
    ActorVersionSyncStandIn([actor]).broadcast(trainer.named_tensors(), trainer.version)
    second = rollouts_over([actor], max_staleness=2)
    train_loop(parts(second, trainer), start_step=start)

    ledger = read_ledger(tmp_path / "ledger.jsonl")
    assert [e["step"] for e in ledger] == [0, 1, 2, 3]
    trained = [g for e in ledger for g in e["groups"]]
    assert len(trained) == len(set(trained))  # no group trained twice, across the resume
    # The group in flight at the checkpoint is listed there as carried, and never collected after.
    assert in_flight_at_checkpoint in ledger[1]["carried"]
    assert in_flight_at_checkpoint not in {g for e in ledger for g in e["generated"]}
    # The resumed step started with nothing carried in: only its own fresh groups.
    assert all(g.startswith(("s2-", "s3-")) for e in ledger[2:] for g in e["generated"])
    assert until(lambda r: not r["running"], actor)["running"] == []


def test_a_collect_tells_its_progress_while_it_waits_for_a_late_group(ray_up, shared_actor):
    import threading

    ray = ray_up
    drawn = rollouts_over([]).tasks_for_step(0, QUOTA)
    late = f"s0-r0-{drawn[-1]}"
    actor = gated_actor(shared_actor, {late: 1})
    rollouts = rollouts_over([actor], over_sample=0.0)
    heard: list[tuple[int, int, int]] = []
    generation = rollouts.submit(0, policy_version=0)
    collecting = threading.Thread(target=rollouts.collect, args=(generation,), kwargs={
        "progress": lambda *, step, sessions_done, sessions_total: heard.append((step, sessions_done,
                                                                                 sessions_total))})
    collecting.start()
    # The three other groups end; the late one waits for version 1: the collect says 3 of 4 groups so far.
    deadline = time.monotonic() + 30
    while (0, 6, 8) not in heard and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (0, 6, 8) in heard and collecting.is_alive(), heard
    ray.get(actor.set_version.remote(1))
    collecting.join(timeout=30)
    assert not collecting.is_alive() and heard[-1] == (0, 8, 8)
    done = [d for _, d, _ in heard]
    assert done == sorted(done) and {total for _, _, total in heard} == {8}  # never back, one total


def test_a_task_chooser_picks_the_tasks_and_attempts_of_every_round(shared_actor):
    """The adaptive pool (rl360cli/loop/task_pool.py) behind `Rollouts.use_chooser`: a probe step draws the
    never-solved task first, with the pool's probe attempts, and a further round draws only from the pool."""
    pool = TaskPool.start(TaskPoolConfig(num_active=4, window=2, min_attempts=2, probe_every=1, probe_samples=6),
                          task_ids=TASK_IDS, seed=0)
    hard, flat_one = pool.active[0], pool.active[1]
    pool.observe([synthetic_sample(hard, "s-1-hard", i, (0, 0), flat=True) for i in range(2)], step=-1)
    assert pool.unsolved == [hard] and len(pool.active) == 4
    actor = gated_actor(shared_actor, {}, flat=frozenset({hard, flat_one}))
    rollouts = rollouts_over([actor], over_sample=0.0, max_generation_rounds=2)
    rollouts.use_chooser(pool)
    trajectories, report = rollouts.collect(rollouts.submit(0, policy_version=0))
    groups: dict[str, list] = {}
    for t in trajectories:
        groups.setdefault(t.group_id, []).append(t)
    first = {g: ts for g, ts in groups.items() if "-r0-" in g}
    assert f"s0-r0-{hard}" in first and len(first[f"s0-r0-{hard}"]) == 6
    assert all(len(ts) == 2 for g, ts in first.items() if g != f"s0-r0-{hard}")
    assert {ts[0].task_id for ts in first.values()} <= {hard, *pool.active}
    further = [ts[0].task_id for g, ts in groups.items() if "-r1-" in g]
    assert report.rounds == 2 and further and set(further) <= set(pool.candidates()) and hard not in further
