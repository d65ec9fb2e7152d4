"""Fixtures of the egress tests: the real proxy as its own process (`python -m rl360cli.egress.proxy`, as the
`egress` stage starts it), and the internet's loopback stand-in. Loopback only: no test sends a packet to
any other address."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from rl360cli import procinfo
from rl360cli.egress.client import EgressRoute
from rl360cli.egress.standin import InternetStandIn
from tests.conftest import REPO, need

# The real providers of the sandbox tests (bubblewrap, the dev Docker nodes), as they are there.
from tests.sandbox.conftest import (  # noqa: F401
    bwrap,
    docker_node_specs,
    docker_provider,
    process_config,
    process_provider,
    sandbox_root,
)

FILES = {"/uv/install.sh": b"echo uv installed\n", "/pkg/big.bin": bytes(range(256)) * 4096,
         "/simple/index.html": b"<html>index</html>\n"}


def proxy_pids(argument_prefix: str) -> list[int]:
    """The pids of egress proxy processes with an argument starting with `argument_prefix` (their cache, their
    control socket's folder)."""
    found = []
    for proc in procinfo.all_processes():
        try:
            argv = Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"rl360cli.egress.proxy" in argv and any(a.startswith(argument_prefix.encode()) for a in argv):
            found.append(proc.pid)
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(params=["process", "docker"])
def provider_of(request):
    """`provider_of(route)`: a provider of the parametrized kind whose network tasks go out by `route`."""
    fixture = request.getfixturevalue("process_provider" if request.param == "process" else "docker_provider")
    if request.param == "docker":
        from rl360cli.sandbox.config import WarmPoolConfig

        return lambda route: fixture(egress=route, warm_pool=WarmPoolConfig(size=0))
    return lambda route: fixture(egress=route)


@pytest.fixture
def outside():
    """The internet, as a loopback stand-in serving FILES."""
    with InternetStandIn(FILES) as standin:
        yield standin


class Proxy:
    """A running egress proxy process and the route to it."""

    def __init__(self, folder: Path, egress_toml: str, port: int, env: dict[str, str] | None = None):
        self.folder = folder
        self.profile = folder / "profile.toml"
        self.profile.write_text(f'name = "egress-test"\n[egress]\nsandbox_port = {port}\n{egress_toml}')
        self.control = folder / "control.sock"
        self.log = folder / "proxy.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "rl360cli.egress.proxy", "--profile", str(self.profile),
                                          "--control", str(self.control), "--cache", str(folder / "cache"),
                                          "--ready", str(folder / "ready.json")],
                                         cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                         env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})})
        self.route = EgressRoute(mode="allow", control=str(self.control), port=port)
        deadline = time.monotonic() + 20
        while not (folder / "ready.json").exists():  # written once the control socket listens
            assert self.proc.poll() is None, self.log.read_text()
            assert time.monotonic() < deadline, "the proxy did not start"
            time.sleep(0.05)

    def stats(self) -> dict:
        return asyncio.run(self.route.stats())

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=20)


@pytest.fixture
def proxy_of():
    """`proxy_of(egress_toml, env=...)`: a proxy process serving that [egress] table (mode allow), with `env` added
    to its environment (SSL_CERT_FILE: the roots it verifies upstream TLS with); stopped after."""
    need(os.geteuid() == 0, "the egress proxy enters sandboxes' network namespaces: run as root")
    made = []

    def make(egress_toml: str, *, port: int | None = None, env: dict[str, str] | None = None) -> Proxy:
        folder = Path(tempfile.mkdtemp(prefix=f"rl360-egress-{uuid.uuid4().hex[:6]}-"))
        proxy = Proxy(folder, 'mode = "allow"\n' + egress_toml, port or free_port(), env)
        made.append(proxy)
        return proxy

    yield make
    for proxy in made:
        proxy.stop()
        shutil.rmtree(proxy.folder, ignore_errors=True)  # its socket, cache, CA and log
