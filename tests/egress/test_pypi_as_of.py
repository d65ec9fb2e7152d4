"""`[egress] pypi_as_of`: PyPI's Simple API as of a date. The filter alone (simple_api.py), the profile key, then
the real proxy process with a real pip and uv resolving through it from a loopback stand-in for PyPI (an index
in JSON whose project has two releases, one uploaded before the date and one after), in this test's own
network namespace and in sandboxes of both providers. Loopback only."""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
import zipfile
from datetime import UTC, datetime
from pathlib import Path

import pytest

from rl360cli.configload import ConfigError
from rl360cli.egress.ca import EgressCA
from rl360cli.egress.config import EgressConfig
from rl360cli.egress.simple_api import (
    JSON_TYPE,
    NotDatable,
    accepts_json,
    files_as_of,
    version_of,
)
from rl360cli.egress.standin import InternetStandIn
from tests.conftest import need
from tests.egress.test_egress_config import profile

pytestmark = pytest.mark.timeout(240)

AS_OF = "2026-04-23T00:00:00Z"
# rlpin 1.0 was there on the date, 2.0 came after it.
UPLOADS = {"1.0": "2026-01-05T10:00:00.123456Z", "2.0": "2026-06-01T10:00:00.123456Z"}
HOST = "pypi.example.test"


# ----------------------------------------------------------------------------- the filter alone


def page(files: list[dict], **more) -> bytes:
    return json.dumps({"meta": {"api-version": "1.1"}, "name": "rl-pin", "files": files, **more}).encode()


def entry(filename: str, uploaded: str | None) -> dict:
    out = {"filename": filename, "url": f"https://files.example.test/{filename}", "hashes": {}}
    if uploaded is not None:
        out["upload-time"] = uploaded
    return out


def test_files_uploaded_after_the_date_are_dropped_and_versions_follow():
    body = page([entry("rl_pin-1.0-py3-none-any.whl", UPLOADS["1.0"]), entry("rl-pin-1.0.tar.gz", UPLOADS["1.0"]),
                 entry("rl_pin-1.1-py3-none-any.whl", UPLOADS["1.0"]),
                 entry("rl-pin-1.1.tar.gz", "2026-05-01T00:00:00Z"),  # 1.1's sdist came later: 1.1 stays
                 entry("rl_pin-2.0-py3-none-any.whl", UPLOADS["2.0"]), entry("rl-pin-2.0.tar.gz", UPLOADS["2.0"]),
                 entry("rl_pin-2.1-py3-none-any.whl", "2026-04-23T00:00:00+00:00")],  # at the moment: kept
                versions=["1.0", "1.1", "2.0", "2.1"])
    dated = json.loads(files_as_of(body, datetime(2026, 4, 23, tzinfo=UTC)))
    assert [f["filename"] for f in dated["files"]] == ["rl_pin-1.0-py3-none-any.whl", "rl-pin-1.0.tar.gz",
                                                       "rl_pin-1.1-py3-none-any.whl", "rl_pin-2.1-py3-none-any.whl"]
    assert dated["versions"] == ["1.0", "1.1", "2.1"] and dated["name"] == "rl-pin" and dated["meta"]
    # A zone other than UTC is the same moment.
    assert len(json.loads(files_as_of(body, datetime.fromisoformat("2026-04-22T20:00:00-04:00")))["files"]) == 4


def test_a_page_that_cannot_be_dated_says_why():
    moment = datetime(2026, 4, 23, tzinfo=UTC)
    with pytest.raises(NotDatable, match="not a PEP 691 JSON project page"):
        files_as_of(b"<html><a href='x'>x</a></html>", moment)
    with pytest.raises(NotDatable, match="rl_pin-1.0-py3-none-any.whl has no upload-time"):
        files_as_of(page([entry("rl_pin-1.0-py3-none-any.whl", None)]), moment)
    with pytest.raises(NotDatable, match="has no upload-time with a zone"):
        files_as_of(page([entry("rl_pin-1.0-py3-none-any.whl", "2026-01-05T10:00:00")]), moment)


