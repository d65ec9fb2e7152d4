"""Generation of a step's groups across the Ray session actors, with dynamic filtering.

`submit(step)` starts the step's first round — one group of
`num_samples_per_task` attempts for each of the step's tasks, spread over the
actors — and returns at once, so the trainer can update on the previous batch
meanwhile. `collect(handle)` waits for it; while fewer than
`num_tasks_per_step` groups have reward variance, it samples further rounds
of fresh tasks (at most `max_generation_rounds`).

`submit_eval(step, task_ids, n)` / `collect_eval(handle)` send held-out tasks (rl360cli/loop/eval.py)
to the same actors, one group of `n` attempts each, group ids `eval{step}-{task}`: no filtering, no
further rounds, and nothing of it goes to the trainer.
"""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass, field

from rl360cli.rl.trajectory import Trajectory


@dataclass
class Generation:
    """The groups of one step in flight: object refs from the actors, and when it started."""

    step: int
    refs: list = field(default_factory=list)
    task_ids: list[str] = field(default_factory=list)
    started: float = field(default_factory=time.time)
    rounds: int = 1

    def finished_at(self) -> float | None:
        """When the first round's last group came back, or None while it is still running."""
        import ray

        ready, pending = ray.wait(self.refs, num_returns=len(self.refs), timeout=0)
        if pending:
            return None
        return max(finished for finished, _ in ray.get(ready))


@dataclass(frozen=True)
class GenerationReport:
    step: int
    seconds: float
    rounds: int
    num_groups: int
    first_round_rewards: list[float]


class Rollouts:
    """Hands a step's groups to the session actors, round robin, and collects them."""

    def __init__(self, actors: list, task_ids: list[str], *, num_tasks_per_step: int, num_samples_per_task: int,
                 max_generation_rounds: int, seed: int):
        self.actors = actors
        self.task_ids = sorted(task_ids)
        self.num_tasks_per_step = num_tasks_per_step
        self.num_samples_per_task = num_samples_per_task
        self.max_generation_rounds = max_generation_rounds
        self.seed = seed
        self._next_actor = 0

    def tasks_for_step(self, step: int) -> list[str]:
        if self.num_tasks_per_step >= len(self.task_ids):
            return list(self.task_ids)
        return random.Random(self.seed * 100003 + step).sample(self.task_ids, self.num_tasks_per_step)

    def submit(self, step: int) -> Generation:
        generation = Generation(step=step)
        self._start_round(generation, self.tasks_for_step(step), round_index=0)
        return generation

    def collect(self, generation: Generation) -> tuple[list[Trajectory], GenerationReport]:
        import ray

        groups = [_decode(ray.get(ref)[1]) for ref in generation.refs]
        first_round = [t.reward for g in groups for t in g if t.is_valid]
        done = {t[0].task_id for t in groups if t and _has_signal(t)}
        for round_index in range(1, self.max_generation_rounds):
            missing = self.num_tasks_per_step - len(done)
            if missing <= 0:
                break
            fresh = [t for t in self.task_ids if t not in done]
            if not fresh:
                break
            rng = random.Random(self.seed * 7919 + generation.step * 31 + round_index)
            extra = Generation(step=generation.step)
            self._start_round(extra, rng.sample(fresh, min(missing, len(fresh))), round_index=round_index)
            more = [_decode(ray.get(ref)[1]) for ref in extra.refs]
            groups += more
            done |= {g[0].task_id for g in more if g and _has_signal(g)}
            generation.rounds += 1
        trajectories = [t for g in groups for t in g]
        report = GenerationReport(step=generation.step, seconds=time.time() - generation.started,
                                  rounds=generation.rounds, num_groups=len(groups), first_round_rewards=first_round)
        return trajectories, report

    def submit_eval(self, step: int, task_ids: list[str], num_samples: int) -> Generation:
        """One group of `num_samples` attempts at each held-out task, after `step`; returns at once."""
        generation = Generation(step=step)
        for task_id in task_ids:
            self._send(generation, task_id, f"eval{step}-{task_id}", num_samples)
        return generation

    def collect_eval(self, generation: Generation) -> list[Trajectory]:
        import ray

        return [t for ref in generation.refs for t in _decode(ray.get(ref)[1])]

    def _start_round(self, generation: Generation, task_ids: list[str], *, round_index: int) -> None:
        for task_id in task_ids:
            self._send(generation, task_id, f"s{generation.step}-r{round_index}-{task_id}", self.num_samples_per_task)

    def _send(self, generation: Generation, task_id: str, group_id: str, num_samples: int) -> None:
        actor = self.actors[self._next_actor % len(self.actors)]
        self._next_actor += 1
        generation.refs.append(actor.run_group.remote(task_id, group_id, num_samples))
        generation.task_ids.append(task_id)


def _decode(blobs: list[bytes]) -> list[Trajectory]:
    return [Trajectory.from_bytes(b) for b in blobs]


def _has_signal(group: list[Trajectory]) -> bool:
    """Two or more valid samples whose rewards differ: GRPO can learn from the group."""
    rewards = [t.reward for t in group if t.is_valid]
    return len(rewards) >= 2 and statistics.pvariance(rewards) > 0
