"""A test-only fault hook: the trainer process dies at a named point of a named step.

    RL360_FAULT_POINT=after_update@3 python -m rl360cli.run.driver ...

makes the process `os._exit(FAULT_EXIT)` when it reaches `after_update` in step 3 (0-based), with
nothing flushed and nothing cleaned up, as a SIGKILL or a preempted node would leave it. The
resume tests (tests/loop/test_resume_ledger.py) use it to kill the trainer at exact places that a
signal from outside could only hit by luck. Unset (always, outside those tests) it costs one
dictionary lookup per point.

Points, in the order a step reaches them (train_loop.py, torch_trainer.py):
- `before_update`: the step's batch is built, the optimizer has not run;
- `after_update`: the update and the weight broadcast ran, the step's ledger line is not written;
- `checkpoint_write`: the checkpoint's files are all written in their staging folder, not renamed in;
- `after_checkpoint`: the checkpoint is in place, the run record not yet told.
"""

from __future__ import annotations

import os

FAULT_ENV = "RL360_FAULT_POINT"
FAULT_EXIT = 86
"""The exit status of a process the hook ended (what the tests expect to see)."""

POINTS = ("before_update", "after_update", "checkpoint_write", "after_checkpoint")


def fault_point(name: str, step: int) -> None:
    """Die here if RL360_FAULT_POINT names this point and step (`name@step`)."""
    wanted = os.environ.get(FAULT_ENV)
    if wanted and wanted == f"{name}@{step}":
        print(f"[fault] {FAULT_ENV}={wanted}: exiting at {name} of step {step}", flush=True)
        os._exit(FAULT_EXIT)
