"""Generation of a step's groups across the Ray session actors: over-sampling, carry-over, dynamic filtering.

`submit(step, policy_version=v)` starts the step's first round — one group of
`num_samples_per_task` attempts for each of the step's tasks, spread over the
actors — and returns at once, so the trainer can update on the previous batch
meanwhile. `collect(generation)` waits for it; while fewer than
`num_tasks_per_step` groups have reward variance, it samples further rounds
of fresh tasks (at most `max_generation_rounds`), each for the whole shortfall, but only where the
first round left fewer than `resample_below` of `num_tasks_per_step` groups with variance: a first
round with that much signal is trained as it is, one with less is topped up to the quota. Steps
before `resample_from_step` run their first round only.

The long tail (`[loop] over_sample`, docs/architecture.md "The long tail"). Agent sessions take
heavy-tailed times (lognormal, p99 ~10x the median), and a step that waits for all its groups waits
for its slowest one. With `over_sample = f` a step keeps `ceil(num_tasks_per_step * (1 + f))` groups
in flight; `collect` returns as soon as `num_tasks_per_step` of them have finished, with every group
finished by then, and carries the others into the next step: `submit` puts them in the next
generation and starts that many fresh groups fewer. A carried group keeps running where it runs; its
tokens keep the policy versions that generated them, and `build_batch`'s staleness bound
(`grpo.max_staleness`, from each sample's oldest turn) decides what of it is trained. A carried group
that build_batch would drop whatever happens — at `submit(step, trained_at=v)` it was started more
than `max_staleness` versions before `v`, the version the step is to be trained at, so its samples'
first turns are older than the bound (unless its sessions waited for a slot) — is cancelled
(`ray.cancel`: its sessions' attempts stop their sandboxes) instead of running on for nothing. (The
overlapped loop passes the version after the update under way: only when that update trains nothing
at all may a group be cancelled that would just have stayed within the bound.)
`cancel_carried()` cancels what is still running at the end of a run. `over_sample = 0` (the default)
waits for every group, as without carry-over.

A group whose session actor died under it (Ray's actor error: its node lost, its process killed) comes back
masked: each of its sessions an infra failure, never run again and never trained. Ray starts the actor again
(`[rollout] actor_max_restarts`), on the node that takes a lost one's place. A collect that met such a group,
and any submit while the tier watch (`use_tier_watch`: the driver's rl360cli/run/tier_watch.py) sees a requeue,
first waits (`[rollout] recovery_timeout_s`, then `RunFailed`) for the rollout tier to be live again (the
requeued tier's engines back in the router, its new nodes prewarmed) and for every actor to answer, so no step
is generated against a tier that is not there and masked whole. Only then is a lost group's cause known
(`actor_death_cause`): `node_lost` where its actor's node was lost (the tier says so, or Ray started the actor
on another node, or Ray says its node died), else `unknown` (a process that died on a node that lives).

`submit_eval(step, task_ids, n)` / `collect_eval(handle)` send held-out tasks (rl360cli/loop/eval.py)
to the same actors, one group of `n` attempts each, group ids `eval{step}-{task}` (`eval-before-{task}`
before the first step): no filtering, no further rounds, no carry-over, and nothing of it goes to
the trainer.

Test: tests/loop/test_carry_over.py (real Ray actors); benchmark: bench/bench_long_tail.py.
"""

from __future__ import annotations

import collections
import math
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from rl360cli.rl.trajectory import Trajectory
from rl360cli.rollout.lost_groups import actor_death_cause, lost_group, wait_actors
from rl360cli.rollout.routing import RouteTable, choose_actor

# How long the run's end waits for the actors to confirm the cancellation of carried groups.
CANCEL_WAIT_S = 30.0
# How often a collect that waits tells its progress (one `ray.wait` over the groups it waits for).
PROGRESS_EVERY_S = 1.0


class Progress(Protocol):
    def __call__(self, *, step: int, sessions_done: int, sessions_total: int) -> None: ...


