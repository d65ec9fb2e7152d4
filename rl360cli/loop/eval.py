"""Evaluation during training: held-out tasks (`[eval]`), attempted through the run's own engines and
sandboxes before the first step (`at_start`), after every `every`-th step and after the last, scored by
unbiased pass@1 and pass@k.

    evaluation = Evaluation.from_config(recipe.eval, pass_threshold=recipe.grpo.pass_threshold)  # None: off
    figures = evaluation.run(rollouts, step=step, policy_version=trainer.version)
    # {"eval/pass@1": 0.41, "eval/pass@k": 0.75, "eval/k": 4, "eval/step": 9, ...}

The train loop (train_loop.py) calls it after a step's update and weight sync, so every sample comes
from the policy that step produced, and puts the figures into that step's metrics row (metrics.jsonl,
W&B, the live view). Before the first step it evaluates policy v0 alone on the engines (step 0 is
submitted after it) and logs a row of its own, step `BEFORE_TRAINING_STEP` (-1; the report and the
live view show it as "before training"). The samples never reach `build_batch`, the ledger or samples.jsonl: nothing is
trained on them. A sample whose infrastructure failed has no verdict: it is left out of its task's n
and counted in `eval/infra_failures` (by cause); a task with fewer than k valid samples is left out
of pass@k (`eval/tasks_short_of_k`), one with none out of pass@1 too. Per task tag (a task's `[metadata] tags`,
as the training figures' domains, domains.py), `eval/pass@1/domain/<tag>` over that tag's tasks: which kinds of
held-out task moved.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

from rl360cli.loop.config import EvalConfig
from rl360cli.rl.passk import mean_pass_at_k
from rl360cli.rl.trajectory import Trajectory
from rl360cli.sandbox.task_loader import load_task_set


@dataclass(frozen=True)
class Evaluation:
    config: EvalConfig
    task_ids: tuple[str, ...]
    # A sample passes with a reward at least this (`[grpo] pass_threshold`, as the training pass rate counts).
    pass_threshold: float = 1.0

    @classmethod
    def from_config(cls, config: EvalConfig, *, pass_threshold: float = 1.0) -> Evaluation | None:
        """The evaluation of `[eval]` (its task set read as the session actors read it), None when off."""
        if not config.active:
            return None
        # A held-out task rl360 refuses is left out, as the session actors leave it out.
        task_ids = tuple(t.id for t in load_task_set(Path(config.path), include=config.include, refused={}))
        return cls(config, task_ids, pass_threshold)

    def due(self, step: int, num_steps: int) -> bool:
        return self.config.due(step, num_steps)

    def due_at_start(self, start_step: int) -> bool:
        return self.config.due_at_start(start_step)

    def run(self, rollouts, *, step: int, policy_version: int) -> dict:
        """Attempt every held-out task `num_samples_per_task` times on the engines' current policy and
        wait for the verdicts; the figures of `eval_metrics`."""
        started = time.time()
        generation = rollouts.submit_eval(step, list(self.task_ids), self.config.num_samples_per_task)
        trajectories = rollouts.collect_eval(generation)
        figures = eval_metrics(trajectories, k=self.config.k, step=step, policy_version=policy_version,
                               pass_threshold=self.pass_threshold)
        figures["eval/s"] = time.time() - started
        return figures


def eval_metrics(trajectories: list[Trajectory], *, k: int, step: int, policy_version: int,
                 pass_threshold: float = 1.0) -> dict:
    """The held-out figures of one evaluation: a sample passes with reward >= `pass_threshold`. A session is one
    sample, however many segments it made."""
    trajectories = [t for t in trajectories if t.segment == 0]
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])  # task -> [valid samples n, passed c]
    tags: dict[str, set[str]] = defaultdict(set)  # tag -> its tasks
    infra = Counter()
    for t in trajectories:
        counts[t.task_id]  # a task all of whose samples failed is still one of the set
        for tag in t.metadata.get("tags") or ():
            tags[str(tag)].add(t.task_id)
        if not t.is_valid:  # an infra failure (with its cause): no verdict on the policy
            infra[t.cause.value if t.cause is not None else "unknown"] += 1
            continue
        counts[t.task_id][0] += 1
        counts[t.task_id][1] += int(t.reward >= pass_threshold)
    scored = [(n, c) for n, c in counts.values()]
    valid = [t for t in trajectories if t.is_valid]
    figures = {
        "eval/step": step,
        "eval/policy_version": policy_version,
        "eval/k": k,
        "eval/num_tasks": len(counts),
        "eval/num_samples": len(trajectories),
        "eval/pass@1": mean_pass_at_k(scored, 1),
        "eval/pass@k": mean_pass_at_k(scored, k),
        "eval/reward_mean": sum(t.reward for t in valid) / len(valid) if valid else None,
        "eval/tasks_short_of_k": sum(1 for n, _ in scored if n < k),
        "eval/infra_failures": sum(infra.values()),
        "eval/infra_failures_by_cause": dict(infra),
    }
    for tag, task_ids in sorted(tags.items()):
        figures[f"eval/pass@1/domain/{tag}"] = mean_pass_at_k([counts[task] for task in sorted(task_ids)], 1)
    return figures
