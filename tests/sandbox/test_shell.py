"""The persistent shell (rl360cli/sandbox/shell.py) on real sandboxes: a process sandbox (bubblewrap) and a
container on a dev Docker node (busybox: no bash, so the `sh` fallback). What it keeps from one command to
the next (cwd, variables, functions, a background job), what each command returns (its own output and exit
status), and how it ends (a timeout or `exit` ends it and the next command says it starts afresh; `close`
ends what it started)."""

from __future__ import annotations

import asyncio

import pytest

from rl360cli.sandbox.shell import RESTARTED, PersistentShell
from rl360cli.sandbox.task_loader import load_task
from tests.sandbox.conftest import BUSYBOX, write_task


async def _keeps_its_state(sandbox) -> None:
    shell = PersistentShell(sandbox)
    try:
        first = await shell.run("mkdir -p deep/er && cd deep/er && X=41 && f() { echo \"f says $1\"; }",
                                timeout_s=30)
        assert (first.exit_code, first.output) == (0, "")
        here = await shell.run("pwd; echo $((X + 1)); f hi", timeout_s=30)
        assert here.exit_code == 0
        assert here.output.split("\n")[:3] == [f"{sandbox.task.workdir}/deep/er", "42", "f says hi"]
        # A background job lives on between commands, and the next one can wait for it.
        await shell.run("(sleep 0.3; echo done > bg.txt) & BG=$!", timeout_s=30)
        waited = await shell.run("wait $BG; cat bg.txt", timeout_s=30)
        assert waited.output.strip() == "done"
        # Each command's own exit status and output; its stdin is never the shell's.
        failed = await shell.run("echo out; echo err >&2; (exit 3)", timeout_s=30)
        assert (failed.exit_code, sorted(failed.output.split())) == (3, ["err", "out"])
        assert (await shell.run("cat", timeout_s=30)).exit_code == 0  # reads /dev/null, not the shell's FIFO
        # A one-off exec beside it is a fresh shell in the workdir, as before.
        assert (await sandbox.exec("pwd", timeout_s=30)).output.strip() == sandbox.task.workdir
        # A command past its timeout ends the shell and what it started; the next starts in the workdir.
        await shell.run("sleep 60 & echo $! > /tmp/sleeper", timeout_s=30)
        cut = await shell.run("echo partial; sleep 30", timeout_s=1)
        assert cut.timed_out and cut.exit_code is None and "partial" in cut.output
        fresh = await shell.run("pwd; echo ${X:-unset}", timeout_s=30)
        assert fresh.output == f"{RESTARTED}{sandbox.task.workdir}\nunset\n"
        sleeper = (await sandbox.exec("cat /tmp/sleeper", timeout_s=30)).output.strip()
        gone = await sandbox.exec(f"kill -0 {sleeper} 2>/dev/null && echo alive || echo gone", timeout_s=30)
        assert gone.output.strip() == "gone"
        # `exit` ends the shell too: its status is the command's, and the next command says so.
        ended = await shell.run("echo bye; exit 7", timeout_s=30)
        assert (ended.exit_code, ended.output) == (7, "bye\n")
        assert (await shell.run("echo again", timeout_s=30)).output == RESTARTED + "again\n"
        # Closing ends a job it left running and removes its files.
        await shell.run("sleep 60 & echo $! > /tmp/sleeper", timeout_s=30)
        sleeper = (await sandbox.exec("cat /tmp/sleeper", timeout_s=30)).output.strip()
        await shell.close()
        after = await sandbox.exec(f"kill -0 {sleeper} 2>/dev/null && echo alive || echo gone; "
                                   "ls -a /tmp/.rl360-shell 2>&1 | head -1", timeout_s=30)
        assert after.output.split("\n")[0] == "gone" and "No such file" in after.output
    finally:
        await shell.close()


def test_the_persistent_shell_in_a_process_sandbox(process_provider, tmp_path):
    provider = process_provider()
    task = load_task(write_task(tmp_path, "shell", toml="[environment]\nworkdir = \"/app\"\n"))

    async def go():
        sandbox = await provider.start(task, attempt_id="a-shell", labels={})
        try:
            await _keeps_its_state(sandbox)
        finally:
            await sandbox.stop()
            await provider.close()

    asyncio.run(go())


@pytest.mark.slow
def test_the_persistent_shell_in_a_busybox_container(docker_provider, tmp_path):
    provider = docker_provider(cpus=0.5, memory_mb=256)
    task = load_task(write_task(tmp_path, "shell", toml="[environment]\nworkdir = \"/app\"\n", image=BUSYBOX))

    async def go():
        sandbox = await provider.start(task, attempt_id="a-shell", labels={})
        try:
            await _keeps_its_state(sandbox)
        finally:
            await sandbox.stop()

    asyncio.run(go())
