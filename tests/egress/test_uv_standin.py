"""The uv installer's stand-in (rl360cli/egress/uv_standin.py) behind an https:// mirror, as harbor-cookbook's
verifiers use it: in a sandbox of each provider, `install.sh` fetched from https://astral.example.test through
the egress proxy, piped to sh, installs uv and uvx (here from a wheel this test makes: two sh scripts) and
writes `$HOME/.local/bin/env`, after which `uv` and `uvx` are on PATH. Loopback only."""

from __future__ import annotations

import urllib.error
import urllib.request
import zipfile

import pytest

from rl360cli.egress.uv_standin import UvInstallerStandIn
from rl360cli.outcome import Outcome
from rl360cli.sandbox.task_loader import load_task
from tests.egress.test_egress_sandboxes import FETCH_TLS, attempt, network_task
from tests.sandbox.conftest import PYTHON, write_task

pytestmark = pytest.mark.timeout(240)


def tls_network_task(request, tmp_path, name: str):
    """A task that wants the internet, for the parametrized provider: on docker its image has the CA bundle
    layout Debian's ca-certificates and openssl give an image (an empty bundle here)."""
    if request.node.callspec.params["provider_of"] == "docker":
        return load_task(write_task(tmp_path, name, image=None, dockerfile=(
            f"FROM {PYTHON}\nRUN mkdir -p /etc/ssl/certs /usr/lib/ssl && touch /etc/ssl/certs/ca-certificates.crt"
            " && ln -s /etc/ssl/certs/ca-certificates.crt /usr/lib/ssl/cert.pem\n")))
    return network_task(tmp_path, name)


def made_wheel(folder):
    wheel = folder / "uv-0.0.1-py3-none-manylinux_2_17_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name in ("uv", "uvx"):
            archive.writestr(f"uv-0.0.1.data/scripts/{name}", f"#!/bin/sh\necho '{name} 0.0.1 (a test wheel)' \"$@\"\n")
    return wheel


def test_the_installer_stand_in_installs_uv_behind_an_https_mirror(request, provider_of, proxy_of, tmp_path):
    with UvInstallerStandIn(made_wheel(tmp_path), public="https://astral.example.test/uv/") as standin:
        proxy = proxy_of(f'[egress.mirrors]\n"https://astral.example.test/uv/" = "{standin.url("/uv/")}"\n')
        task = tls_network_task(request, tmp_path, "uv")
        fetch = FETCH_TLS.format(url="https://astral.example.test/uv/0.9.7/install.sh", cadata="")
        result, (installed, used) = attempt(
            provider_of(proxy.route), task, f"({fetch}\n) | sh",
            '. "$HOME/.local/bin/env" && uv --version && uvx pytest && echo "$PATH" | tr : "\\n" | grep -cx "$HOME/.local/bin"')
        assert installed.exit_code == 0, installed.output
        assert "rl360 stand-in for astral.sh's uv installer: installing uv 0.0.1 (the URL asked for 0.9.7)" in (
            installed.output)
        assert used.exit_code == 0 and used.output.split("\n")[:3] == [
            "uv 0.0.1 (a test wheel) --version", "uvx 0.0.1 (a test wheel) pytest", "1"], used.output
        assert standin.gets == {"/uv/0.9.7/install.sh": 1, "/uv/stand-in/uv-x86_64-unknown-linux-gnu.tar.gz": 1}
        assert result.outcome == Outcome.OK and not result.egress.denied and not result.egress.failed
        assert proxy.stats()["tls_terminated"] == 2


def test_the_stand_in_serves_the_latest_installer_too_and_nothing_else(tmp_path):
    """mcp-tools' oracle fetches the unversioned https://astral.sh/uv/install.sh."""
    with UvInstallerStandIn(made_wheel(tmp_path), public="https://astral.example.test/uv/") as standin:
        for path, asked in (("/uv/install.sh", "latest"), ("/uv/0.9.7/install.sh", "0.9.7")):
            script = urllib.request.urlopen(standin.url(path), timeout=10).read().decode()
            assert f"installing uv 0.0.1 (the URL asked for {asked})" in script, script[:300]
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(standin.url("/uv/0.9.7/uv.sh"), timeout=10)
        assert refused.value.code == 404
