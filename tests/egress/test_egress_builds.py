"""Image builds under the profile's [egress], on the real dockerd dev nodes with the real proxy process: a
Dockerfile's RUN step reaches a host of the allow list through the proxy (the internet is InternetStandIn on
127.0.0.1, pinned by [egress.hosts]), one off the list is refused with the proxy's line in the build's, the
node's 127.0.0.1 is out of reach, and under `none` a RUN that needs the network fails in one line naming
the fix. Busybox images, loopback only."""

from __future__ import annotations

import pytest

from rl360cli.egress.client import EgressRoute
from rl360cli.sandbox.config import WarmPoolConfig
from rl360cli.sandbox.task_loader import load_task
from rl360cli.sandbox.taxonomy import Event, SandboxError
from tests.egress.conftest import FILES
from tests.sandbox.conftest import BUSYBOX, run, write_task
from tests.sandbox.test_security import Listener

pytestmark = pytest.mark.timeout(180)

PINNED = '[egress.hosts]\n"files.example.test" = "127.0.0.1"\n"evil.example.test" = "127.0.0.1"\n'


def build_task(tmp_path, name: str, run_line: str):
    dockerfile = f"FROM {BUSYBOX}\nRUN {run_line}\n"
    return load_task(write_task(tmp_path, name, dockerfile=dockerfile, test_sh="echo 1 > /logs/verifier/reward.txt\n"))


def ensure(provider, task) -> str:
    """Build `task`'s image on n1 (as a start does); the image ref."""
    async def go():
        ref, warm = await provider.ensure_image("n1", task)
        assert not warm
        return ref

    return run(go())


def test_a_builds_run_step_reaches_an_allowed_host_through_the_proxy(docker_provider, proxy_of, outside, tmp_path):
    proxy = proxy_of('allow = ["files.example.test"]\n' + PINNED)
    provider = docker_provider(egress=proxy.route, warm_pool=WarmPoolConfig(size=0))
    url = outside.url("/uv/install.sh", "files.example.test")
    # busybox wget reads http_proxy: the build arg Docker hands every RUN step.
    task = build_task(tmp_path, "fetch", f"wget -qO /installed.sh {url} && grep -q 'uv installed' /installed.sh")
    ref = ensure(provider, task)
    assert outside.gets["/uv/install.sh"] == 1
    report = provider.node_images.build_net.reports[("n1", ref)]
    assert report.bytes == {"files.example.test": len(FILES["/uv/install.sh"])} and not report.denied
    # The proxy settings are build args Docker keeps out of the image: its history and its environment.
    api = provider.api("n1")
    history = " ".join(str(layer.get("CreatedBy")) for layer in api.history(ref))
    assert "3128" not in history and str(proxy.route.port) not in history
    assert not any("proxy" in e.lower() for e in api.inspect_image(ref)["Config"].get("Env") or [])
    # Nothing of the build is left: its holder went with it.
    assert not api.containers(all=True, filters={"label": f"rl360.build-net={ref}"})


def test_a_host_off_the_list_is_refused_with_the_proxys_line(docker_provider, proxy_of, outside, tmp_path):
    proxy = proxy_of('allow = ["files.example.test"]\n' + PINNED)
    provider = docker_provider(egress=proxy.route, warm_pool=WarmPoolConfig(size=0))
    url = outside.url("/uv/install.sh", "evil.example.test")
    with pytest.raises(SandboxError) as caught:
        ensure(provider, build_task(tmp_path, "evil", f"wget -qO /installed.sh {url}"))
    assert caught.value.event == Event.IMAGE_BUILD_FAILED
    line = str(caught.value)
    assert "\n" not in line and "returned a non-zero code" in line, line
    # The RUN step's own last line, which Docker's error line does not carry, then the proxy's.
    assert "(its last line: wget: server returned error: HTTP/1.1 403 Forbidden: rl360 egress:" in line, line
    assert "(through the egress proxy: rl360 egress: evil.example.test is not on the profile's [egress] allow list" \
        in line, line
    assert not outside.gets


def test_the_nodes_loopback_is_out_of_reach_of_a_build(docker_provider, proxy_of, tmp_path):
    proxy = proxy_of('allow = ["files.example.test"]\n' + PINNED)
    provider = docker_provider(egress=proxy.route, warm_pool=WarmPoolConfig(size=0))
    listener = Listener()  # on the node's 127.0.0.1, where the router, the engines and the registry listen
    try:
        # The holder's 127.0.0.1 is its own: the node's listener is not there, only the proxy is.
        task = build_task(tmp_path, "loop", f"! nc -w 3 127.0.0.1 {listener.port} </dev/null")
        ensure(provider, task)
        assert listener.accepted == 0
    finally:
        listener.close()

def test_under_none_a_run_step_that_needs_the_network_fails_in_one_line_with_the_fix(docker_provider, outside,
                                                                                     tmp_path):
    provider = docker_provider(egress=EgressRoute(mode="none"), warm_pool=WarmPoolConfig(size=0))
    url = outside.url("/uv/install.sh", "127.0.0.1")
    with pytest.raises(SandboxError) as caught:
        ensure(provider, build_task(tmp_path, "offline", f"wget -qO /installed.sh {url}"))
    line = str(caught.value)
    assert caught.value.event == Event.IMAGE_BUILD_FAILED and "\n" not in line
    assert line.endswith('(the build had no network: [egress] mode = "allow" in the profile lets its RUN steps '
                         "reach the allow list through the egress proxy)"), line
    assert not outside.gets


def test_an_add_of_a_url_is_refused_in_one_line_before_the_daemon_fetches_it(docker_provider, proxy_of, outside,
                                                                             tmp_path):
    """The daemon fetches an `ADD <url>` from its own network: neither the build network nor the proxy holds it."""
    proxy = proxy_of('allow = ["files.example.test"]\n' + PINNED)
    provider = docker_provider(egress=proxy.route, warm_pool=WarmPoolConfig(size=0))
    url = outside.url("/uv/install.sh", "files.example.test")
    task = load_task(write_task(tmp_path, "add-url", dockerfile=f"FROM {BUSYBOX}\nADD {url} /installed.sh\n",
                                test_sh="echo 1 > /logs/verifier/reward.txt\n"))
    with pytest.raises(SandboxError) as caught:
        ensure(provider, task)
    line = str(caught.value)
    assert caught.value.event == Event.IMAGE_BUILD_FAILED and "\n" not in line
    assert f"Dockerfile line 2: ADD {url} would be fetched by the Docker daemon of n1 itself" in line, line
    assert line.endswith("put the file in the task's environment/ folder, or fetch it in a RUN step (which goes "
                         "through the proxy)"), line
    assert not outside.gets
