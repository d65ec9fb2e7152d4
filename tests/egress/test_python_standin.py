"""The managed-Python stand-in (rl360cli/egress/python_standin.py) with the real uv (0.9.7, PyPI's wheel, as the
dev profile's installer stand-in installs it): uv installs this machine's CPython 3.13 from the stand-in's list,
verifying the archive's sha256, and refuses it when the list's sha256 differs; and in a sandbox of each provider,
as Terminal-Bench 2.0's verifiers do it (`curl https://astral.sh/uv/<v>/install.sh | sh; source
$HOME/.local/bin/env; uvx -p 3.13 ...`), both stand-ins behind the dev profile's https:// mirrors, uv runs the
stand-in's CPython. Loopback only: both mirrored hosts are answered by the egress proxy itself."""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
import zipfile
from pathlib import Path

import pytest

from rl360cli.egress.python_standin import LIST, PUBLIC, TAG, PythonDownloadsStandIn, archive_name
from rl360cli.egress.uv_standin import UvInstallerStandIn
from rl360cli.outcome import Outcome
from tests.conftest import need
from tests.egress.conftest import free_port
from tests.egress.test_egress_sandboxes import FETCH_TLS, attempt
from tests.egress.test_uv_standin import made_wheel, tls_network_task

pytestmark = pytest.mark.timeout(300)

PYENV = Path(os.environ.get("PYENV_ROOT", str(Path.home() / ".pyenv"))) / "versions"
WHEELS = (Path("/opt/wheels"), Path(os.environ.get("RL360_DEV_CACHE", "/tmp/rl360-dev/cache")) / "wheels")
# What uv prints of the stand-in's CPython: its version, the install's BUILD file (the list's build name), its prefix.
PROBE = ("python -c \"import sys, sysconfig; print(sys.version.split()[0]); print(open(sys.base_prefix + '/BUILD')"
         ".read().strip()); print(sys.base_prefix); print(sysconfig.get_config_var('prefix'))\"")


@pytest.fixture(scope="module")
def cpython313() -> Path:
    found = sorted(PYENV.glob("3.13.*"))
    need(bool(found), f"no CPython 3.13 under {PYENV} (the stand-in repacks it)")
    return found[-1]


@pytest.fixture(scope="module")
def uv_wheel() -> Path:
    found = [w for d in WHEELS for w in sorted(d.glob("uv-0.9.7-*manylinux*x86_64*.whl"))]
    need(bool(found), "no uv 0.9.7 wheel in /opt/wheels or the dev cache: run bash cluster/dev/docker-nodes.sh up")
    return found[0]


def uv_binary(wheel: Path, folder: Path) -> Path:
    """`uv` (and `uvx` beside it) of the wheel, in `folder`."""
    with zipfile.ZipFile(wheel) as archive:
        for name in ("uv", "uvx"):
            (folder / name).write_bytes(archive.read(f"uv-0.9.7.data/scripts/{name}"))
            (folder / name).chmod(0o755)
    return folder / "uv"


def test_uv_installs_the_stand_ins_cpython_by_its_list_and_checks_the_sha256(cpython313, uv_wheel, tmp_path):
    uv = uv_binary(uv_wheel, tmp_path)
    with PythonDownloadsStandIn([cpython313]) as standin:
        listed = json.loads(urllib.request.urlopen(standin.url(f"/python-build-standalone/{TAG}/{LIST}"),
                                                   timeout=10).read())
        assert list(listed) == ["cpython-3.13.0-linux-x86_64-gnu"] and listed[
            "cpython-3.13.0-linux-x86_64-gnu"]["url"] == PUBLIC + f"{TAG}/{archive_name('3.13.0')}"
        for good in (True, False):
            # No proxy here: the entry names the stand-in itself.
            entry = dict(listed["cpython-3.13.0-linux-x86_64-gnu"],
                         url=standin.url(f"/python-build-standalone/{TAG}/{archive_name('3.13.0')}"))
            if not good:
                entry["sha256"] = "0" * 64
            home = tmp_path / f"home-{good}"
            home.mkdir()
            (home / "list.json").write_text(json.dumps({"cpython-3.13.0-linux-x86_64-gnu": entry}))
            env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "UV_PYTHON_DOWNLOADS_JSON_URL": str(home / "list.json")}
            installed = subprocess.run([str(uv), "python", "install", "3.13"], env=env, capture_output=True,
                                       text=True, timeout=120)
            if not good:
                assert installed.returncode != 0 and "Hash mismatch" in installed.stderr, installed.stderr
                continue
            assert installed.returncode == 0, installed.stderr
            ran = subprocess.run(f"{uv.parent}/uvx -p 3.13 {PROBE}", shell=True, env=env, capture_output=True,
                                 text=True, timeout=60)
            prefix = home / ".local/share/uv/python/cpython-3.13.0-linux-x86_64-gnu"
            # uv wrote the list's build name, and rewrote the archive's /install prefix to where it installed.
            assert ran.stdout.split("\n")[:4] == ["3.13.0", TAG, str(prefix), str(prefix)], (ran.stdout, ran.stderr)
        assert standin.gets[f"/python-build-standalone/{TAG}/{archive_name('3.13.0')}"] == 2


