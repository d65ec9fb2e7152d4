"""The proxy's lifecycle, as a user drives it: `rl360 plan` shows it, `rl360 tasks check` starts it (recorded in
the state file) and a task whose verifier fetches through a mirror passes, a verifier stopped by the allow-list
says why in its row, `rl360 down` stops it; on Slurm, the plan shows a proxy per rollout node (the real ones:
tests/slurm/test_slurm_egress.py) and `tasks check` is refused in one line. Loopback only."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rl360cli import procinfo
from rl360cli.commands import common
from rl360cli.egress.client import on_node_path
from rl360cli.errors import Rl360Error
from rl360cli.stages import egress
from tests.conftest import REPO, need
from tests.egress.conftest import FILES, proxy_pids
from tests.sandbox.conftest import PYTHON, write_task

pytestmark = pytest.mark.timeout(300)

FETCH = "python3 -c 'import sys, urllib.request; sys.stdout.buffer.write(urllib.request.urlopen(sys.argv[1]).read())'"


def profile(tmp_path: Path, egress: str, *, base: str = "local.toml") -> Path:
    path = tmp_path / "profile.toml"
    path.write_text((REPO / "cluster" / base).read_text() + "\n[egress]\n" + egress)
    return path


def installer_task(root: Path, name: str, url: str) -> Path:
    """harbor-cookbook's simple-task in small: no network key (Harbor's default), a verifier that fetches and runs
    an installer from the internet."""
    return write_task(root, name, image=PYTHON, toml="[environment]\ncpus = 1\n", solve_sh="touch /app/done\n",
                      test_sh=f"{FETCH} {url} | sh | grep -q 'uv installed' && test -f /app/done && "
                              "echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n")


def test_tasks_check_starts_the_proxy_it_needs_and_stops_it(cli, state_path, tmp_path, outside, bwrap):
    need(os.geteuid() == 0, "the egress proxy enters sandboxes' network namespaces: run as root")
    path = profile(tmp_path, f'mode = "allow"\n[egress.mirrors]\n"http://astral.example.test/uv/" = '
                             f'"{outside.url("/uv/")}"\n')
    plan = cli("plan", "--recipe", str(REPO / "recipes" / "local-smoke.toml"), "--profile", str(path), "--json")
    assert plan.returncode == 0, plan.stderr
    started = [a for a in json.loads(plan.stdout)["actions"] if a["stage"] == "egress"]
    assert [a["subject"] for a in started] == ["rollout/egress"] and "rl360cli.egress.proxy" in started[0]["command"]

    tasks = tmp_path / "tasks"
    installer_task(tasks, "mirrored", "http://astral.example.test/uv/install.sh")
    installer_task(tasks, "elsewhere", "http://astral.elsewhere.test/uv/install.sh")
    checked = cli("tasks", "check", str(tasks), "--profile", str(path), "--json", timeout=240)
    rows = {row["task"]: row for row in json.loads(checked.stdout)["tasks"]}
    assert rows["mirrored"]["passed"], rows["mirrored"]
    assert rows["mirrored"]["oracle"]["egress"]["bytes"] == {"astral.example.test": len(FILES["/uv/install.sh"])}
    assert rows["elsewhere"]["problems"] == [
        "oracle reward 0 < 1 (rl360 egress: astral.elsewhere.test is not on the profile's [egress] allow list (the "
        "operator adds it to allow, or maps its URLs in [egress.mirrors]))"]

    # The check started the proxy, so it stopped it: no daemon is left behind by a one-off command.
    assert "rollout/egress" not in json.loads(state_path.read_text())["components"]
    assert not proxies_of(state_path)


def proxies_of(state_path: Path) -> list[int]:
    """The pids of egress proxies whose cache is under this state file's folder (its argv names it)."""
    return proxy_pids(str(state_path.parent.absolute() / "egress" / "cache"))


def test_a_proxy_that_runs_is_left_running_by_tasks_check_and_down_stops_it(cli, state_path, tmp_path, outside,
                                                                           bwrap, monkeypatch):
    need(os.geteuid() == 0, "the egress proxy enters sandboxes' network namespaces: run as root")
    path = profile(tmp_path, f'mode = "allow"\n[egress.mirrors]\n"http://astral.example.test/uv/" = '
                             f'"{outside.url("/uv/")}"\n')
    # Started as `rl360 up` starts it (the stage's apply), before the check.
    monkeypatch.setattr(common.GLOBALS, "state_path", state_path)
    egress.apply(common.context(profile=path, quiet=True))
    record = json.loads(state_path.read_text())["components"]["rollout/egress"]
    control = Path(record["url"].removeprefix("unix://"))
    assert record["status"] == "running" and procinfo.is_alive(record["pid"], record["start_time"]) and control.exists()

    installer_task(tmp_path / "tasks", "mirrored", "http://astral.example.test/uv/install.sh")
    checked = cli("tasks", "check", str(tmp_path / "tasks"), "--profile", str(path), "--json", timeout=240)
    assert json.loads(checked.stdout)["passed"], checked.stdout[-2000:]
    assert procinfo.is_alive(record["pid"], record["start_time"])  # not the check's to stop
    assert json.loads(state_path.read_text())["components"]["rollout/egress"]["pid"] == record["pid"]
    down = cli("down")
    assert down.returncode == 0, down.stderr
    assert not procinfo.is_alive(record["pid"], record["start_time"]) and not control.exists()
    assert "rollout/egress" not in json.loads(state_path.read_text())["components"]


