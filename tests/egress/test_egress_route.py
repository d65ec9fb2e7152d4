"""Which proxy a process's sandboxes go out through: the machine's one (local backend), or on Slurm the one of the
node the process runs on, picked from the records of every rollout node's proxy; a node without one fails every
attach in one line naming it, and never opens the network. Pure: no proxy runs."""

from __future__ import annotations

import asyncio

import pytest

from rl360cli.egress.client import EgressRoute, EgressUnavailable, node_name
from rl360cli.egress.config import EgressConfig

ALLOW = EgressConfig(mode="allow", allow=("pypi.org",), sandbox_port=3200)


def record(node: str, control: str, backend: str = "slurm") -> dict:
    return {"node": node, "url": f"unix://{control}", "backend": backend, "kind": "egress"}


def test_one_machine_keeps_its_proxy_whatever_the_node_is_called():
    route = EgressRoute.of(ALLOW, [record("local", "/tmp/rl360-egress-a/control.sock", backend="local")])
    assert route.control == "/tmp/rl360-egress-a/control.sock" and route.port == 3200 and not route.controls
    assert route.on_node("n7") is route


def test_on_slurm_each_node_takes_its_own_proxy():
    route = EgressRoute.of(ALLOW, [record("n2", "/tmp/e-n2/control.sock"), record("n3", "/tmp/e-n3/control.sock")])
    assert route.control == "" and route.controls == {"n2": "/tmp/e-n2/control.sock", "n3": "/tmp/e-n3/control.sock"}
    on_n3 = route.on_node("n3")
    assert (on_n3.control, on_n3.node, on_n3.mode, on_n3.port) == ("/tmp/e-n3/control.sock", "n3", "allow", 3200)


@pytest.mark.parametrize("records", [[record("n2", "/tmp/e-n2/control.sock")], []])
def test_a_node_without_a_proxy_fails_every_attach_in_one_line(records):
    route = EgressRoute.of(ALLOW, records).on_node("n4")
    with pytest.raises(EgressUnavailable) as failed:
        asyncio.run(route.attach("sandbox-1", 1))
    assert str(failed.value) == ('[egress] mode is "allow" but no egress proxy is recorded for node n4: start it with '
                                 "`rl360 up` (its `egress` stage)")
    assert route.mode == "allow"  # never "open": the sandbox gets no network, its start fails


def test_other_modes_need_no_proxy():
    for mode in ("none", "open"):
        route = EgressRoute.of(EgressConfig(mode=mode), [record("n2", "/tmp/e-n2/control.sock")])
        assert route.on_node("n2") == EgressRoute(mode=mode, port=3128)


def test_the_node_is_slurms_name_for_it(monkeypatch):
    monkeypatch.setenv("SLURMD_NODENAME", "n3")
    assert node_name() == "n3"
