"""A process sandbox's keeper: one bubblewrap per sandbox, whose namespaces every command of it joins.

`[sandbox] process_namespace = "sandbox"` (as root, with bubblewrap) starts, per sandbox, the provider's
usual argv (`setpriv`, `prlimit`, bubblewrap with the sandbox's folders, `--unshare-all`, the seccomp
filter, the sandbox's uid) around a keeper: pid 1 of the sandbox's pid namespace, a copy of the host's
`sh` at /.rl360-keeper that the sandbox's uid may execute but not read. The kernel starts such a program
non-dumpable, so the commands, which run as the same uid, cannot open its /proc/1/mem, /proc/1/fd or
/proc/1/environ, nor ptrace it (the filter refuses ptrace anyway). Three pipes connect it to rl360:

- fd 0, the requests (only the keeper holds it): `run WORKDIR-LINES PRELUDE-LINES COMMAND-LINES`
  followed by those lines, or `kill`. Counting lines needs no escaping and no fork to decode.
- fd 1, the commands' output (stdout and stderr together), which every command inherits; rl360 reads
  it all the time and hands it to the command in flight (what arrives between commands is dropped).
- fd 2, the replies (only the keeper holds it: each command gets `2>&1`): `STATUS OTHERS` per request,
  OTHERS being how many processes besides the keeper live in the namespace once it is answered.
  A command cannot write there, so it cannot forge another command's (or its own) exit status.

Each `run` forks a subshell that applies the prelude (rl360's: the CPU limit of this command, its
environment), enters the workdir and execs `bash -c COMMAND` with stdin /dev/null; the keeper waits for
it and answers. What the command leaves running goes on, in the sandbox's namespaces, until the sandbox
stops (or `kill`: every process but the keeper, rl360's `end_agent_processes`). A command past its
timeout ends the keeper and with it the namespace, everything in it, as docker's timeout kills every
process of the container; the sandbox's next command starts a new keeper (its files are kept).

While rl360 works on the sandbox's files from the host (uploads, resets, reads: as root, on folders the
sandbox's uid owns), no process of the sandbox may run, or it could swap a folder for a link between
rl360's checks and its writes: `still()` stops them all with SIGSTOP (the seccomp filter refuses SIGCONT
inside, so none can wake another) until a walk over /proc sees the same processes as the one before, all
stopped, and continues them afterwards (~2.5 ms of CPU with ~120 processes on the host). When the keeper says nothing else lives, there is nothing to stop.

The keeper is a shell: it reaps the orphans that end between commands when the next command runs, and a
fork it cannot make (every pid of the sandbox's limit held by what the agent left) ends it, which ends
what held the pids too; the command reads as stopped at the process limit.

Test: tests/sandbox/test_process_keeper.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import select
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rl360cli.sandbox.process.outbound import OutboundNet, read_bwrap_info, wait_until_blocked
from rl360cli.sandbox.taxonomy import Event, SandboxError

KEEPER_PATH = "/.rl360-keeper"
# The keeper's program: $1 is not used; every variable of its own is prefixed (the sandbox's environment,
# which it exports to the commands, may hold any other name).
SCRIPT = r'''
__rl360_lines() {
  __rl360_v= __rl360_i=0
  while [ "$__rl360_i" -lt "$1" ]; do
    IFS= read -r __rl360_l || exit 0
    if [ "$__rl360_i" = 0 ]; then __rl360_v=$__rl360_l; else __rl360_v="$__rl360_v
$__rl360_l"; fi
    __rl360_i=$((__rl360_i + 1))
  done
}
printf 'ready 0\n' >&2
while IFS= read -r __rl360_op; do
  set -- $__rl360_op
  case $1 in
  run)
    __rl360_lines "$2"; __rl360_w=$__rl360_v
    __rl360_lines "$3"; __rl360_p=$__rl360_v
    __rl360_lines "$4"; __rl360_c=$__rl360_v
    if cd -- "$__rl360_w" 2>/dev/null; then
      (eval "$__rl360_p" &&
       if [ -x /bin/bash ]; then exec /bin/bash -c "$__rl360_c"; else exec /bin/sh -c "$__rl360_c"; fi
       exit 126) </dev/null 2>&1
      __rl360_s=$?
    else
      __rl360_s=setup
    fi ;;
  kill)
    while kill -9 -1 2>/dev/null; do /bin/true; done
    __rl360_s=0 ;;
  *) __rl360_s=bad ;;
  esac
  set -- /proc/[0-9]*
  printf '%s %s\n' "$__rl360_s" "$(($# - 1))" >&2
done
'''
_REPLY = re.compile(rb"^(\S+) (\d+)$")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# How long stopping a sandbox's processes for a host-side file operation may take before rl360 ends them all.
STILL_TIMEOUT_S = 5.0
# How long the namespace may take to end once its keeper is killed.
END_TIMEOUT_S = 30.0


class KeeperGone(Exception):
    """The keeper ended without being asked to; its last words are the message."""


def keeper_binary(home: Path) -> Path:
    """`home/.rl360-keeper-sh`: a copy of the host's sh, root's, mode 0711 (others may execute it, not read
    it), made once per folder (atomically: providers of several runs may share one)."""
    home.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(OSError):
        os.chmod(home, 0o711)
    path = home / ".rl360-keeper-sh"
    with contextlib.suppress(FileNotFoundError):
        st = os.lstat(path)
        if st.st_uid == 0 and (st.st_mode & 0o7777) == 0o711 and os.path.isfile(path) and not path.is_symlink():
            return path
    fd, tmp = tempfile.mkstemp(prefix=".rl360-keeper-", dir=home)
    try:
        with open(os.path.realpath("/bin/sh"), "rb") as source, os.fdopen(fd, "wb") as target:
            shutil.copyfileobj(source, target)
        os.chmod(tmp, 0o711)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def prelude(*, cpu_s: int, env: Mapping[str, str]) -> str | None:
    """Shell run in the command's subshell before `bash -c`: its CPU limit (soft, then hard one second above,
    so a CPU hog gets SIGXCPU first) and `env` exported. None when a name of `env` is no shell name (the
    command then runs on its own, outside the keeper)."""
    if any(not _NAME.match(name) for name in env):
        return None
    exports = "".join(f"export {name}={shlex.quote(value)}\n" for name, value in env.items())
    return f"ulimit -S -t {cpu_s} && ulimit -H -t {cpu_s + 1} &&\n{exports}:"


def _lines(text: str) -> tuple[int, bytes]:
    parts = text.split("\n")
    return len(parts), b"".join(part.encode(errors="surrogateescape") + b"\n" for part in parts)


class Keeper:
    """One sandbox's keeper process, started by `start`; one request at a time (`busy`)."""

    def __init__(self, proc: subprocess.Popen, pid: int, *, requests: int, output: int, replies: int,
                 net: OutboundNet | None):
        self.proc = proc  # bubblewrap (its process group: setpriv -> prlimit -> bwrap)
        self.pid = pid  # the keeper, as the host sees it
        self.pidfd = os.pidfd_open(pid)
        self.net = net
        self._requests, self._output, self._replies = requests, output, replies
        self._reply_buf = b""
        self.sink = None  # the OutputBuffer of the command in flight
        self.words = ""  # what the keeper (or bubblewrap) said that was no reply
        self.gone = False  # ended, asked (`end`) or not
        self.ended = False  # ended by rl360
        self.busy = False
        self.others = 0  # processes besides the keeper at its last reply
        self.loop = asyncio.get_running_loop()
        self._waiter = self.loop.create_future()  # its first reply: it runs (`ready`)
        os.set_blocking(output, False)
        os.set_blocking(replies, False)
        self.loop.add_reader(output, self._on_output)
        self.loop.add_reader(replies, self._on_replies)

    @classmethod
    async def start(cls, argv: list[str], *, env: Mapping[str, str], kwargs: dict[str, Any],
                    pass_fds: tuple[int, ...], info_r: int, block_w: int | None, slirp: str | None,
                    files) -> Keeper:
        """Start bubblewrap's `argv` (its command replaced by the keeper's), with `info_r` the read end of its
        `--info-fd` and `block_w` the write end of its `--block-fd` (slirp4netns is attached meanwhile when
        `slirp` is given); `files(fn, *args)` runs a blocking call off the event loop. Closes `pass_fds`."""
        tail = len(argv) - 1 - argv[::-1].index("--")
        argv = argv[:tail + 1] + [KEEPER_PATH, "-c", SCRIPT, "rl360-keeper"]
        req_r, req_w = os.pipe()
        out_r, out_w = os.pipe()
        rep_r, rep_w = os.pipe()
        try:
            proc = subprocess.Popen(argv, stdin=req_r, stdout=out_w, stderr=rep_w, env=dict(env), pass_fds=pass_fds,
                                    start_new_session=True, **kwargs)
        except OSError as e:
            _close(req_w, out_r, rep_r, info_r, block_w)
            raise SandboxError(Event.START_FAILED, f"cannot start the sandbox's keeper: {e}") from None
        finally:
            _close(req_r, out_w, rep_w, *pass_fds)
        net = None
        try:
            info = await files(read_bwrap_info, info_r)
            pid = int(info["child-pid"]) if info and "child-pid" in info else None
            if pid is not None and block_w is not None:
                if await files(wait_until_blocked, pid, int(argv[argv.index("--block-fd") + 1])):
                    net = OutboundNet(slirp)
                    await files(net.attach, pid)
                else:
                    pid = None
            if pid is None:
                said = await files(_read_all, rep_r)
                raise SandboxError(Event.START_FAILED, f"bubblewrap could not start the sandbox's keeper: "
                                   f"{said.strip()[-300:]}")
            return cls(proc, pid, requests=req_w, output=out_r, replies=rep_r, net=net)
        except BaseException:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            await files(proc.wait)
            if net is not None:
                await files(net.close)
            _close(req_w, out_r, rep_r)
            raise
        finally:
            _close(block_w)  # lets the keeper start

    # ------------------------------------------------------------------ the pipes

    def _on_output(self) -> None:
        try:
            chunk = os.read(self._output, 1 << 16)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self.loop.remove_reader(self._output)
        elif self.sink is not None:
            self.sink.feed(chunk)

    def _drain(self) -> None:
        """Read what the output pipe holds now (into the command in flight, if any)."""
        while True:
            try:
                chunk = os.read(self._output, 1 << 16)
            except OSError:
                return
            if not chunk:
                return
            if self.sink is not None:
                self.sink.feed(chunk)

    def _on_replies(self) -> None:
        try:
            chunk = os.read(self._replies, 4096)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self.loop.remove_reader(self._replies)
            self.gone = True
            if self._waiter is not None and not self._waiter.done():
                self._waiter.set_exception(KeeperGone(self.words.strip()[-300:] or "no word"))
            return
        self._reply_buf += chunk
        *lines, self._reply_buf = self._reply_buf.split(b"\n")
        for line in lines:
            match = _REPLY.match(line)
            if match and self._waiter is not None and not self._waiter.done():
                self.others = int(match[2])
                self._waiter.set_result(match[1].decode())
            else:
                self.words = (self.words + line.decode(errors="replace") + "\n")[-2000:]

    async def ready(self, timeout_s: float) -> None:
        """Return once the keeper runs (its first reply); `KeeperGone` when it ended first."""
        try:
            async with asyncio.timeout(timeout_s):
                await self._waiter
        finally:
            self._waiter = None

    async def _ask(self, request: bytes, timeout_s: float, files) -> str:
        if self.gone:
            raise KeeperGone(self.words.strip()[-300:] or "no word")
        self._waiter = self.loop.create_future()
        try:
            try:
                if len(request) < 1 << 15:
                    os.write(self._requests, request)
                else:  # the keeper reads a byte at a time: a long command is written off the event loop
                    await files(_write_all, self._requests, request)
            except OSError:  # BrokenPipeError: it ended
                raise KeeperGone(self.words.strip()[-300:] or "no word") from None
            async with asyncio.timeout(timeout_s):
                return await self._waiter
        finally:
            self._waiter = None

    # ------------------------------------------------------------------ requests

    async def run(self, command: str, *, workdir: str, prelude: str, timeout_s: float, buffer, files) -> str | None:
        """Run `command` (its output into `buffer`); its status (an exit code, or `setup`), or None past
        `timeout_s`: the keeper and everything in its namespace have then been ended."""
        self.busy = True
        self._drain()  # between commands: not this command's
        self.sink = buffer
        request = b""
        counts = []
        for text in (workdir, prelude, command):
            count, data = _lines(text)
            counts.append(count)
            request += data
        request = f"run {counts[0]} {counts[1]} {counts[2]}\n".encode() + request
        try:
            return await self._ask(request, timeout_s, files)
        except TimeoutError:
            await self.end(files)
            return None
        except KeeperGone:
            raise
        except BaseException:
            await asyncio.shield(self.end(files))
            raise
        finally:
            self._drain()
            self.sink = None
            self.busy = False

    async def kill_others(self, timeout_s: float, files) -> None:
        """Every process of the namespace but the keeper killed (and reaped); past `timeout_s`, the keeper too."""
        self.busy = True
        try:
            await self._ask(b"kill\n", timeout_s, files)
        except TimeoutError:
            await self.end(files)
        finally:
            self.busy = False

    # ------------------------------------------------------------------ still

    @property
    def quiet(self) -> bool:
        """Nothing but the keeper runs in the namespace (its last reply said so, and it runs nothing now)."""
        return self.gone or (not self.busy and self.others == 0)

    def _processes(self) -> dict[int, str]:
        """{host pid: the states of its threads} of every descendant of the keeper: every process of its
        namespace and of any namespace nested in it (orphans are reparented within), whatever its uid."""
        below: dict[int, list[int]] = {}
        for name in os.listdir("/proc"):
            if name.isdigit():
                fields = _stat(f"/proc/{name}/stat")
                if fields is not None:
                    below.setdefault(int(fields[1]), []).append(int(name))
        found = {}
        todo = list(below.get(self.pid, ()))
        while todo:
            pid = todo.pop()
            todo += below.get(pid, ())
            states = _states(pid)
            if states:
                found[pid] = states
        return found

    async def _stop_all(self) -> list[int]:
        """SIGSTOP every process of the namespace until a walk sees what the one before it did (the same
        processes, with those stopped since then stopped), all stopped or dead: no process ended in between,
        so none was continued (the kernel continues a stopped process group that an exit orphans), and
        nothing inside can continue one (SIGCONT is refused). The pids rl360 stopped."""
        stopped: list[int] = []
        expected = None
        deadline = time.monotonic() + STILL_TIMEOUT_S
        while True:
            now = self._processes()
            running = [pid for pid, states in now.items() if any(s not in "TtZX" for s in states)]
            if not running and now == expected:
                return stopped
            for pid in running:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGSTOP)
                    stopped.append(pid)
            # Only those just stopped are polled until they are (a signal takes effect once they run).
            while any(any(s not in "TtZX" for s in _states(pid)) for pid in running):
                if time.monotonic() > deadline:
                    raise TimeoutError
                await asyncio.sleep(0.0002)
            expected = {pid: "T" * len(states) if pid in running else states for pid, states in now.items()}
            if time.monotonic() > deadline:
                raise TimeoutError

    @contextlib.asynccontextmanager
    async def still(self, files):
        """Nothing of the sandbox runs inside the block: its processes stopped, then continued."""
        if self.quiet:
            yield
            return
        stopped: list[int] = []
        try:
            stopped = await self._stop_all()
        except TimeoutError:  # one would not stop (a process in uninterruptible sleep): end them all
            await self.end(files)
        try:
            yield
        finally:
            for pid in stopped:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)

    # ------------------------------------------------------------------ end

    async def end(self, files) -> None:
        """Kill the keeper and with it everything in its namespace; returns once they are all gone."""
        if self.pidfd < 0:
            return
        self.ended = self.gone = True
        # The keeper first, so that bubblewrap reaps it (its CPU time counts as this process's children's);
        # pid 1 of a namespace exits only once every other process of it has: then its pidfd reads.
        with contextlib.suppress(ProcessLookupError, OSError):
            signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
        await files(_wait_readable, self.pidfd, END_TIMEOUT_S)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        await files(self.proc.wait)
        for fd in (self._output, self._replies):
            self.loop.remove_reader(fd)
        self._drain()
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(KeeperGone("ended by rl360"))
        _close(self._requests, self._output, self._replies, self.pidfd)
        self._requests = self._output = self._replies = self.pidfd = -1
        if self.net is not None:
            await files(self.net.close)
            self.net = None


def _stat(path: str) -> list[bytes] | None:
    """The fields of a /proc stat file after the command name (state, ppid, ...); None once it ended."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, 1024).rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    finally:
        os.close(fd)


def _states(pid: int) -> str:
    """The state letter of each thread of `pid` ("" once it ended)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return ""
    states = ""
    for task in tasks:
        fields = _stat(f"/proc/{pid}/task/{task}/stat")
        if fields:
            states += chr(fields[0][0])
    return states


def _wait_readable(fd: int, timeout_s: float) -> None:
    with contextlib.suppress(OSError):
        select.select([fd], [], [], timeout_s)


def _read_all(fd: int) -> str:
    os.set_blocking(fd, True)
    data = b""
    with contextlib.suppress(OSError):
        while chunk := os.read(fd, 4096):
            data += chunk
    return data.decode(errors="replace")


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _close(*fds: int | None) -> None:
    for fd in fds:
        if fd is not None and fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)