class TierWatch(Protocol):
    """The rollout tier as new groups need it after a lost node (the driver's: rl360cli/run/tier_watch.py)."""

    def recovering(self) -> bool:
        """Whether a tier of the run is being requeued or was since the last `wait_live` (cheap: the state file)."""
        ...

    def wait_live(self, deadline: float) -> None:
        """Return once the tier serves again (its engines back, its new nodes prewarmed); `RunFailed` past
        `deadline` (time.monotonic())."""
        ...

    def lost_nodes(self) -> frozenset[str]:
        """The nodes the run's tiers lost so far."""
        ...

    def actor_nodes(self, actors: list) -> tuple[str, ...]:
        """The node each actor runs on now."""
        ...

    def route_table(self, actors: list) -> RouteTable | None:
        """The groups' routes with each actor's node now (an actor started again elsewhere has a new one)."""
        ...


class TaskChooser(Protocol):
    """Which tasks a step's groups attempt and with how many attempts, in place of a seeded draw from every
    task (the loop's adaptive pool, rl360cli/loop/task_pool.py)."""

    def tasks_for_step(self, step: int, count: int) -> list[str]: ...

    def candidates(self) -> list[str]:
        """The tasks a step's further rounds may draw."""
        ...

    def num_samples(self, task_id: str) -> int | None:
        """A group's attempts at `task_id` (None: `num_samples_per_task`)."""
        ...



@dataclass
class GroupInFlight:
    """One group handed to a session actor: its Ray object ref and what the loop knows about it."""

    ref: Any
    task_id: str
    group_id: str
    # The trainer's policy version when it was submitted: its sessions' first turns are generated on
    # it (on a newer one only if they wait for a session slot; engines never go back).
    policy_version: int
    # Its sessions, the index of the actor it went to, and that actor's node then (None: not known).
    num_samples: int = 0
    actor: int = -1
    actor_node: str | None = None
    submitted: float = field(default_factory=time.time)
    # (when the actor finished it, its serialized trajectories), fetched once.
    result: tuple[float, list[bytes]] | None = None
    # Its actor died under it (Ray's error): `result` holds no trajectory until `Rollouts` masks its sessions.
    lost: BaseException | None = None


@dataclass
class Generation:
    """The groups of one step in flight (those carried from earlier steps first), and when it started."""

    step: int
    groups: list[GroupInFlight] = field(default_factory=list)
    started: float = field(default_factory=time.time)
    rounds: int = 1
    # How many groups the step needs finished before it is collected (num_tasks_per_step; all for eval).
    quota: int = 0
    carried_in: int = 0
    # Groups cancelled when this generation was formed: carried ones that could only be stale.
    cancelled: list[str] = field(default_factory=list)

    @property
    def refs(self) -> list:
        return [g.ref for g in self.groups]

    def finished_at(self) -> float | None:
        """When the step's quota of groups had come back, or None while fewer have. Fetches each
        finished group's result once; `collect` reuses it."""
        import ray

        ready, _ = ray.wait(self.refs, num_returns=len(self.groups), timeout=0)
        ready = set(ready)
        _fetch([g for g in self.groups if g.ref in ready])
        times = sorted(g.result[0] for g in self.groups if g.result is not None)
        quota = min(self.quota or len(self.groups), len(self.groups))
        return times[quota - 1] if len(times) >= quota > 0 else None


@dataclass(frozen=True)
class GenerationReport:
    step: int
    seconds: float
    rounds: int
    num_groups: int
    first_round_rewards: list[float]
    # Carry-over: groups carried into the step, left running at its end (carried to the next) and
    # cancelled when it was submitted (their ids, for the ledger).
    carried_in: int = 0
    carried_out: tuple[str, ...] = ()
    cancelled: tuple[str, ...] = ()
    # Each collected group's time from its submission to its last sample's end, and each sample's
    # attempt time (`timings["total"]`), in seconds.
    group_seconds: tuple[float, ...] = ()
    session_seconds: tuple[float, ...] = ()

    def carry_figures(self) -> dict:
        """The step row's long-tail figures: carry-over counts, group and session time p50/p99."""
        return {
            "groups_carried_in": self.carried_in,
            "groups_carried_out": len(self.carried_out),
            "groups_cancelled_stale": len(self.cancelled),
            "group_s_p50": _percentile(self.group_seconds, 50),
            "group_s_p99": _percentile(self.group_seconds, 99),
            "session_s_p50": _percentile(self.session_seconds, 50),
            "session_s_p99": _percentile(self.session_seconds, 99),
        }