def test_a_changed_egress_table_starts_the_proxy_again_unless_a_run_is_under_way(state_path, tmp_path, monkeypatch):
    """A proxy reads [egress] once, at its start: `rl360 up` after an edit starts it again with the new table
    (it kept the old allow list until `rl360 down`); while another run is under way that is refused in one line and
    the proxy is left as it is (a command holding it: tests/egress/test_egress_holders.py)."""
    need(os.geteuid() == 0, "the egress proxy enters sandboxes' network namespaces: run as root")
    from rl360cli.state.store import StateFile

    monkeypatch.setattr(common.GLOBALS, "state_path", state_path)

    def proxy_after_apply(allow: str) -> dict:
        path = profile(tmp_path, f'mode = "allow"\nallow = ["{allow}"]\n')
        egress.apply(common.context(profile=path, quiet=True))
        record = json.loads(state_path.read_text())["components"]["rollout/egress"]
        assert record["status"] == "running" and procinfo.is_alive(record["pid"], record["start_time"])
        return record

    first = proxy_after_apply("files.example.test")
    try:
        assert proxy_after_apply("files.example.test")["pid"] == first["pid"]  # the same table: left alone
        second = proxy_after_apply("pypi.org")
        assert second["pid"] != first["pid"] and not procinfo.is_alive(first["pid"], first["start_time"])
        assert second["env"][egress.SETTINGS_ENV] != first["env"][egress.SETTINGS_ENV]
        with StateFile(state_path).update() as doc:  # another run's sandboxes may be attached to it
            doc["runs"]["other"] = {"name": "other", "status": "running", "step": 1}
        with pytest.raises(Rl360Error, match="another \\[egress\\] than profile.toml's, for run other, which still"):
            proxy_after_apply("files.pythonhosted.org")
        record = json.loads(state_path.read_text())["components"]["rollout/egress"]
        assert record["pid"] == second["pid"] and procinfo.is_alive(second["pid"], second["start_time"])
    finally:
        egress.stop(common.context(profile=tmp_path / "profile.toml", quiet=True))
    assert not proxies_of(state_path)


def test_on_slurm_the_plan_shows_a_proxy_per_rollout_node_and_ssh_nodes_in_one_line(cli, tmp_path):
    path = profile(tmp_path, 'mode = "allow"\nallow = ["pypi.org"]\n', base="dev-slurm.toml")
    path.write_text(path.read_text().replace("[tiers.rollout]\nnum_nodes = 1", "[tiers.rollout]\nnum_nodes = 2")
                    + '[[nodes]]\nname = "far"\ndocker_host = "ssh://rl360@far.example.test:22"\ncpus = 8.0\n'
                    'memory_mb = 16384\n')
    plan = cli("plan", "--recipe", str(REPO / "recipes" / "local-smoke.toml"), "--profile", str(path),
               "--set", "sandbox.provider=docker", "--json")
    assert plan.returncode == 0, plan.stderr
    actions = [a for a in json.loads(plan.stdout)["actions"] if a["stage"] == "egress"]
    # Before the tier holds its nodes, their places; each proxy's socket, cache and CA in a folder of its own node.
    assert [a["subject"] for a in actions] == ["rollout/egress-rollout[0]", "rollout/egress-rollout[1]", "ssh:// nodes"]
    controls = [a["detail"].rsplit("control unix://", 1)[1] for a in actions[:2]]
    assert [c.rsplit("-", 1)[1] for c in controls] == ["rollout[0]/control.sock", "rollout[1]/control.sock"]
    assert all(c.startswith("/tmp/rl360-egress-") for c in controls)
    assert actions[2]["detail"].startswith("Docker node far: reached over ssh:// or tcp://, on no proxy's node")


def test_tasks_check_on_slurm_is_refused_in_one_line(cli, tmp_path):
    path = profile(tmp_path, 'mode = "allow"\n', base="dev-slurm.toml")
    installer_task(tmp_path / "tasks", "mirrored", "http://astral.example.test/uv/install.sh")
    checked = cli("tasks", "check", str(tmp_path / "tasks"), "--profile", str(path))
    assert checked.returncode == 1
    assert "a Slurm profile runs egress proxies on its rollout nodes only" in checked.stderr, checked.stderr


def test_a_proxys_control_socket_is_per_node_and_fits_a_unix_socket(tmp_path):
    home = tmp_path / "rl360"
    machine, nodes = egress.proxy_folder(home), egress.proxy_folder(home, on_nodes=True)
    assert nodes == Path("/tmp") / f"{machine.name}-{{node}}"
    assert egress.proxy_folder(tmp_path / "other", on_nodes=True) != nodes  # another state file, another folder
    template = str(nodes / egress.CONTROL)
    n1, n2 = on_node_path(template, "n1"), on_node_path(template, "n2")
    assert n1 != n2 and n1 == f"/tmp/{machine.name}-n1/control.sock"
    long_ones = [on_node_path(template, f"{c}" * 200) for c in "xy"]
    assert long_ones[0] != long_ones[1] and all(len(p) <= 107 for p in long_ones)