def test_a_files_version_is_read_from_its_name():
    assert version_of("rl_pin-1.0-py3-none-any.whl", "rl-pin") == "1.0"
    assert version_of("rl-pin-2.0rc1.tar.gz", "rl-pin") == "2.0rc1"
    assert version_of("rl.pin-1.0.0-RC1.zip", "rl-pin") == "1.0.0rc1"  # canonical, as `versions` is compared
    assert version_of("rl-pin-1.0.win32.exe", "rl-pin") is None


def test_json_is_what_uv_and_pip_ask_for():
    assert accepts_json(f"{JSON_TYPE}, application/vnd.pypi.simple.v1+html;q=0.2, text/html;q=0.01")  # uv
    assert accepts_json(f"{JSON_TYPE}, application/vnd.pypi.simple.v1+html; q=0.1, text/html; q=0.01")  # pip
    assert not accepts_json("text/html") and not accepts_json("")


# ----------------------------------------------------------------------------- the profile's key


def test_the_key_loads_and_dates_pypis_project_pages(tmp_path):
    egress = profile(tmp_path, f'[egress]\nmode = "allow"\nallow = ["pypi.org"]\npypi_as_of = "{AS_OF}"\n').egress
    assert egress.as_of("https://pypi.org/simple/mcp/") == datetime(2026, 4, 23, tzinfo=UTC)
    assert egress.as_of("https://pypi.org/simple/") is None  # the list of projects says no dates
    assert egress.as_of("https://files.pythonhosted.org/packages/x.whl") is None
    assert egress.dated_hosts == {("pypi.org", 443)} and egress.tls_hosts == {("pypi.org", 443)}
    # Its TLS is ended only for a client that trusts the CA; a blind tunnel for the others.
    assert egress.terminates_tls("pypi.org", 443) and not egress.terminates_tls("pypi.org", 443, trusts_ca=False)
    undated = EgressConfig(mode="allow", allow=("pypi.org",))
    assert undated.as_of("https://pypi.org/simple/mcp/") is None and not undated.terminates_tls("pypi.org", 443)


@pytest.mark.parametrize(("table", "message"), [
    ('mode = "allow"\npypi_as_of = "2026-04-23"\n',
     "pypi_as_of: '2026-04-23' must be an RFC 3339 time with its zone (e.g. \"2026-04-23T00:00:00Z\")"),
    ('mode = "allow"\npypi_as_of = "yesterday"\n', "pypi_as_of: 'yesterday' must be an RFC 3339 time"),
    (f'pypi_as_of = "{AS_OF}"\n', 'pypi_as_of is for mode = "allow" (mode is "none")'),
    (f'mode = "allow"\npypi_as_of = "{AS_OF}"\npypi_indexes = ["https://pypi.org/simple"]\n',
     "pypi_indexes: 'https://pypi.org/simple' must be a Simple API URL prefix ending in \"/\""),
])
def test_a_bad_value_is_one_line_naming_the_fix(tmp_path, table, message):
    with pytest.raises(ConfigError) as caught:
        profile(tmp_path, "[egress]\n" + table)
    assert message in str(caught.value) and "\n" not in str(caught.value).strip(), str(caught.value)


# ----------------------------------------------------------------------------- a stand-in for PyPI


def wheel(version: str) -> tuple[bytes, bytes]:
    """A wheel of `rlpin` `version` (its module says the version) and its METADATA."""
    metadata = f"Metadata-Version: 2.1\nName: rlpin\nVersion: {version}\n".encode()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        info = f"rlpin-{version}.dist-info"
        archive.writestr("rlpin/__init__.py", f"VERSION = {version!r}\n")
        archive.writestr(f"{info}/METADATA", metadata)
        archive.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: rl360-test\nRoot-Is-Purelib: true\n"
                                          "Tag: py3-none-any\n")
        archive.writestr(f"{info}/RECORD", "")
    return buffer.getvalue(), metadata