class Rollouts:
    """Hands a step's groups to the session actors (round robin, or by where the task's image is: `use_routing`)
    and collects them."""

    def __init__(self, actors: list, task_ids: list[str], *, num_tasks_per_step: int, num_samples_per_task: int,
                 max_generation_rounds: int, seed: int, over_sample: float = 0.0, resample_below: float = 1.0,
                 resample_from_step: int = 0, max_staleness: int | None = None, cancel_stale: bool = True,
                 recovery_timeout_s: float = 900.0):
        self.actors = actors
        self.task_ids = sorted(task_ids)
        self.num_tasks_per_step = num_tasks_per_step
        self.num_samples_per_task = num_samples_per_task
        self.max_generation_rounds = max_generation_rounds
        self.seed = seed
        self.over_sample = over_sample
        # Further rounds run where the first round left fewer groups than this with reward variance.
        self.enough_with_signal = _groups_for(resample_below * num_tasks_per_step)
        self.resample_from_step = resample_from_step
        self.max_staleness = max_staleness
        # False leaves stale carried groups running until build_batch drops them (for the benchmark).
        self.cancel_stale = cancel_stale
        # Groups still running after the last collect, waiting for the next step.
        self.carried: list[GroupInFlight] = []
        self._policy_version = 0
        self._next_actor = 0
        self.chooser: TaskChooser | None = None
        self.routing: RouteTable | None = None
        # With routing: each actor's groups sent and not known finished (ref, sessions), and how many groups went
        # to a warm node, a pinned one, another (a pull) or round robin.
        self._in_flight: list[list[tuple[Any, int]]] = [[] for _ in actors]
        self.routed: collections.Counter[str] = collections.Counter()
        # After a lost node: how long a submit waits for the tier and the actors, and who says whether it is live.
        self.recovery_timeout_s = recovery_timeout_s
        self.tier: TierWatch | None = None
        # Groups whose actor died under them, all steps; each actor's node (known through the tier watch).
        self.groups_lost = 0
        self.actor_nodes: tuple[str, ...] = ()

    def use_chooser(self, chooser: TaskChooser) -> None:
        """Steps submitted from now on draw their tasks, and each group's attempts, from `chooser`."""
        self.chooser = chooser

    def use_tier_watch(self, watch: TierWatch) -> None:
        """Submits wait for the rollout tier `watch` sees recovering (a requeue after a lost node) to be live, and
        a lost group's cause is told by the nodes it says (the actors' own and those lost)."""
        self.tier = watch
        self.actor_nodes = watch.actor_nodes(self.actors)

    def use_routing(self, table: RouteTable) -> None:
        """Groups sent from now on go to actors on nodes that hold their task's image (rl360cli/rollout/routing.py)."""
        self.routing = table

    def tasks_for_step(self, step: int, count: int | None = None) -> list[str]:
        """The step's fresh tasks: `num_tasks_per_step` of them (all, with fewer tasks) drawn from
        (seed, step), then, for a larger `count`, further distinct ones, and once every task is in,
        the same order again (a task's second group that step is `...-{task}.2`); a smaller `count`
        takes the first `count`. A pure function of (seed, task set, step, count). With a chooser
        (`use_chooser`), its tasks for the step."""
        if self.chooser is not None:
            return self.chooser.tasks_for_step(step, self.num_tasks_per_step if count is None else count)
        if self.num_tasks_per_step >= len(self.task_ids):
            chosen = list(self.task_ids)
        else:
            chosen = random.Random(self.seed * 100003 + step).sample(self.task_ids, self.num_tasks_per_step)
        if count is None or count <= len(chosen):
            return chosen[:count] if count is not None else chosen
        taken = set(chosen)
        rest = [t for t in self.task_ids if t not in taken]
        extra = random.Random(self.seed * 100003 + step + 50021).sample(rest, min(count - len(chosen), len(rest)))
        everything = chosen + extra
        return [everything[i % len(everything)] for i in range(count)] if everything else []

    def in_flight_for(self, num_groups: int) -> int:
        """How many groups to keep in flight so that `num_groups` finish without waiting for the tail."""
        return num_groups + _groups_for(num_groups * self.over_sample)

    def submit(self, step: int, *, policy_version: int = 0, trained_at: int | None = None) -> Generation:
        """Step `step`'s generation: the carried groups still worth running, then fresh ones up to
        `in_flight_for(num_tasks_per_step)`. `policy_version`: the trainer's version now (the new
        groups' tokens are this version or newer); `trained_at`: the version the step is to be
        trained at (`policy_version` if None; one more in the overlapped loop, where the step before
        trains first)."""
        self.when_live()
        self._policy_version = policy_version
        generation = Generation(step=step, quota=self.num_tasks_per_step)
        carried, self.carried = self.carried, []
        trained_at = policy_version if trained_at is None else trained_at
        stale = [g for g in carried if self._only_stale(g, trained_at)]
        # One that finished meanwhile joins anyway: build_batch judges its samples exactly.
        unfinished = _unfinished(stale)
        for group in carried:
            if group.ref in unfinished:
                generation.cancelled.append(group.group_id)
                _cancel(group)
            else:
                generation.groups.append(group)
        generation.carried_in = len(generation.groups)
        fresh = max(0, self.in_flight_for(self.num_tasks_per_step) - generation.carried_in)
        self._start_round(generation, self.tasks_for_step(step, fresh), round_index=0)
        return generation

    def collect(self, generation: Generation, *, progress: Progress | None = None) -> tuple[list[Trajectory],
                                                                                          GenerationReport]:
        """The trajectories of every group finished once the step's quota has; the unfinished ones
        are carried to the next `submit`. `progress(step=, sessions_done=, sessions_total=)` is told
        while it waits (sessions of the groups it waits for, later rounds included)."""
        pending = list(generation.groups)
        finished: list[GroupInFlight] = []
        n = self.num_samples_per_task

        def told(ready: int, wanted: int) -> None:
            progress(step=generation.step, sessions_done=(len(finished) + ready) * n,
                     sessions_total=(len(finished) + wanted) * n)

        # Without a listener the waits block as they did: no polling every PROGRESS_EVERY_S.
        waiting = told if progress is not None else None
        _wait_for(pending, finished, generation.quota or len(pending), waiting)
        self._mask_lost(finished)
        groups = [_decode(g.result[1]) for g in finished]
        first_round = [t.reward for g in groups for t in g if t.is_valid and t.segment == 0]
        done = {g[0].task_id for g in groups if g and _has_signal(g)}
        # A first round with enough signal, or of a step before resample_from_step, is trained as it
        # is; one without is topped up to the quota.
        short = len(done) < self.enough_with_signal and generation.step >= self.resample_from_step
        further_rounds = range(1, self.max_generation_rounds) if short else ()
        for round_index in further_rounds:
            if len(done) >= self.num_tasks_per_step:
                break
            missing = self.num_tasks_per_step - len(done)
            drawable = self.chooser.candidates() if self.chooser is not None else self.task_ids
            fresh = [t for t in drawable if t not in done]
            if not fresh:
                break
            rng = random.Random(self.seed * 7919 + generation.step * 31 + round_index)
            chosen = rng.sample(fresh, min(self.in_flight_for(missing), len(fresh)))
            before = len(generation.groups)
            self.when_live()
            self._start_round(generation, chosen, round_index=round_index)
            pending += generation.groups[before:]
            already = len(finished)
            _wait_for(pending, finished, min(missing, len(chosen)), waiting)
            self._mask_lost(finished[already:])
            more = [_decode(g.result[1]) for g in finished[already:]]
            groups += more
            done |= {g[0].task_id for g in more if g and _has_signal(g)}
            generation.rounds += 1
        self.carried = pending
        trajectories = [t for g in groups for t in g]
        report = GenerationReport(
            step=generation.step, seconds=time.time() - generation.started, rounds=generation.rounds,
            num_groups=len(groups), first_round_rewards=first_round, carried_in=generation.carried_in,
            carried_out=tuple(g.group_id for g in pending), cancelled=tuple(generation.cancelled),
            group_seconds=tuple(g.result[0] - g.submitted for g in finished),
            session_seconds=tuple(t.timings["total"] for t in trajectories if "total" in t.timings),
        )
        return trajectories, report

    def cancel_carried(self) -> list[str]:
        """Cancel every group still carried (the run's end: no step is left to train them); their ids."""
        import ray

        carried, self.carried = self.carried, []
        for group in carried:
            _cancel(group)
        if carried:  # a cancelled task resolves once the actor has cancelled it
            ray.wait([g.ref for g in carried], num_returns=len(carried), timeout=CANCEL_WAIT_S)
        return [g.group_id for g in carried]

    def submit_eval(self, step: int, task_ids: list[str], num_samples: int) -> Generation:
        """One group of `num_samples` attempts at each held-out task, after `step` (before the first for a
        negative one); returns at once."""
        self.when_live()
        generation = Generation(step=step)
        label = f"eval{step}" if step >= 0 else "eval-before"
        for task_id in task_ids:
            self._send(generation, task_id, f"{label}-{task_id}", num_samples)
        return generation

    def collect_eval(self, generation: Generation) -> list[Trajectory]:
        _fetch(generation.groups)
        self._mask_lost(generation.groups)
        return [t for g in generation.groups for t in _decode(g.result[1])]

    def when_live(self, *, after_loss: bool = False) -> None:
        """Before new groups are sent (and once a group was lost with its actor: `after_loss`), while the tier
        watch sees a requeue: wait for the rollout tier to be live again and for every actor to answer (Ray
        started the lost ones again, on the node that took a lost node's place), then route by the actors' nodes
        now. `RunFailed` past `recovery_timeout_s`, or at once for an actor that died for good."""
        recovering = self.tier is not None and self.tier.recovering()
        if not (after_loss or recovering):
            return
        deadline = time.monotonic() + self.recovery_timeout_s
        if self.tier is not None:
            self.tier.wait_live(deadline)
        wait_actors(self.actors, deadline, self.recovery_timeout_s)
        if self.tier is not None:
            # Again: an actor's call cut at once may come before the tier's requeue begins, and its actor back
            # with the requeue's Ray worker before the engines that restart beside it.
            self.tier.wait_live(deadline)
            self.actor_nodes = self.tier.actor_nodes(self.actors)
            if self.routing is not None:
                self.routing = self.tier.route_table(self.actors) or self.routing

    def _mask_lost(self, groups: list[GroupInFlight]) -> None:
        """Mask the sessions of the groups lost with their actor (`lost_group`), once the tier is live again:
        only then is it known whether their node was lost."""
        lost = [g for g in groups if g.lost is not None and not g.result[1]]
        if not lost:
            return
        self.groups_lost += len(lost)
        self.when_live(after_loss=True)
        lost_nodes = self.tier.lost_nodes() if self.tier is not None else frozenset()
        for group in lost:
            now = self.actor_nodes[group.actor] if 0 <= group.actor < len(self.actor_nodes) else None
            moved = group.actor_node is not None and now is not None and now != group.actor_node
            cause = actor_death_cause(group.lost, node_lost=moved or group.actor_node in lost_nodes)
            group.result = (group.result[0], lost_group(group.task_id, group.group_id, group.num_samples,
                                                        cause=cause, error=group.lost, node=group.actor_node))

    def _only_stale(self, group: GroupInFlight, trained_at: int) -> bool:
        """Whether build_batch must drop the carried `group`'s samples whenever they arrive: the step
        it would join trains at `trained_at` or later, and its sessions began (when submitted) on
        `group.policy_version` or an older one."""
        return (self.cancel_stale and self.max_staleness is not None
                and trained_at - group.policy_version > self.max_staleness)

    def _start_round(self, generation: Generation, task_ids: list[str], *, round_index: int) -> None:
        copies: dict[str, int] = {}
        for task_id in task_ids:
            copies[task_id] = copies.get(task_id, 0) + 1
            suffix = f".{copies[task_id]}" if copies[task_id] > 1 else ""
            chosen = self.chooser.num_samples(task_id) if self.chooser is not None else None
            self._send(generation, task_id, f"s{generation.step}-r{round_index}-{task_id}{suffix}",
                       chosen or self.num_samples_per_task)

    def _send(self, generation: Generation, task_id: str, group_id: str, num_samples: int) -> None:
        index = self._next_actor % len(self.actors)
        if self.routing is not None:
            load = self._sessions_in_flight()
            choice = choose_actor(self.routing, task_id, load=load, turn=self._next_actor)
            index = choice.actor
            self.routed[choice.rank] += 1
        self._next_actor += 1
        ref = self.actors[index].run_group.remote(task_id, group_id, num_samples)
        if self.routing is not None:
            self._in_flight[index].append((ref, num_samples))
        nodes = self.routing.actor_nodes if self.routing is not None else self.actor_nodes
        generation.groups.append(GroupInFlight(ref=ref, task_id=task_id, group_id=group_id,
                                               policy_version=self._policy_version, num_samples=num_samples,
                                               actor=index,
                                               actor_node=nodes[index] if index < len(nodes) else None))


    def _sessions_in_flight(self) -> list[int]:
        """Each actor's sessions of groups not finished (those that finished are forgotten here)."""
        import ray

        refs = [ref for sent in self._in_flight for ref, _ in sent]
        if refs:
            done, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
            finished = set(done)
            self._in_flight = [[(r, n) for r, n in sent if r not in finished] for sent in self._in_flight]
        return [sum(n for _, n in sent) for sent in self._in_flight]


