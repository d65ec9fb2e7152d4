"""The egress proxy on its own: a real proxy process attached to this test's own network namespace (so its
listener is on this machine's 127.0.0.1), a loopback stand-in for the internet, Python's HTTP clients."""

from __future__ import annotations

import asyncio
import http.client
import os
import ssl
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.egress.conftest import FILES

pytestmark = pytest.mark.timeout(120)


def attached(proxy, name: str = "t"):
    asyncio.run(proxy.route.attach(name, os.getpid()))


def get(proxy, url: str) -> bytes:
    port = proxy.route.port
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": f"http://127.0.0.1:{port}"}))
    with opener.open(url, timeout=20) as answer:
        return answer.read()


def report(proxy, name: str = "t"):
    return asyncio.run(proxy.route.detach(name))


def pinned(outside) -> str:
    return '[egress.hosts]\n"files.example.test" = "127.0.0.1"\n'


def test_an_allowed_host_is_fetched_and_counted(proxy_of, outside):
    proxy = proxy_of('allow = ["files.example.test"]\n' + pinned(outside))
    attached(proxy)
    assert get(proxy, outside.url("/uv/install.sh", "files.example.test")) == FILES["/uv/install.sh"]
    seen = report(proxy)
    assert seen.bytes == {"files.example.test": len(FILES["/uv/install.sh"])} and not seen.denied


def test_a_host_off_the_list_is_refused_with_one_clear_line(proxy_of, outside):
    proxy = proxy_of('allow = ["files.example.test"]\n' + pinned(outside))
    attached(proxy)
    with pytest.raises(urllib.error.HTTPError) as caught:
        get(proxy, outside.url("/uv/install.sh", "evil.example.test"))
    line = caught.value.read().decode().strip()
    assert caught.value.code == 403 and line.startswith("rl360 egress: evil.example.test is not on the profile's "
                                                         "[egress] allow list")
    # HTTPS: the CONNECT is refused, and the status line itself says why (what pip and Python print).
    tunnel = http.client.HTTPConnection("127.0.0.1", proxy.route.port, timeout=10)
    tunnel.set_tunnel("evil.example.test", 443)
    with pytest.raises(OSError, match="403 Forbidden: rl360 egress: evil.example.test is not on"):
        tunnel.request("GET", "/")
    seen = report(proxy)
    assert seen.denied == {"evil.example.test": 2} and not seen.failed and len(seen.lines) == 2
    assert outside.gets["/uv/install.sh"] == 0


def test_connect_tunnels_to_an_allowed_host(proxy_of, outside):
    proxy = proxy_of('allow = ["files.example.test"]\n' + pinned(outside))
    attached(proxy)
    tunnel = http.client.HTTPConnection("127.0.0.1", proxy.route.port, timeout=10)
    tunnel.set_tunnel("files.example.test", outside.port)
    tunnel.request("GET", "/uv/install.sh")
    assert tunnel.getresponse().read() == FILES["/uv/install.sh"]
    tunnel.close()
    seen = report(proxy)
    assert seen.bytes["files.example.test"] > len(FILES["/uv/install.sh"]) and proxy.stats()["tunnels"] == 1


def test_a_mirror_serves_the_stand_ins_file(proxy_of, outside):
    proxy = proxy_of(f'[egress.mirrors]\n"http://astral.example.test/uv/" = "{outside.url("/uv/")}"\n')
    attached(proxy)
    # Not on the allow-list (it is empty): the mirror alone lets it through, to where the operator said.
    assert get(proxy, "http://astral.example.test/uv/install.sh") == FILES["/uv/install.sh"]
    assert outside.gets["/uv/install.sh"] == 1


