"""Which proxy a process's sandboxes go out through: the machine's one (local backend), or on Slurm the one of the
node the process runs on (its name filled into the proxies' control path); a node whose proxy does not answer fails
every attach in one line naming it, and never opens the network. Pure: no proxy runs."""

from __future__ import annotations

import asyncio

import pytest

from rl360cli.egress.client import EgressRoute, EgressUnavailable, node_name, on_node_path
from rl360cli.egress.config import EgressConfig

ALLOW = EgressConfig(mode="allow", allow=("pypi.org",), sandbox_port=3200)


def record(node: str, control: str, backend: str = "slurm") -> dict:
    return {"node": node, "url": f"unix://{control}", "backend": backend, "kind": "egress"}


def test_one_machine_keeps_its_proxy_whatever_the_node_is_called():
    route = EgressRoute.of(ALLOW, [record("local", "/tmp/rl360-egress-a/control.sock", backend="local")])
    assert route.control == "/tmp/rl360-egress-a/control.sock" and route.port == 3200
    assert route.on_node("n7") is route


def test_on_slurm_each_node_fills_in_its_own_name():
    template = "/tmp/rl360-egress-a-{node}/control.sock"
    route = EgressRoute.of(ALLOW, [record("n2", template), record("n3", template)])
    on_n3 = route.on_node("n3")
    assert (on_n3.control, on_n3.node, on_n3.mode, on_n3.port) == ("/tmp/rl360-egress-a-n3/control.sock", "n3",
                                                                   "allow", 3200)
    # A node that replaced n3 after a requeue: its proxy, started again there with the same command, meets it.
    assert route.on_node("n4").control == on_node_path(template, "n4") == "/tmp/rl360-egress-a-n4/control.sock"
    long = "node-" + "x" * 100
    assert route.on_node(long).control == on_node_path(template, long) and long not in on_node_path(template, long)


def test_a_node_whose_proxy_does_not_answer_fails_every_attach_in_one_line(tmp_path):
    route = EgressRoute.of(ALLOW, [record("n2", str(tmp_path / "e-{node}" / "control.sock"))]).on_node("n4")
    with pytest.raises(EgressUnavailable) as failed:
        asyncio.run(route.attach("sandbox-1", 1))
    assert str(failed.value) == (f"the egress proxy of node n4 at {tmp_path}/e-n4/control.sock does not answer "
                                 "([Errno 2] No such file or directory)")
    assert route.mode == "allow"  # never "open": the sandbox gets no network, its start fails


def test_no_proxy_recorded_fails_every_attach_in_one_line():
    with pytest.raises(EgressUnavailable) as failed:
        asyncio.run(EgressRoute.of(ALLOW, []).on_node("n4").attach("sandbox-1", 1))
    assert str(failed.value) == ('[egress] mode is "allow" but no egress proxy of node n4 is recorded: start it with '
                                 "`rl360 up` (its `egress` stage)")


def test_other_modes_need_no_proxy():
    for mode in ("none", "open"):
        route = EgressRoute.of(EgressConfig(mode=mode), [record("n2", "/tmp/e-{node}/control.sock")])
        assert route.on_node("n2") == EgressRoute(mode=mode, port=3128)


def test_the_node_is_slurms_name_for_it(monkeypatch):
    monkeypatch.setenv("SLURMD_NODENAME", "n3")
    assert node_name() == "n3"