def fake_pypi(*, gzipped: bool = False) -> tuple[dict[str, bytes], dict[str, dict[str, str]]]:
    """The files of a Simple API index holding `rlpin` 1.0 and 2.0 (UPLOADS), its page in JSON with PEP 700
    upload times and PEP 658 metadata (as `core-metadata`, PEP 714), its files beside it (relative URLs: one
    host serves both), and the headers its answers carry; `gzipped`: the page as PyPI sends it to a client
    that takes gzip."""
    files, listed = {}, []
    for version, uploaded in UPLOADS.items():
        name = f"rlpin-{version}-py3-none-any.whl"
        data, metadata = wheel(version)
        files[f"/files/{name}"], files[f"/files/{name}.metadata"] = data, metadata
        meta_hash = {"sha256": hashlib.sha256(metadata).hexdigest()}
        listed.append({"filename": name, "url": f"../../files/{name}", "upload-time": uploaded, "size": len(data),
                       "hashes": {"sha256": hashlib.sha256(data).hexdigest()}, "requires-python": ">=3.8",
                       "core-metadata": meta_hash, "yanked": False})  # PEP 714: older pips skip it
    files["/simple/rlpin/"] = json.dumps({"meta": {"api-version": "1.1"}, "name": "rlpin", "files": listed,
                                          "versions": list(UPLOADS)}).encode()
    files["/html/rlpin/"] = b"<html><a href='../../files/rlpin-2.0-py3-none-any.whl'>rlpin 2.0</a></html>"
    headers = {"/simple/rlpin/": {"Content-Type": JSON_TYPE}, "/html/rlpin/": {"Content-Type": "text/html"}}
    if gzipped:
        files["/simple/rlpin/"] = gzip.compress(files["/simple/rlpin/"])
        headers["/simple/rlpin/"]["Content-Encoding"] = "gzip"
    return files, headers


@pytest.fixture
def pypi(tmp_path):
    """The stand-in for PyPI, over TLS under a CA of its own (the proxy verifies it, as it verifies pypi.org), its
    page gzipped as PyPI's."""
    origin_ca = EgressCA.load_or_make(tmp_path / "origin-ca")
    files, headers = fake_pypi(gzipped=True)
    with InternetStandIn(files, tls=origin_ca.server_context(HOST), headers=headers,
                         cache_control="max-age=600, public") as standin:
        standin.ca_file = str(origin_ca.folder / "ca.crt")
        yield standin


def dated_proxy(proxy_of, pypi):
    """A proxy that dates the stand-in's index (an allowed https host, as pypi.org is in a profile) and verifies
    the stand-in's TLS with the stand-in's CA."""
    return proxy_of(f'allow = ["{HOST}"]\npypi_as_of = "{AS_OF}"\npypi_indexes = ["https://{HOST}:{pypi.port}/simple/"]'
                    f'\n[egress.hosts]\n"{HOST}" = "127.0.0.1"\n', env={"SSL_CERT_FILE": pypi.ca_file})


def attach(proxy, tmp_path, *, trusts_ca: bool) -> str:
    """Attach this test's own namespace; the CA the proxy answers, in a file."""
    pem = asyncio.run(proxy.route.attach("t", os.getpid(), trusts_ca=trusts_ca))
    path = tmp_path / "egress-ca.pem"
    path.write_text(pem)
    return str(path)


def through(proxy) -> dict[str, str]:
    """An environment with the proxy and nothing of this machine's pip or TLS settings (its bundles, indexes)."""
    url = f"http://127.0.0.1:{proxy.route.port}"
    return {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root"), "HTTPS_PROXY": url,
            "https_proxy": url}


