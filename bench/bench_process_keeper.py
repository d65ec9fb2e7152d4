"""Benchmark: a keeper per process sandbox, prototyped here (rl360 does not use it), against the provider's
fresh bubblewrap per command, for local-smoke's sessions of two commands (the agent's `echo`, the verifier).

    sudo .venv/bin/python bench/bench_process_keeper.py [--sessions 40] [--repeat 2]

The keeper is one bubblewrap per sandbox (the provider's own argv: `setpriv`, `prlimit`, the namespaces,
the seccomp filter, the sandbox's uid) whose pid 1 is a copy of the host's `sh` that the sandbox's uid may
execute but not read: the kernel starts such a program non-dumpable, so the commands, which run as the
same uid, cannot open its /proc/1/mem or /proc/1/fd (without Yama, a dumpable keeper would be theirs to
rewrite). It reads each command from its stdin (a secret marker, the command with backslashes and
newlines escaped, the CPU limit), runs it as `bash -c` in a subshell with the limit, then kills every other
process of the namespace (`kill -9 -1`), reaps them, and writes the marker and the exit status.

Prints the CPU per session of both (this process and the reaped children), and what the keeper keeps: the
exit codes, the verifier's reward, a background process gone before the next command, /proc/1/mem closed
to the commands. Needs root (a sandbox uid of its own) and bubblewrap. docs/benchmarks.md ("Local smoke:
one step, profiled") quotes it. Not kept: the IPC namespace and /dev/shm would then live as long as the
sandbox, not one command, and the provider would need a protocol, timeouts and tests of its own.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rl360cli.sandbox.attempt import VERIFY_COMMAND  # noqa: E402
from rl360cli.sandbox.config import SandboxConfig  # noqa: E402
from rl360cli.sandbox.process.isolation import DEFAULT_PATH, filled_pipe, rlimit_args  # noqa: E402
from rl360cli.sandbox.process.provider import ProcessProvider  # noqa: E402
from rl360cli.sandbox.task_loader import load_task_set  # noqa: E402

TASKS = REPO / "recipes" / "tasks" / "arith-32"
CONFIG = SandboxConfig(cpus=0.05, memory_mb=256)
ANSWER = "echo 'x - 5' > answer.py"
# What the provider gives an arith task's commands (no image or task environment).
ENV = {"PATH": DEFAULT_PATH, "HOME": "/tmp", "LANG": "C.UTF-8", "TMPDIR": "/tmp", "MALLOC_ARENA_MAX": "2"}
KEEPER_PATH = "/.rl360-keeper"
# $1: the workdir. Each request: marker line, command line (\\ and \n escaped), CPU seconds line.
KEEPER_SCRIPT = r'''
wd=$1
while IFS= read -r marker && IFS= read -r line && IFS= read -r cpu; do
  cmd=$(printf '%b_' "$line"); cmd=${cmd%_}
  if cd -- "$wd" 2>/dev/null; then
    (ulimit -S -t "$cpu" && ulimit -H -t $((cpu + 1)) &&
     if [ -x /bin/bash ]; then exec /bin/bash -c "$cmd"; else exec /bin/sh -c "$cmd"; fi) </dev/null 2>&1
    s=$?
  else
    s=setup
  fi
  kill -9 -1 2>/dev/null
  while kill -0 -1 2>/dev/null; do /bin/true; done
  printf '\n%s %s\n' "$marker" "$s"
done
'''


def cpu_s() -> tuple[float, float]:
    """CPU seconds of this process and of its reaped children."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


