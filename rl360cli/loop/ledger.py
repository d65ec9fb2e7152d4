"""The step ledger: which groups each trained step consumed, so that a resume neither repeats nor
loses work and anyone can check that it did not.

`ledger.jsonl` in the run folder gets one line per finished step:

    {"step": 3, "policy_version": 4, "tasks": [...], "groups": ["s3-r0-t07", ...], "generated": [...],
     "carried": ["s3-r0-t11", ...], "cancelled": ["s1-r0-t02", ...],
     "samples": ["s3-r0-t07-0", ...], "rewards": [1.0, ...], "masked": {"s3-r0-t02-3": "engine_error"}}

`groups` are the groups the update trained on (those left after masking and filtering), `tasks`
their task ids, `generated` every group whose samples the step collected (with `[loop] over_sample`,
groups carried in from earlier steps among them: a group is recorded in the step that collected and
trained it, never in the step it was started for), `carried` the groups still running at the step's
end (carried into the next step), `cancelled` the carried groups cancelled when the step was
submitted (they could only be stale) or at the run's last step, `samples` the samples trained,
`rewards` their verifiers' rewards (in the order of `samples`: a float each, so that a fault's
victims can be judged without a second file), `masked` each infra-failed sample with its cause; a
sample of a `generated` group that is in neither was filtered (zero-variance group, stale, too few
valid). bench/chaos.py checks a fault's victims against them. A group carried at a checkpoint
belongs to no step: a resume does not restart it; the resumed step draws fresh groups instead
(docs/reliability.md "Lossless resume"). The same entries travel inside each
checkpoint (`loop_state["ledger"]`); on resume the file is rewritten, atomically, to the newest
checkpoint's entries, so steps a dead trainer finished after its last checkpoint (whose updates
died with it) leave the file and are trained again, once. The loop's sampler is a pure function of
(seed, task set, step), so what a checkpoint must hold about it is only that identity
(`sampler_identity`): a resume with another seed or another task set is refused.

    ledger = StepLedger(run_dir / "ledger.jsonl")
    ledger.restore(checkpoint_state.get("ledger", []))
    ledger.append(entry)
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from rl360cli.errors import Rl360Error


class StepLedger:
    """The run's `ledger.jsonl`: appended per step, rewritten to a checkpoint's entries on resume."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.entries: list[dict] = []

    def restore(self, entries: list[dict]) -> None:
        """Make the file hold exactly `entries` (temp file, fsync, rename: never a torn ledger)."""
        self.entries = [dict(e) for e in entries]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "w") as f:
            f.writelines(json.dumps(e, sort_keys=True) + "\n" for e in self.entries)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def append(self, entry: dict) -> None:
        """One finished step, flushed to disk before the loop goes on."""
        self.entries.append(dict(entry))
        with open(self.path, "a") as f:
            f.write(json.dumps(entry, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def steps_without_signal(self) -> int:
        """How many of the last entries in a row trained no group (the spinning guard's count)."""
        count = 0
        for entry in reversed(self.entries):
            if entry["groups"]:
                break
            count += 1
        return count


def read_ledger(path: Path) -> list[dict]:
    """The entries of a ledger file (for tests and tools)."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def step_entry(step: int, *, policy_version: int, trained_groups: list[str], trained_tasks: list[str],
               generated_groups: list[str], carried_groups: Sequence[str] = (),
               cancelled_groups: Sequence[str] = (), trained_samples: Mapping[str, float] | None = None,
               masked_samples: Mapping[str, str] | None = None) -> dict:
    """Samples are named as their attempts are (`<group>-<index>`, the sandboxes' `rl360.attempt` label),
    so a fault's victims can be looked up: `trained_samples` (sample -> reward) become `samples` and
    `rewards`, `masked` (sample -> infra cause)."""
    trained = sorted((trained_samples or {}).items())
    return {"step": step, "policy_version": policy_version, "groups": sorted(set(trained_groups)),
            "tasks": sorted(set(trained_tasks)), "generated": sorted(set(generated_groups)),
            "carried": sorted(set(carried_groups)), "cancelled": sorted(set(cancelled_groups)),
            "samples": [sample for sample, _ in trained],
            "rewards": [None if reward is None else float(reward) for _, reward in trained],
            "masked": dict(sorted((masked_samples or {}).items()))}


def trained_rewards(entry: dict) -> dict[str, float]:
    """sample -> reward of the samples an entry trained (entries written before rewards were kept: none)."""
    return dict(zip(entry.get("samples", []), entry.get("rewards", [])))


def sampler_identity(*, seed: int, task_ids: list[str]) -> dict:
    """What fixes the groups of every step: the seed and the task set (by count and digest)."""
    digest = hashlib.sha256("\n".join(sorted(task_ids)).encode()).hexdigest()[:16]
    return {"seed": seed, "num_tasks": len(task_ids), "tasks_digest": digest}


def check_same_sampler(recorded: dict | None, current: dict, *, checkpoint: Path) -> None:
    """Refuse a resume whose seed or task set differs from the checkpoint's: its steps would draw
    other groups, so some would be trained twice and others never."""
    if recorded is None or recorded == current:
        return
    raise Rl360Error(
        f"checkpoint {checkpoint} was written with seed {recorded.get('seed')} and "
        f"{recorded.get('num_tasks')} tasks (digest {recorded.get('tasks_digest')}); this run has seed "
        f"{current['seed']} and {current['num_tasks']} tasks (digest {current['tasks_digest']})",
        fix="resume with the recipe's original [run] seed and [tasks] (path, include), or start a new run",
    )