def test_n_fetches_of_one_file_cost_one_upstream_fetch(proxy_of, outside):
    proxy = proxy_of('allow = ["files.example.test"]\n' + pinned(outside))
    attached(proxy)
    url = outside.url("/pkg/big.bin", "files.example.test")
    with ThreadPoolExecutor(16) as pool:
        bodies = list(pool.map(lambda _: get(proxy, url), range(32)))
    assert all(b == FILES["/pkg/big.bin"] for b in bodies)
    assert outside.gets["/pkg/big.bin"] == 1
    stats = proxy.stats()
    assert stats["cache_hits"] == 31 and stats["upstream_fetches"] == 1
    assert report(proxy).cache_hits == 31


def test_an_allowed_name_that_resolves_to_the_node_itself_is_not_reached(proxy_of, outside):
    """DNS may say anything: `localhost` (or a name rebound to 127.0.0.1) is the node's router and engines."""
    proxy = proxy_of('allow = ["localhost"]\n')
    attached(proxy)
    with pytest.raises(urllib.error.HTTPError) as caught:
        get(proxy, outside.url("/uv/install.sh", "localhost"))
    assert caught.value.code == 502 and "an address of the node's own networks" in caught.value.read().decode()
    assert outside.gets["/uv/install.sh"] == 0
    assert report(proxy).failed == {"localhost": 1}


def test_an_allowed_host_that_does_not_answer_is_a_failure_not_a_denial(proxy_of, outside):
    proxy = proxy_of('allow = ["files.example.test"]\n[egress.hosts]\n"files.example.test" = "127.0.0.1"\n')
    attached(proxy)
    from tests.egress.conftest import free_port

    with pytest.raises(urllib.error.HTTPError) as caught:
        get(proxy, f"http://files.example.test:{free_port()}/x")
    assert caught.value.code == 502 and "cannot reach files.example.test" in caught.value.read().decode()
    seen = report(proxy)
    assert seen.failed == {"files.example.test": 1} and not seen.denied


# ----------------------------------------------------------------------------- https:// mirrors


def https_get(proxy, host: str, path: str, *, cafile: str, port: int = 443) -> tuple[int, bytes]:
    """GET https://host:port/path through the proxy (CONNECT), TLS verified against `cafile` only."""
    context = ssl.create_default_context(cafile=cafile)
    connection = http.client.HTTPSConnection("127.0.0.1", proxy.route.port, timeout=20, context=context)
    connection.set_tunnel(host, port)
    try:
        connection.request("GET", path)
        answer = connection.getresponse()
        return answer.status, answer.read()
    finally:
        connection.close()


def attached_ca(proxy, tmp_path, name: str = "t") -> str:
    pem = asyncio.run(proxy.route.attach(name, os.getpid()))
    path = tmp_path / "egress-ca.pem"
    path.write_text(pem)
    return str(path)


def test_an_https_mirror_is_served_under_the_proxys_ca_and_cached(proxy_of, outside, tmp_path):
    proxy = proxy_of(f'[egress.mirrors]\n"https://astral.example.test/uv/" = "{outside.url("/uv/")}"\n')
    cafile = attached_ca(proxy, tmp_path)
    assert "BEGIN CERTIFICATE" in Path(cafile).read_text()
    for _ in range(2):
        assert https_get(proxy, "astral.example.test", "/uv/install.sh", cafile=cafile) == (
            200, FILES["/uv/install.sh"])
    assert outside.gets["/uv/install.sh"] == 1  # the second from the cache
    # A path no mirror maps, on a host that is not on the allow list: refused inside the TLS session.
    status, body = https_get(proxy, "astral.example.test", "/other", cafile=cafile)
    assert status == 403 and body.decode().startswith("rl360 egress: https://astral.example.test/other is under no "
                                                      "https:// prefix of [egress.mirrors]"), body
    # The CA's key stays on the node, readable by root only; its certificate is what sandboxes get.
    ca = proxy.folder / "ca"
    assert (ca / "ca.key").stat().st_mode & 0o777 == 0o600 and (ca / "ca.crt").read_text() == Path(cafile).read_text()
    seen = report(proxy)
    assert seen.bytes == {"astral.example.test": 2 * len(FILES["/uv/install.sh"])} and seen.cache_hits == 1
    assert seen.denied == {"astral.example.test": 1}
    assert proxy.stats()["tls_terminated"] == 3