def test_uvx_in_a_sandbox_runs_the_stand_ins_cpython_behind_the_dev_profiles_mirrors(
        request, provider_of, proxy_of, cpython313, uv_wheel, tmp_path):
    with (PythonDownloadsStandIn([cpython313]) as pythons,
          UvInstallerStandIn(uv_wheel, python_downloads=pythons.list_url()) as installer):
        # cluster/dev-docker.toml's two mirrors, to this test's stand-ins.
        proxy = proxy_of(f'[egress.mirrors]\n"https://astral.sh/uv/" = "{installer.url("/uv/")}"\n'
                         f'"{PUBLIC}" = "{pythons.url("/python-build-standalone/")}"\n')
        task = tls_network_task(request, tmp_path, "uvpy")
        fetch = FETCH_TLS.format(url="https://astral.sh/uv/0.9.5/install.sh", cadata="")
        result, (installed, used) = attempt(
            provider_of(proxy.route), task, f"({fetch}\n) | sh",
            f'source "$HOME/.local/bin/env" && uvx -p 3.13 {PROBE}')
        assert installed.exit_code == 0, installed.output
        assert f"rl360 stand-in: uv's managed Pythons from {pythons.list_url()}" in installed.output
        # uv said it downloaded (its stderr comes first), then the stand-in's CPython printed.
        assert used.exit_code == 0 and "Downloading cpython-3.13.0-linux-x86_64-gnu" in used.output, used.output
        lines = used.output.strip().split("\n")[-4:]
        assert lines[:2] == ["3.13.0", TAG], used.output
        assert lines[2].endswith("/uv/python/cpython-3.13.0-linux-x86_64-gnu") and lines[3] == lines[2], used.output
        assert pythons.gets == {f"/python-build-standalone/{TAG}/{LIST}": 1,
                                f"/python-build-standalone/{TAG}/{archive_name('3.13.0')}": 1}
        assert result.outcome == Outcome.OK and not result.egress.denied and not result.egress.failed



def test_the_installer_goes_on_without_the_list_when_it_cannot_be_fetched(tmp_path):
    """The stand-in's list unreachable (its stand-in down): uv is installed all the same, the script says why
    uv will ask github.com, and the env file sets no UV_PYTHON_DOWNLOADS_JSON_URL (no list to name)."""
    port = free_port()
    with UvInstallerStandIn(made_wheel(tmp_path), port=port, public=f"http://127.0.0.1:{port}/uv/",
                            python_downloads="http://127.0.0.1:9/nothing/python-downloads.json") as standin:
        script = urllib.request.urlopen(standin.url("/uv/0.9.5/install.sh"), timeout=10).read()
        ran = subprocess.run(["sh"], input=script, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
                             capture_output=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    assert (b"rl360 stand-in: no managed-Python list at http://127.0.0.1:9/nothing/python-downloads.json; uv will "
            b"ask github.com for one") in ran.stderr
    assert (tmp_path / ".local/bin/uv").exists() and "UV_PYTHON" not in (tmp_path / ".local/bin/env").read_text()
    assert not (tmp_path / ".local/share/uv/rl360-stand-in-python-downloads.json").exists()
