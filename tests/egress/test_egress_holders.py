"""Commands that share the machine's egress proxy (`for_one_command`): each holds it while it runs, the last live
holder to leave stops it, a holder that died counts for nothing, and a command with another [egress] is refused in
one line while another holds it, instead of restarting it under that command (seen 2026-12-07: a second
`rl360 tasks check` restarted the proxy and cut the first's apt-get in an image build). The real proxy process,
a state file of the test's own; another command is a process of its own (a holder is a pid). Loopback only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rl360cli import procinfo
from rl360cli.commands import common
from rl360cli.stages import egress
from tests.conftest import REPO, need
from tests.egress.test_egress_stage import installer_task, profile, proxies_of

pytestmark = pytest.mark.timeout(300)

# Another command: holds the proxy until its stdin closes.
HOLD = """
import sys
from pathlib import Path
from rl360cli.commands import common
from rl360cli.stages import egress
common.GLOBALS.state_path = Path(sys.argv[1])
with egress.for_one_command(common.context(profile=Path(sys.argv[2]), quiet=True), command="the first command"):
    print("held", flush=True)
    sys.stdin.readline()
"""


class Holder:
    """A command of its own process that holds the proxy (starting it unless it runs) until it leaves."""

    def __init__(self, state_path: Path, profile_path: Path):
        self.proc = subprocess.Popen([sys.executable, "-c", HOLD, str(state_path), str(profile_path)], cwd=REPO,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if line != "held\n":
            self.proc.kill()
            raise AssertionError(f"the holder did not hold the proxy: {line}{self.proc.stderr.read()}")

    def leave(self) -> None:
        self.proc.stdin.close()
        assert self.proc.wait(timeout=120) == 0, self.proc.stderr.read()

    def kill(self) -> None:
        """Dies without leaving (SIGKILL): its holder stays in the proxy's record."""
        self.proc.kill()
        self.proc.wait()


def proxy_record(state_path: Path) -> dict | None:
    return json.loads(state_path.read_text())["components"].get("rollout/egress")


def holder_pids(state_path: Path) -> list[int]:
    return [h["pid"] for h in proxy_record(state_path).get("holders", [])]


@pytest.fixture
def allow_profile(state_path, tmp_path, monkeypatch):
    """`allow_profile(host)`: a local profile whose [egress] allows `host` (its own folder's profile.toml), with
    this process's commands on the test's state file; a proxy a failed test left is stopped."""
    need(os.geteuid() == 0, "the egress proxy enters sandboxes' network namespaces: run as root")
    monkeypatch.setattr(common.GLOBALS, "state_path", state_path)
    made: list[Path] = []

    def make(host: str) -> Path:
        (tmp_path / host).mkdir()
        made.append(profile(tmp_path / host, f'mode = "allow"\nallow = ["{host}"]\n'))
        return made[-1]

    yield make
    if made and state_path.exists() and proxy_record(state_path):
        egress.stop(common.context(profile=made[0], quiet=True))


def test_the_first_holder_leaving_leaves_the_proxy_to_the_second_whose_leaving_stops_it(state_path, allow_profile):
    path = allow_profile("files.example.test")
    first = Holder(state_path, path)  # it starts the proxy
    try:
        started = proxy_record(state_path)
        with egress.for_one_command(common.context(profile=path, quiet=True), command="the second command"):
            assert proxy_record(state_path)["pid"] == started["pid"]
            first.leave()
            assert procinfo.is_alive(started["pid"], started["start_time"])  # the second command still uses it
            assert holder_pids(state_path) == [os.getpid()]
        assert not procinfo.is_alive(started["pid"], started["start_time"])
        assert proxy_record(state_path) is None and not proxies_of(state_path)
    finally:
        first.kill()


def test_a_holder_that_died_is_ignored(state_path, allow_profile):
    path = allow_profile("files.example.test")
    dead = Holder(state_path, path)
    dead.kill()  # it never left: its holder stays in the record, the proxy it started runs on
    started = proxy_record(state_path)
    assert holder_pids(state_path) == [dead.proc.pid] and procinfo.is_alive(started["pid"], started["start_time"])
    with egress.for_one_command(common.context(profile=path, quiet=True), command="the second command"):
        assert proxy_record(state_path)["pid"] == started["pid"]
        assert holder_pids(state_path) == [os.getpid()]
    # The last live holder left: the proxy is stopped, though the dead one never said it left.
    assert not procinfo.is_alive(started["pid"], started["start_time"])
    assert proxy_record(state_path) is None and not proxies_of(state_path)


def test_another_egress_table_while_a_live_holder_uses_the_proxy_is_refused_in_one_line(cli, state_path, tmp_path,
                                                                                         allow_profile):
    first_profile, other_profile = allow_profile("files.example.test"), allow_profile("pypi.org")
    first = Holder(state_path, first_profile)
    try:
        started = proxy_record(state_path)
        installer_task(tmp_path / "tasks", "mirrored", "http://files.example.test/uv/install.sh")
        checked = cli("tasks", "check", str(tmp_path / "tasks"), "--profile", str(other_profile))
        assert checked.returncode == 1, checked.stdout + checked.stderr
        line = checked.stderr.strip()
        assert "\n" not in line, line
        assert (f"the egress proxy runs with another [egress] than profile.toml's, for `the first command` "
                f"(pid {first.proc.pid}), which still uses it; wait for it to end, give this command its own state "
                "file (RL360_STATE=/other/state.json), or the same [egress]") in line, line
        # Not restarted under the first command: the same process, with the first command's settings.
        assert proxy_record(state_path)["pid"] == started["pid"]
        assert procinfo.is_alive(started["pid"], started["start_time"]) and holder_pids(state_path) == [first.proc.pid]
        first.leave()
        assert not procinfo.is_alive(started["pid"], started["start_time"]) and proxy_record(state_path) is None
    finally:
        first.kill()
