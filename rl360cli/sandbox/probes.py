"""Verifier probes: attempts a verifier must not pass, for `rl360 tasks check --probe`.

The oracle shows a verifier can say 1 and the no-op that it can say 0; neither shows it says 1 only
for the right answer. After them, four probes each run in a fresh sandbox, and each must score below 1:

- `empty`: every output file exists and is empty;
- `garbage`: every output file holds the same 64 printable characters of noise;
- `echo`: every output file holds the task's instruction (an agent that repeats the prompt);
- `moved`: the oracle runs, then each output file is moved aside (`<file>.rl360-aside`): the work was
  done and the answer is not where it belongs.

The output files are what the oracle wrote: `recording_oracle` runs solve.sh after marking the time, then
lists the regular files modified since, outside the system's folders and rl360's own (/tests, /solution,
/logs, /tmp, /proc, ...), at most `MAX_OUTPUTS` of them. A probe writes them as the task's agent user.

What a probe can show: a verifier that passes a file's mere presence, size or any content (`[ -s out ]`),
one that passes the prompt repeated, one that does not look at the output at all (passes with it moved
aside). What it cannot: a verifier that passes a plausible wrong answer, a memorised answer of another
task, or an answer in a file the oracle did not write (an oracle that prints its answer and writes
nothing gives the first three probes no file: they then change nothing and score as the no-op does). A
probe at 1 is a verifier to fix; all probes below 1 is no proof the verifier is sound. docs/sandboxes.md,
"Verifier probes".

Used by sandbox/check.py. Test: tests/sandbox/test_probes.py.
"""

from __future__ import annotations

import random
import shlex
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from rl360cli.sandbox.attempt import oracle_agent
from rl360cli.sandbox.provider import ExecResult, Sandbox
from rl360cli.sandbox.task import Step, Task

PROBES = ("empty", "garbage", "echo", "moved")
MAX_OUTPUTS = 50
ASIDE = ".rl360-aside"
# The folders whose files are never an answer: the system's, rl360's own, the agent's scratch.
_PRUNED = ("/proc", "/sys", "/dev", "/usr", "/lib", "/lib32", "/lib64", "/libx32", "/bin", "/sbin", "/etc",
           "/var", "/run", "/tmp", "/boot", "/tests", "/solution", "/logs", "/root", "/home", "/opt/conda",
           "/.dockerenv")  # Docker's own marker, touched as a container starts its commands
_MARK = "/tmp/.rl360-probe-mark"
# One second back, so that a file written in the mark's own second still counts as newer (busybox's
# `find -newer` compares whole seconds).
MARK_COMMAND = f'touch -d "@$(($(date +%s) - 1))" {_MARK} 2>/dev/null || {{ touch {_MARK} && sleep 1; }}'
_PRUNE = " -o ".join(f"-path {p}" for p in _PRUNED)
LIST_COMMAND = f"find / \\( {_PRUNE} \\) -prune -o -type f -newer {_MARK} -print 2>/dev/null | head -n {MAX_OUTPUTS}"


@dataclass(kw_only=True, slots=True)
class Outputs:
    """What the recording oracle wrote, per step (None: a single-step task)."""

    files: dict[str | None, list[str]] = field(default_factory=dict)

    def of(self, step: Step | None) -> list[str]:
        return self.files.get(step.name if step is not None else None, [])

    @property
    def any(self) -> bool:
        return any(self.files.values())


def recording_oracle(task: Task, outputs: Outputs, *, runs: list[ExecResult] | None = None):
    """The oracle, noting in `outputs` the files each of its solve.sh runs wrote (and in `runs` each run)."""
    oracle = oracle_agent(task, runs=runs)

    async def agent(sandbox: Sandbox, step: Step | None = None) -> None:
        await sandbox.exec(MARK_COMMAND, timeout_s=30, user="root")
        await (oracle(sandbox) if step is None else oracle(sandbox, step))
        listed = await sandbox.exec(LIST_COMMAND, timeout_s=120, user="root")
        files = [line for line in listed.output.splitlines() if line.startswith("/") and not line.endswith(ASIDE)]
        outputs.files[step.name if step is not None else None] = sorted(files)

    return agent


def probe_agent(task: Task, probe: str, outputs: Outputs):
    """The agent of `probe` (one of PROBES), writing the files `outputs` recorded for each step."""
    if probe not in PROBES:
        raise ValueError(f"probe must be one of {', '.join(PROBES)} (got {probe!r})")
    oracle = oracle_agent(task)

    async def agent(sandbox: Sandbox, step: Step | None = None) -> None:
        files = outputs.of(step)
        user = task.agent_user if step is None else step.agent_user
        if probe == "moved":
            await (oracle(sandbox) if step is None else oracle(sandbox, step))
            if files:
                moves = "; ".join(f"mv -f {shlex.quote(f)} {shlex.quote(f + ASIDE)}" for f in files)
                await sandbox.exec(moves, timeout_s=60, user=user)
            return
        if not files:
            return
        content = {"empty": "", "garbage": garbage(task.id), "echo": step.instruction if step else task.instruction}
        with tempfile.TemporaryDirectory(prefix="rl360-probe-") as tmp:
            local = Path(tmp) / "content"
            local.write_text(content[probe])
            await sandbox.upload(local, "/tmp/.rl360-probe-content")
        writes = "; ".join(f"mkdir -p {shlex.quote(str(Path(f).parent))}; "
                           f"cat /tmp/.rl360-probe-content > {shlex.quote(f)}" for f in files)
        await sandbox.exec(writes + "; rm -f /tmp/.rl360-probe-content", timeout_s=60, user=user)

    return agent


def garbage(seed: str) -> str:
    """64 printable characters of noise, the same for a task each time (a check can be run again)."""
    pick = random.Random(seed)
    return "".join(pick.choice("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 #%&*+-=") for _ in
                   range(64)) + "\n"