def _groups_for(fraction_of_groups: float) -> int:
    """A count of groups from a fraction times a count, rounded up, less a hair: 30 x 0.1 is
    3.0000000000000004 in floating point, and means 3."""
    return math.ceil(fraction_of_groups - 1e-9)


def _wait_for(pending: list[GroupInFlight], finished: list[GroupInFlight], count: int,
              waiting: Callable[[int, int], None] | None = None) -> None:
    """Wait until `count` groups of `pending` have finished, then move every finished one (with its
    result) from `pending` to `finished`. `waiting(ready, wanted)` hears how many of the `wanted`
    have finished, every `PROGRESS_EVERY_S` while it waits and once at the end."""
    import ray

    if count <= 0 or not pending:
        return
    refs = [g.ref for g in pending]
    wanted = min(count, len(refs))
    while True:
        ready, _ = ray.wait(refs, num_returns=wanted, timeout=PROGRESS_EVERY_S if waiting else None)
        if waiting is not None:
            waiting(len(ready), wanted)
        if len(ready) >= wanted:
            break
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
    ready = set(ready)
    done = [g for g in pending if g.ref in ready]
    _fetch(done)
    finished += done
    pending[:] = [g for g in pending if g.ref not in ready]


def _fetch(groups: list[GroupInFlight]) -> None:
    """Fetch the results of finished groups that were not fetched yet (in one call unless an actor died); a
    group whose actor died under it keeps Ray's error (`lost`) and no trajectory yet (`Rollouts._mask_lost`)."""
    missing = [g for g in groups if g.result is None]
    for group, result in zip(missing, _get_each([g.ref for g in missing]) if missing else []):
        if isinstance(result, BaseException):
            group.result, group.lost = (time.time(), []), result
        else:
            group.result = result