class Keeper:
    """One sandbox's keeper: started on the sandbox's folder, then one command at a time."""

    def __init__(self, provider: ProcessProvider, sandbox, binary: Path):
        iso = provider.isolation
        limits = rlimit_args(memory_mb=CONFIG.memory_mb, pids=CONFIG.pids_limit, file_mb=CONFIG.max_file_mb,
                             open_files=CONFIG.max_open_files, cpu_s=10**7)
        seccomp = filled_pipe(iso.seccomp)
        argv = iso.argv(sandbox.fs, "true", workdir=sandbox.task.workdir, limits=limits, uid=sandbox.uid,
                        init=False, seccomp_fd=seccomp, ro_binds=((str(binary), KEEPER_PATH),))
        tail = len(argv) - 1 - argv[::-1].index("--")
        argv = argv[:tail] + ["--", KEEPER_PATH, "-c", KEEPER_SCRIPT, "rl360-keeper", sandbox.task.workdir]
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     env=ENV, pass_fds=(seccomp,), start_new_session=True)
        os.close(seccomp)

    def run(self, command: str, cpu: int = 31) -> tuple[str, bytes]:
        marker = secrets.token_hex(16)
        line = command.replace("\\", "\\\\").replace("\n", "\\n")
        self.proc.stdin.write(f"{marker}\n{line}\n{cpu}\n".encode())
        self.proc.stdin.flush()
        end, data = f"\n{marker} ".encode(), b""
        while end not in data or not data.endswith(b"\n"):
            chunk = os.read(self.proc.stdout.fileno(), 1 << 16)
            if not chunk:
                raise RuntimeError(f"the keeper ended: {data[-300:]!r}")
            data += chunk
        output, _, status = data.rpartition(end)
        return status.decode().strip(), output

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


async def main(args: argparse.Namespace) -> None:
    if os.geteuid() != 0 or shutil.which("bwrap") is None:
        raise SystemExit("needs root (a sandbox uid of its own) and bubblewrap")
    home = Path(tempfile.mkdtemp(prefix="rl360-keeper-"))
    os.chmod(home, 0o755)
    binary = home / "sh"
    shutil.copy(os.path.realpath("/bin/sh"), binary)
    os.chmod(binary, 0o711)  # others may execute it, not read it: it starts non-dumpable
    provider = ProcessProvider(CONFIG, run_id="bench-process-keeper")
    task = load_task_set(TASKS, refused={})[0]

    async def sandbox_with_tests():
        sandbox = await provider.start(task, attempt_id=f"bench-keeper-{secrets.token_hex(4)}", labels={})
        for entry in sorted(task.tests_dir.iterdir()):
            await sandbox.upload(entry, f"/tests/{entry.name}")
        return sandbox

    try:
        sandbox = await sandbox_with_tests()
        keeper = Keeper(provider, sandbox, binary)
        checks = [keeper.run(ANSWER), keeper.run(VERIFY_COMMAND),
                  keeper.run("sleep 100 & echo started; exit 3"), keeper.run("ls /proc | grep -c '^[0-9]'"),
                  keeper.run("cat /proc/1/mem 2>&1 | head -c 60; echo; ls /proc/1/fd 2>&1 | head -c 60")]
        keeper.close()
        reward = (await sandbox.read_file("/logs/verifier/reward.txt") or b"").decode().strip()
        await sandbox.stop()
        print("through the keeper:", [(status, output.decode(errors="replace").strip()) for status, output in checks],
              f"reward {reward}")
        for _ in range(args.repeat):
            sandboxes = [await sandbox_with_tests() for _ in range(args.sessions)]
            (own0, kids0), began = cpu_s(), time.monotonic()
            for sandbox in sandboxes:
                await sandbox.exec(ANSWER, timeout_s=30)
                await sandbox.exec(VERIFY_COMMAND, timeout_s=30)
            (own1, kids1), fresh_s = cpu_s(), time.monotonic() - began
            for sandbox in sandboxes:
                await sandbox.stop()
            sandboxes = [await sandbox_with_tests() for _ in range(args.sessions)]
            (own2, kids2), began = cpu_s(), time.monotonic()
            for sandbox in sandboxes:
                keeper = Keeper(provider, sandbox, binary)
                keeper.run(ANSWER)
                keeper.run(VERIFY_COMMAND)
                keeper.close()
            (own3, kids3), kept_s = cpu_s(), time.monotonic() - began
            for sandbox in sandboxes:
                await sandbox.stop()
            n = args.sessions
            print(f"per session of 2 commands: a bubblewrap per command {1000 * (kids1 - kids0) / n:.1f} ms in the "
                  f"sandbox, {1000 * (own1 - own0) / n:.1f} ms here ({1000 * fresh_s / n:.0f} ms wall); a keeper "
                  f"{1000 * (kids3 - kids2) / n:.1f} ms in the sandbox, {1000 * (own3 - own2) / n:.1f} ms here "
                  f"({1000 * kept_s / n:.0f} ms wall)")
    finally:
        await provider.close()
        shutil.rmtree(home, ignore_errors=True)
    print(f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} cores")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=40)
    parser.add_argument("--repeat", type=int, default=2)
    asyncio.run(main(parser.parse_args()))
