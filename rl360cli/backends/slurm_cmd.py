"""Running Slurm's command-line tools (sinfo, squeue, sacct, scancel) and reading what they print.

Every call has a timeout, runs with the profile's SLURM_CONF, and turns the
usual failures into one-line errors that name the fix: the tool is not on
PATH, slurmctld does not answer, accounting (slurmdbd) is off. The parsers
read the `-P`/`-o "%x|%y"` forms of the tools' output into plain dicts.

    python -m pytest tests/slurm/test_slurm_cmd.py
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

from rl360cli.errors import Rl360Error

# Job states after which a job (or step) never runs again.
ENDED = frozenset({"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
                   "BOOT_FAIL", "DEADLINE", "REVOKED", "SPECIAL_EXIT"})
# Job states of a job that holds, or waits for, its allocation.
ACTIVE = frozenset({"PENDING", "CONFIGURING", "RUNNING", "SUSPENDED", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED",
                    "RESIZING", "SIGNALING", "STAGE_OUT", "RESV_DEL_HOLD", "STOPPED"})
_UNREACHABLE = ("Unable to contact slurm controller", "Connection refused", "Socket timed out",
                "Zero Bytes were transmitted", "Communication connection failure")
_NO_CLIENT_FIX = "install the Slurm client tools (Debian: slurm-client) or run rl360 on a login node"


class SlurmUnreachable(Rl360Error):
    """slurmctld (or slurmdbd, for sacct) does not answer."""


class SlurmCommandFailed(Rl360Error):
    """A Slurm command ran and said no."""

    def __init__(self, problem: str, fix: str | None = None, *, stderr: str = ""):
        super().__init__(problem, fix)
        self.stderr = stderr


def expand(text: str) -> str:
    """`${VAR:-default}`, `$VAR` and `~` expanded, so a profile can say where a dev cluster lives."""
    text = re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: os.environ.get(m.group(1)) or m.group(2), text)
    return os.path.expanduser(os.path.expandvars(text))


def slurm_env(slurm_conf: str = "") -> dict[str, str]:
    env = dict(os.environ)
    if slurm_conf:
        env["SLURM_CONF"] = expand(slurm_conf)
    return env


def need_tool(name: str) -> str:
    """The tool's path; a one-line error naming the fix when it is not on PATH."""
    path = shutil.which(name)
    if path is None:
        raise Rl360Error(f"`{name}` is not on PATH, so this machine cannot talk to Slurm", _NO_CLIENT_FIX)
    return path


def run(argv: list[str], *, timeout_s: float, slurm_conf: str = "") -> str:
    """Run one Slurm command and return its stdout; a one-line error on any failure."""
    need_tool(argv[0])
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, env=slurm_env(slurm_conf),
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise SlurmUnreachable(f"`{argv[0]}` did not answer within {timeout_s:g}s",
                               "check that slurmctld is up with `scontrol ping`") from None
    if proc.returncode != 0:
        raise classify_failure(argv[0], proc.stderr or proc.stdout)
    return proc.stdout


def classify_failure(tool: str, stderr: str) -> Rl360Error:
    """The one-line error for what a failed Slurm tool printed."""
    message = last_line(stderr) or f"{tool} failed with no message"
    if any(s in stderr for s in _UNREACHABLE):
        daemon = "slurmdbd" if tool == "sacct" and "slurmdbd" in stderr else "slurmctld"
        return SlurmUnreachable(f"{daemon} does not answer ({message})",
                                f"start {daemon}, or point SLURM_CONF at the right cluster; check with `scontrol ping`")
    if "accounting storage is disabled" in stderr:
        return SlurmCommandFailed(f"{tool}: Slurm accounting is off ({message})",
                                  "configure slurmdbd (AccountingStorageType=accounting_storage/slurmdbd)",
                                  stderr=stderr)
    return SlurmCommandFailed(f"{tool}: {message}", "see the Slurm message above", stderr=stderr)