def _get_each(refs: list) -> list:
    """`ray.get` of each ref: its value, or the actor error of a group whose session actor died with it."""
    import ray

    try:
        return ray.get(refs)
    except ray.exceptions.RayActorError:
        pass
    results = []
    for ref in refs:
        try:
            results.append(ray.get(ref))
        except ray.exceptions.RayActorError as e:
            results.append(e)
    return results


def _unfinished(groups: list[GroupInFlight]) -> set:
    """The refs of those of `groups` still running."""
    import ray

    if not groups:
        return set()
    _, running = ray.wait([g.ref for g in groups], num_returns=len(groups), timeout=0)
    return set(running)


def _cancel(group: GroupInFlight) -> None:
    """Cancel a running group: Ray cancels the actor's task, whose sessions stop their sandboxes."""
    import ray

    ray.cancel(group.ref)


def _decode(blobs: list[bytes]) -> list[Trajectory]:
    return [Trajectory.from_bytes(b) for b in blobs]


def _has_signal(group: list[Trajectory]) -> bool:
    """Two or more valid samples whose rewards differ: GRPO can learn from the group."""
    rewards = [t.reward for t in group if t.is_valid and t.segment == 0]  # a session counts once
    return len(rewards) >= 2 and statistics.pvariance(rewards) > 0


def _percentile(values: tuple[float, ...], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None