def test_a_client_that_does_not_trust_the_ca_is_a_failure_it_is_told(proxy_of, outside, tmp_path):
    proxy = proxy_of(f'[egress.mirrors]\n"https://astral.example.test/uv/" = "{outside.url("/uv/")}"\n')
    attached_ca(proxy, tmp_path)
    with pytest.raises(ssl.SSLCertVerificationError):
        https_get(proxy, "astral.example.test", "/uv/install.sh", cafile=another_ca_file(tmp_path / "other-ca"))
    seen = report(proxy)
    assert seen.failed == {"astral.example.test": 1} and "does not trust the rl360 egress CA" in seen.failure
    assert outside.gets["/uv/install.sh"] == 0


def another_ca_file(folder: Path) -> str:
    """A CA file that does not hold the proxy's CA: this test's own, fresh one, in `folder`."""
    from rl360cli.egress.ca import EgressCA

    return str(EgressCA.load_or_make(folder).folder / "ca.crt")


def test_an_allowed_https_host_beside_an_https_mirror_stays_a_blind_tunnel(proxy_of, tmp_path):
    """The origin's key is the origin's: the client verifies the origin's own certificate (from a CA it trusts
    explicitly, which the proxy never had), so the proxy can only have passed the bytes on."""
    from rl360cli.egress.ca import EgressCA
    from rl360cli.egress.standin import InternetStandIn

    origin_ca = EgressCA.load_or_make(tmp_path / "origin-ca")
    with InternetStandIn(FILES, tls=origin_ca.server_context("files.example.test")) as origin:
        proxy = proxy_of('allow = ["files.example.test"]\n[egress.hosts]\n"files.example.test" = "127.0.0.1"\n'
                         f'[egress.mirrors]\n"https://astral.example.test/uv/" = "{origin.url("/uv/")}"\n')
        attached_ca(proxy, tmp_path)
        assert https_get(proxy, "files.example.test", "/uv/install.sh", cafile=str(tmp_path / "origin-ca/ca.crt"),
                         port=origin.port) == (200, FILES["/uv/install.sh"])
        # Off every list: the CONNECT itself is refused.
        with pytest.raises(OSError, match="403 Forbidden: rl360 egress: evil.example.test is not on"):
            https_get(proxy, "evil.example.test", "/", cafile=str(tmp_path / "origin-ca/ca.crt"))
        stats = proxy.stats()
        assert stats["tunnels"] == 1 and stats.get("tls_terminated", 0) == 0 and stats["cache_entries"] == 0
        seen = report(proxy)
        assert seen.bytes["files.example.test"] > len(FILES["/uv/install.sh"]) and seen.denied == {
            "evil.example.test": 1}


def test_a_cached_answer_that_varies_serves_only_requests_like_its_own(proxy_of):
    """PyPI's index answers JSON or HTML by Accept: pip's HTML must not be served to uv asking for JSON."""
    from rl360cli.egress.standin import InternetStandIn

    with InternetStandIn(FILES, vary="Accept") as index:
        proxy = proxy_of('allow = ["files.example.test"]\n' + pinned(index))
        attached(proxy)
        port = proxy.route.port
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": f"http://127.0.0.1:{port}"}))

        def get_as(accept: str) -> bytes:
            request = urllib.request.Request(index.url("/simple/index.html", "files.example.test"),
                                             headers={"Accept": accept})
            with opener.open(request, timeout=20) as answer:
                return answer.read()

        html, json_ = b"<html>index</html>\ntext/html", b"<html>index</html>\napplication/json"
        assert [get_as("text/html"), get_as("application/json"), get_as("text/html")] == [html, json_, html]
        # The second (another Accept) went upstream; the third was the first's, from the cache.
        assert index.gets["/simple/index.html"] == 2 and report(proxy).cache_hits == 1