def last_line(text: str) -> str:
    lines = [line.strip() for line in (text or "").strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


# ----------------------------------------------------------------------------- parsing


def base_state(state: str) -> str:
    """`CANCELLED by 0` -> `CANCELLED`; `RUNNING+` stays whole once stripped of decorations."""
    return (state or "").split()[0].rstrip("+*").upper() if state else ""


def parse_exit_code(text: str) -> tuple[int | None, int | None]:
    """sacct's `code:signal` pair."""
    m = re.match(r"^(\d+):(\d+)$", (text or "").strip())
    if not m:
        return None, None
    return int(m.group(1)), int(m.group(2))


def expand_hostlist(text: str) -> list[str]:
    """`n[1-3,5],gpu07` -> [n1, n2, n3, n5, gpu07] (zero padding kept); `(null)`/`None assigned` -> []."""
    text = (text or "").strip()
    if not text or text.startswith("(") or text.lower().startswith("none"):
        return []
    out: list[str] = []
    depth, start = 0, 0
    for i, ch in enumerate(text + ","):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "," and depth == 0:
            out += _expand_one(text[start:i])
            start = i + 1
    return out


def _expand_one(item: str) -> list[str]:
    m = re.match(r"^(.*?)\[([^\]]+)\](.*)$", item)
    if not m:
        return [item] if item else []
    prefix, ranges, rest = m.groups()
    names = []
    for part in ranges.split(","):
        if "-" in part:
            lo, hi = part.split("-", 1)
            names += [f"{prefix}{i:0{len(lo)}d}" for i in range(int(lo), int(hi) + 1)]
        else:
            names.append(prefix + part)
    tails = _expand_one(rest) if "[" in rest else [rest]
    return [n + tail for n in names for tail in tails]


def parse_squeue(text: str) -> dict[str, dict]:
    """`squeue -h -o '%A|%i|%T|%N|%r'` -> {job_id: {display_id, state, nodes, reason}}."""
    jobs = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 5 or not parts[0].strip():
            continue
        job_id, display, state, nodes, reason = (p.strip() for p in parts[:5])
        jobs[job_id] = {"display_id": display, "state": base_state(state), "nodes": expand_hostlist(nodes),
                        "reason": reason if reason not in ("None", "") else None}
    return jobs


SACCT_FIELDS = "JobIDRaw,JobID,State,ExitCode,NodeList,End"


def parse_sacct(text: str) -> tuple[dict[str, dict], dict[str, dict]]:
    """`sacct -n -P -o JobIDRaw,JobID,State,ExitCode,NodeList,End` -> (jobs, steps), keyed by raw id.

    Steps are keyed `JOB.STEP` with the job's raw (numeric) id, het components included.
    """
    jobs: dict[str, dict] = {}
    steps: dict[str, dict] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 6 or not parts[0]:
            continue
        raw, display, state, exit_text, nodes, end = parts[:6]
        code, signal = parse_exit_code(exit_text)
        entry = {"display_id": display, "state": base_state(state), "exit_code": code, "signal": signal,
                 "nodes": expand_hostlist(nodes), "end": end if end not in ("Unknown", "None", "") else None}
        if "." in raw:
            steps[raw] = entry
        else:
            jobs[raw] = entry
    return jobs, steps


def parse_sinfo_nodes(text: str) -> dict[str, dict]:
    """`sinfo -h -N -o '%N|%T|%E'` -> {node: {state, reason, lost}} (a node listed per partition once)."""
    nodes = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 3 or not parts[0]:
            continue
        name, state, reason = (p.strip() for p in parts[:3])
        nodes[name] = {"state": state, "reason": reason if reason not in ("none", "None") else None,
                       "lost": node_is_lost(state)}
    return nodes


def node_is_lost(state: str) -> bool:
    """A node that stopped answering or was taken down: its processes can no longer be reached."""
    s = state.strip().lower()
    base = s.rstrip("*~#!%$@^-+")
    return s.endswith("*") or base in ("down", "fail") or "not_responding" in s
