"""`rl360 tasks check`: validate a task set before any GPU is spent on it.

For each task, two attempts go through the verifier: the oracle (its
`solution/solve.sh`; in a multi-step task each step's
`steps/<name>/solution/solve.sh`, the steps' rewards combined by Harbor's
rule) must reach reward 1, and a no-op (an agent that does nothing) must not.
A task without a solution fails the check; one that no node can hold (GPUs,
MCP sidecars) fails it with the reason, and so does one rl360 refuses to load
(`refused_row`): its own row, the others checked all the same. Attempts run
concurrently through the admission controller of the chosen provider.

With `probe=True` the oracle also notes the files it wrote, and then four
probes (probes.py: empty, garbage, the instruction echoed into those files,
and the oracle's files moved aside) must each score below 1; one that reaches
1 is a problem naming the probe.

Test: tests/sandbox/test_cli.py.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rl360cli.errors import Rl360Error
from rl360cli.outcome import Outcome
from rl360cli.sandbox.attempt import AttemptResult, noop_agent, oracle_agent, run_attempt
from rl360cli.sandbox.probes import PROBES, Outputs, probe_agent, recording_oracle
from rl360cli.sandbox.provider import ExecResult
from rl360cli.sandbox.task import Task

# A reward at least this close to 1 counts as reaching 1 (rewards are floats from a file).
_ONE = 1 - 1e-9


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckRow:
    task: str
    oracle: AttemptResult | None
    noop: AttemptResult | None  # None only for a refused task
    seconds: float
    # Why the task was refused at load (its one line, with the fix): nothing of it ran.
    refused: str | None = None
    # `--probe`: each probe's attempt (probes.py), and the files the oracle wrote that they wrote to.
    probes: dict[str, AttemptResult] = field(default_factory=dict)
    outputs: tuple[str, ...] = ()
    # The tail of what the oracle's solve.sh printed, with its exit code (each step's, in a multi-step task).
    oracle_output: str = ""

    @classmethod
    def refused_row(cls, task: str, error: Rl360Error) -> CheckRow:
        return cls(task=task, oracle=None, noop=None, seconds=0.0,
                   refused=error.problem + (f"; {error.fix}" if error.fix else ""))

    @property
    def problems(self) -> list[str]:
        if self.refused is not None or self.noop is None:
            return [f"refused: {self.refused}"]
        out = []
        if self.oracle is None:
            out.append("no solution/solve.sh")
        elif self.oracle.outcome != Outcome.OK:
            out.append(f"oracle: {_what(self.oracle)}")
        elif self.oracle.reward < _ONE:
            # A verifier the egress proxy refused (or failed) says so: that is the line to read.
            seen = self.oracle.egress
            egress = seen.lines[0] if seen and (seen.denied or seen.failed) and seen.lines else ""
            out.append(f"oracle reward {self.oracle.reward:g} < 1" + (f" ({egress})" if egress else ""))
        if self.noop.outcome != Outcome.OK:
            out.append(f"no-op: {_what(self.noop)}")
        elif self.noop.reward >= _ONE:
            out.append(f"no-op reward {self.noop.reward:g} reaches 1: the tests pass without any work")
        for name, result in self.probes.items():
            if result.outcome != Outcome.OK:
                out.append(f"probe {name}: {_what(result)}")
            elif result.reward >= _ONE:
                out.append(f"probe {name} scored {result.reward:g}: {_FOOLED[name]}")
        return out

    @property
    def passed(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        def attempt(r: AttemptResult | None) -> dict | None:
            if r is None:
                return None
            return {"outcome": r.outcome.value, "cause": r.cause.value if r.cause else None, "reward": r.reward,
                    "rewards": r.rewards, "detail": r.detail, "node": r.node,
                    "timings": {k: round(v, 4) for k, v in r.timings.items()},
                    "egress": r.egress.to_json() if r.egress else None,
                    **({"steps": list(r.steps)} if r.steps else {}),
                    # Why a verifier scored what it did (its output's tail): where a failing check is read.
                    "verifier_output": r.verifier_output}

        oracle = attempt(self.oracle)
        if oracle is not None:
            # What solve.sh itself printed: why an oracle that the verifier failed did not do its work.
            oracle["solve_output"] = self.oracle_output

        return {"task": self.task, "passed": self.passed, "problems": self.problems, "seconds": round(self.seconds, 3),
                "oracle": oracle, "noop": attempt(self.noop), "refused": self.refused,
                **({"probes": {k: attempt(v) for k, v in self.probes.items()}, "outputs": list(self.outputs)}
                   if self.probes else {})}


async def check_tasks(provider, tasks: Sequence[Task], *, run_id: str, concurrency: int = 4,
                      probe: bool = False, artifacts_dir: Path | None = None) -> list[CheckRow]:
    """Oracle and no-op attempts of every task (at most `concurrency` tasks at once), in the tasks' order;
    with `probe`, then the probes of a task whose oracle passed. `artifacts_dir`: each attempt's artifacts are
    kept in `<artifacts_dir>/<task>/<attempt>/` (oracle, noop, probe-...), as Harbor keeps a trial's."""
    gate = asyncio.Semaphore(concurrency)
    labels = {"rl360.run": run_id, "rl360.check": "true"}

    async def attempt(task: Task, agent, kind: str) -> AttemptResult:
        kept = {"artifacts_dir": artifacts_dir / task.id / kind} if artifacts_dir is not None else {}
        run = getattr(provider, "run_attempt", None)
        if run is not None:
            # Through the admission controller: a lost node is retried elsewhere (these agents can start over).
            return await run(task, agent, attempt_id=f"{run_id}-{task.id}-{kind}", labels=labels, rerun_agent=True,
                             **kept)

        return await run_attempt(provider, task, agent, attempt_id=f"{run_id}-{task.id}-{kind}", labels=labels,
                                 **kept)

    async def one(task: Task) -> CheckRow:
        async with gate:
            began = time.monotonic()
            outputs = Outputs()
            solve_runs: list[ExecResult] = []
            agent = recording_oracle(task, outputs, runs=solve_runs) if probe else oracle_agent(task, runs=solve_runs)
            oracle_run = attempt(task, agent, "oracle") if task.has_solution else None
            noop_run = attempt(task, noop_agent, "noop")
            if oracle_run is not None:
                oracle, noop = await asyncio.gather(oracle_run, noop_run)
            else:
                oracle, noop = None, await noop_run
            probes: dict[str, AttemptResult] = {}
            if probe and outputs.any and oracle is not None and oracle.outcome == Outcome.OK and oracle.reward >= _ONE:
                # Only a verifier that passes the right answer can be asked whether it passes wrong ones, and
                # only about files the oracle wrote (with none, each probe would be the no-op or the oracle).
                results = await asyncio.gather(*(attempt(task, probe_agent(task, name, outputs), f"probe-{name}")
                                                 for name in PROBES))
                probes = dict(zip(PROBES, results, strict=True))
            return CheckRow(task=task.id, oracle=oracle, noop=noop, seconds=time.monotonic() - began, probes=probes,
                            outputs=tuple(f for files in outputs.files.values() for f in files),
                            oracle_output=solve_output(solve_runs))

    return list(await asyncio.gather(*(one(t) for t in tasks)))


# What a verifier that a probe fooled passes, for the check's line.
_FOOLED = {
    "empty": "the verifier passes empty output files",
    "garbage": "the verifier passes output files holding noise",
    "echo": "the verifier passes the instruction echoed into the output files",
    "moved": "the verifier passes with the oracle's output files moved aside (it does not read them)",
}


def solve_output(runs: Sequence[ExecResult], limit: int = 4000) -> str:
    """The solve.sh runs of one oracle attempt as `tasks check --json` shows them: each run's exit code and
    output, the last `limit` characters of it all (an attempt retried on another node shows every try)."""
    text = "\n".join(f"[solve.sh exit {r.exit_code}{', timed out' if r.timed_out else ''}]\n{r.output}" for r in runs)
    return text[-limit:]


def _what(result: AttemptResult) -> str:
    cause = f" ({result.cause.value})" if result.cause else ""
    return f"{result.outcome.value}{cause}: {result.detail}"