def pip_download(proxy, pypi, cafile: str, folder: Path) -> list[str]:
    """A real pip resolves `rlpin` from the stand-in's index through the proxy: the files it downloaded."""
    done = subprocess.run([sys.executable, "-m", "pip", "download", "--isolated", "--no-deps", "--no-cache-dir",
                           "--disable-pip-version-check", "--index-url", f"https://{HOST}:{pypi.port}/simple/",
                           "--cert", cafile, "-d", str(folder), "rlpin"],
                          env=through(proxy), capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return sorted(p.name for p in folder.iterdir())


def report(proxy):
    return asyncio.run(proxy.route.detach("t"))


def test_pip_resolves_pypi_as_it_was_on_the_date(proxy_of, pypi, tmp_path):
    proxy = dated_proxy(proxy_of, pypi)
    cafile = attach(proxy, tmp_path, trusts_ca=True)
    for run in ("first", "cached"):  # the second page from the proxy's cache, kept dated
        assert pip_download(proxy, pypi, cafile, tmp_path / run) == ["rlpin-1.0-py3-none-any.whl"]
    assert pypi.gets["/simple/rlpin/"] == 1 and pypi.gets["/files/rlpin-2.0-py3-none-any.whl"] == 0
    stats = proxy.stats()
    assert stats["dated_pages"] == 2 and stats["cache_hits"] >= 1 and stats["tls_terminated"] >= 2
    seen = report(proxy)
    assert not seen.denied and not seen.failed and not seen.lines


def real_uv(tmp_path) -> str:
    """A uv binary: on PATH, else from the uv wheel that cluster/dev/docker-nodes.sh keeps in its cache."""
    found = shutil.which("uv")
    if found:
        return found
    cache = Path(os.environ.get("RL360_DEV_CACHE", "/tmp/rl360-dev/cache")) / "wheels"
    wheels = sorted(cache.glob("uv-*manylinux*x86_64*.whl"))
    need(bool(wheels), f"a uv binary (on PATH, or uv's wheel in {cache}: cluster/dev/docker-nodes.sh up)")
    with zipfile.ZipFile(wheels[-1]) as archive:
        member = next(n for n in archive.namelist() if n.endswith(".data/scripts/uv"))
        (tmp_path / "uv").write_bytes(archive.read(member))
    (tmp_path / "uv").chmod(0o755)
    return str(tmp_path / "uv")


def test_uv_resolves_pypi_as_it_was_on_the_date(proxy_of, pypi, tmp_path):
    uv = real_uv(tmp_path)
    proxy = dated_proxy(proxy_of, pypi)
    cafile = attach(proxy, tmp_path, trusts_ca=True)
    done = subprocess.run([uv, "pip", "compile", "-", "--no-cache", "--no-header", "--python-version", "3.11",
                           "--index-url", f"https://{HOST}:{pypi.port}/simple/"], input="rlpin\n",
                          env={**through(proxy), "SSL_CERT_FILE": cafile}, capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0 and "rlpin==1.0" in done.stdout.split(), done.stdout + done.stderr
    assert pypi.gets["/simple/rlpin/"] == 1 and proxy.stats()["dated_pages"] == 1
    assert not report(proxy).failed


def test_html_cannot_be_dated_and_is_a_failure_that_says_so(proxy_of, pypi, tmp_path):
    proxy = proxy_of(f'allow = ["{HOST}"]\npypi_as_of = "{AS_OF}"\npypi_indexes = ["https://{HOST}:{pypi.port}/simple/",'
                     f' "https://{HOST}:{pypi.port}/html/"]\n[egress.hosts]\n"{HOST}" = "127.0.0.1"\n',
                     env={"SSL_CERT_FILE": pypi.ca_file})
    cafile = attach(proxy, tmp_path, trusts_ca=True)
    import ssl

    context = ssl.create_default_context(cafile=cafile)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({"https": f"http://127.0.0.1:{proxy.route.port}"}),
                                         urllib.request.HTTPSHandler(context=context))

    def get(path: str, accept: str) -> tuple[int, str]:
        try:
            with opener.open(urllib.request.Request(f"https://{HOST}:{pypi.port}{path}", headers={"Accept": accept}),
                             timeout=20) as answer:
                return answer.status, answer.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    # A client that takes only HTML (pip before 22.2): nothing is fetched.
    status, line = get("/simple/rlpin/", "text/html")
    assert status == 406 and line.startswith(f"rl360 egress: https://{HOST}:{pypi.port}/simple/rlpin/ is dated by "
                                             "[egress] pypi_as_of, which needs the Simple API's JSON form"), line
    # An index that answers HTML to a request for JSON: refused whole.
    status, line = get("/html/rlpin/", JSON_TYPE)
    assert status == 502 and "cannot be dated for [egress] pypi_as_of: the index answered text/html" in line, line
    assert pypi.gets["/simple/rlpin/"] == 0
    seen = report(proxy)
    assert seen.failed == {HOST: 2} and not seen.denied and seen.failure.startswith("rl360 egress: https://")


def test_a_mirror_of_pypi_is_dated_as_pypi_is(proxy_of, tmp_path):
    """An air-gapped cluster: PyPI's index mapped to a mirror on the cluster's network (here plain HTTP on loopback).
    The date follows the URL the sandbox asked for; the mirror's page is what is dated."""
    import ssl

    files, headers = fake_pypi()  # a mirror that does not compress
    with InternetStandIn(files, headers=headers) as mirror:
        proxy = proxy_of(f'pypi_as_of = "{AS_OF}"\npypi_indexes = ["https://{HOST}/simple/"]\n'
                         f'[egress.mirrors]\n"https://{HOST}/simple/" = "{mirror.url("/simple/")}"\n')
        cafile = attach(proxy, tmp_path, trusts_ca=True)
        opener = urllib.request.build_opener(
            urllib.request.ProxyHandler({"https": f"http://127.0.0.1:{proxy.route.port}"}),
            urllib.request.HTTPSHandler(context=ssl.create_default_context(cafile=cafile)))
        request = urllib.request.Request(f"https://{HOST}/simple/rlpin/", headers={"Accept": JSON_TYPE})
        with opener.open(request, timeout=20) as answer:
            dated = json.loads(answer.read())
        assert [f["filename"] for f in dated["files"]] == ["rlpin-1.0-py3-none-any.whl"] and dated["versions"] == ["1.0"]
        assert mirror.gets["/simple/rlpin/"] == 1 and not report(proxy).failed


def test_a_client_that_cannot_trust_the_ca_gets_a_blind_tunnel_and_is_told(proxy_of, pypi, tmp_path):
    """An image build's RUN steps and a docker sidecar are attached without `trusts_ca`: PyPI undated, said."""
    proxy = dated_proxy(proxy_of, pypi)
    attach(proxy, tmp_path, trusts_ca=False)
    assert pip_download(proxy, pypi, pypi.ca_file, tmp_path / "d") == ["rlpin-2.0-py3-none-any.whl"]
    stats = proxy.stats()
    assert stats.get("tls_terminated", 0) == 0 and stats["tunnels"] >= 1
    seen = report(proxy)
    assert not seen.failed and not seen.denied and seen.lines == (
        (f"rl360 egress: {HOST} reached undated, through a blind tunnel: [egress] pypi_as_of holds for sandboxes "
         "that trust the rl360 egress CA, which an image build or a sidecar is not given"),)


# ----------------------------------------------------------------------------- in sandboxes of both providers

# The python:3.12-slim stand-in has pip (24.3), and pip.conf naming the system bundle, where the provider puts the CA.
PIP_IMAGE = "127.0.0.1:5000/hub/library/python:3.12-slim"


def test_pip_in_a_sandbox_resolves_pypi_as_it_was_on_the_date(request, provider_of, proxy_of, pypi, tmp_path):
    """The sandbox's own pip, its own trust (the provider installed the CA: `trusts_ca`): rlpin 1.0, not 2.0."""
    from rl360cli.sandbox.task_loader import load_task
    from tests.egress.test_egress_sandboxes import attempt
    from tests.sandbox.conftest import PYTHON, write_task

    docker = request.node.callspec.params["provider_of"] == "docker"
    task = load_task(write_task(tmp_path, "pinned", image=PIP_IMAGE if docker else PYTHON,
                                toml="[environment]\ncpus = 1\n"))
    proxy = dated_proxy(proxy_of, pypi)
    result, (downloaded,) = attempt(provider_of(proxy.route), task,
                                    "d=$(mktemp -d) && python3 -m pip download -q --isolated --no-deps "
                                    f"--index-url https://{HOST}:{pypi.port}/simple/ -d $d rlpin && ls $d")
    assert downloaded.exit_code == 0 and downloaded.output.split() == ["rlpin-1.0-py3-none-any.whl"], (
        downloaded.output)
    assert pypi.gets["/simple/rlpin/"] == 1 and pypi.gets["/files/rlpin-2.0-py3-none-any.whl"] == 0
    assert proxy.stats()["dated_pages"] == 1
    assert not result.egress.failed and not result.egress.denied, result.egress
