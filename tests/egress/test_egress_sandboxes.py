"""Sandboxes under the profile's [egress], with both providers (real bubblewrap, real dockerd dev nodes) and the
real proxy process: a host on the allow-list is reached, one off it is refused in one clear line that the
attempt keeps, `none` lets nothing out, nothing on the node's 127.0.0.1 but the proxy is reachable, a mirror
serves the stand-in's file, and N sandboxes fetching one file cost one upstream fetch. Loopback only."""

from __future__ import annotations

import asyncio

import pytest

from rl360cli.egress.client import EgressRoute
from rl360cli.outcome import Outcome
from rl360cli.sandbox.attempt import oracle_agent, run_attempt
from rl360cli.sandbox.task_loader import load_task
from tests.egress.conftest import FILES
from tests.sandbox.conftest import PYTHON, run, write_task
from tests.sandbox.test_security import Listener

pytestmark = pytest.mark.timeout(240)

FETCH = ("python3 -c 'import sys, urllib.request; sys.stdout.buffer.write(urllib.request.urlopen(sys.argv[1], "
         "timeout=20).read())' {url}")
PINNED = '[egress.hosts]\n"files.example.test" = "127.0.0.1"\n"evil.example.test" = "127.0.0.1"\n'


def network_task(tmp_path, name="net", test_sh="mkdir -p /logs/verifier; echo 0 > /logs/verifier/reward.txt\n",
                 solve_sh=None):
    # No network key at all: Harbor's default, the internet.
    return load_task(write_task(tmp_path, name, image=PYTHON, toml="[environment]\ncpus = 1\n", test_sh=test_sh,
                                solve_sh=solve_sh))


def attempt(provider, task, *commands: str):
    seen = []

    async def agent(sandbox):
        for command in commands:
            seen.append(await sandbox.exec(command, timeout_s=60))

    result = run(run_attempt(provider, task, agent, attempt_id="egress", labels={"rl360.run": provider.run_id}))
    assert len(seen) == len(commands), (result.outcome, result.detail)  # else the unpacking hides why
    return result, seen


def test_an_allowed_host_is_reached_and_one_off_the_list_refused_in_one_line(provider_of, proxy_of, outside,
                                                                             tmp_path):
    proxy = proxy_of('allow = ["files.example.test"]\n' + PINNED)
    result, (allowed, refused) = attempt(provider_of(proxy.route), network_task(tmp_path),
                                         FETCH.format(url=outside.url("/uv/install.sh", "files.example.test")),
                                         FETCH.format(url=outside.url("/uv/install.sh", "evil.example.test")))
    assert allowed.exit_code == 0 and allowed.output == FILES["/uv/install.sh"].decode()
    # The tool prints the proxy's line (Python: the status line's reason).
    assert refused.exit_code != 0 and ("HTTP Error 403: Forbidden: rl360 egress: evil.example.test is not on the "
                                       "profile's [egress] allow list") in refused.output, refused.output
    assert outside.gets["/uv/install.sh"] == 1
    # The attempt keeps it: a denial is the model's doing, the reward stands.
    assert result.outcome == Outcome.OK and result.egress is not None
    assert result.egress.denied == {"evil.example.test": 1} and not result.egress.failed
    assert result.egress.bytes == {"files.example.test": len(FILES["/uv/install.sh"])}
    assert result.egress.lines[0].startswith("rl360 egress: evil.example.test is not on")


def test_a_task_with_allowed_hosts_reaches_only_those_of_the_profiles(provider_of, proxy_of, outside, tmp_path):
    """Harbor's `network_mode = "allowlist"`: the profile allows both hosts, the task names one."""
    proxy = proxy_of('allow = ["files.example.test", "evil.example.test"]\n' + PINNED)
    task = load_task(write_task(tmp_path, "listed", image=PYTHON, toml=(
        '[environment]\ncpus = 1\nnetwork_mode = "allowlist"\nallowed_hosts = ["files.example.test"]\n')))
    result, (listed, unlisted) = attempt(provider_of(proxy.route), task,
                                         FETCH.format(url=outside.url("/uv/install.sh", "files.example.test")),
                                         FETCH.format(url=outside.url("/uv/install.sh", "evil.example.test")))
    assert listed.exit_code == 0 and listed.output == FILES["/uv/install.sh"].decode()
    assert unlisted.exit_code != 0 and ("HTTP Error 403: Forbidden: rl360 egress: evil.example.test is not among "
                                        "the task's allowed_hosts") in unlisted.output, unlisted.output
    assert outside.gets["/uv/install.sh"] == 1
    assert result.outcome == Outcome.OK and result.egress.denied == {"evil.example.test": 1}


def test_a_task_with_allowed_hosts_gets_no_network_where_nothing_holds_it_to_them(provider_of, tmp_path):
    """Under `open` there is no proxy to enforce a task's host list: such a task is told it has no network."""
    task = load_task(write_task(tmp_path, "listed", image=PYTHON, toml=(
        '[environment]\ncpus = 1\nnetwork_mode = "allowlist"\nallowed_hosts = ["files.example.test"]\n')))
    result, _ = attempt(provider_of(EgressRoute(mode="open")), task, "true")
    assert result.outcome == Outcome.OK and result.egress.lines == (
        "rl360 egress: the task wants the internet and its sandbox has none (the cluster profile's [egress] mode, "
        "or [sandbox] network)",)


def test_none_lets_nothing_out(provider_of, proxy_of, outside, tmp_path):
    proxy = proxy_of('allow = ["files.example.test"]\n' + PINNED)  # running, but not this provider's way out
    url = outside.url("/uv/install.sh", "127.0.0.1")
    result, (direct, through) = attempt(provider_of(EgressRoute(mode="none")), network_task(tmp_path),
                                        FETCH.format(url=url),
                                        f"http_proxy=http://127.0.0.1:{proxy.route.port} " + FETCH.format(url=url))
    assert direct.exit_code != 0 and through.exit_code != 0
    assert outside.gets["/uv/install.sh"] == 0 and proxy.stats()["attached"] == 0
    assert result.outcome == Outcome.OK and result.egress.lines == (
        "rl360 egress: the task wants the internet and its sandbox has none (the cluster profile's [egress] mode, "
        "or [sandbox] network)",)


PROBE = """python3 - {port} {proxy_port} <<'PY'
import socket, sys
for port in sys.argv[1:]:
    try:
        socket.create_connection(("127.0.0.1", int(port)), timeout=3).close(); print(port, "CONNECTED")
    except OSError as e:
        print(port, "refused:", e)
PY
cut -d: -f1 /proc/net/dev | tail -n +3 | tr -d ' '; awk '$2 == "00000000"' /proc/net/route | wc -l"""


def test_nothing_on_the_nodes_loopback_but_the_proxy_is_reachable(provider_of, proxy_of, outside, tmp_path):
    proxy = proxy_of('allow = ["files.example.test"]\n' + PINNED)
    listener = Listener()
    try:
        result, (probe, through) = attempt(provider_of(proxy.route), network_task(tmp_path),
                                           PROBE.format(port=listener.port, proxy_port=proxy.route.port),
                                           "NO_PROXY= no_proxy= " +  # through the proxy, not straight
                                           FETCH.format(url=outside.url("/uv/install.sh", "127.0.0.1")))
    finally:
        listener.close()
    lines = probe.output.split("\n")
    assert lines[0].startswith(f"{listener.port} refused:") and lines[1] == f"{proxy.route.port} CONNECTED", lines
    assert lines[2:] == ["lo", "0", ""], lines  # only its own loopback, no route anywhere
    assert listener.accepted == 0
    # Nor through the proxy: 127.0.0.1 is not on the list.
    assert through.exit_code != 0 and "HTTP Error 403" in through.output and outside.gets["/uv/install.sh"] == 0
    assert result.egress.denied == {"127.0.0.1": 1}


def test_a_server_of_the_sandbox_is_reached_on_its_every_address_not_through_the_proxy(provider_of, proxy_of,
                                                                                       tmp_path):
    """A task's verifier that queries the server its agent started at http://0.0.0.0:PORT (Terminal-Bench 2.0's
    hf-model-inference does) reaches it straight: the address is the sandbox itself, as localhost is, and the
    proxy would refuse it."""
    proxy = proxy_of("")
    serve_and_fetch = ("cd /tmp && (python3 -m http.server 8765 --bind 0.0.0.0 >/dev/null 2>&1 &) && sleep 1 && "
                       "echo served > /tmp/probe.txt && " + FETCH.format(url="http://0.0.0.0:8765/probe.txt"))
    result, (fetched,) = attempt(provider_of(proxy.route), network_task(tmp_path), serve_and_fetch)
    assert fetched.exit_code == 0 and fetched.output.strip() == "served", fetched.output
    assert result.egress.denied == {}, result.egress


def test_a_mirror_serves_the_stand_ins_file_and_the_verifier_scores(provider_of, proxy_of, outside, tmp_path):
    """harbor-cookbook's simple-task, in small: the verifier fetches an installer from the internet."""
    proxy = proxy_of(f'[egress.mirrors]\n"http://astral.example.test/uv/" = "{outside.url("/uv/")}"\n')
    fetch = FETCH.format(url="http://astral.example.test/uv/install.sh")
    task = network_task(tmp_path, test_sh=f"{fetch} | sh | grep -q 'uv installed' && test -f /app/done && "
                                          "echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n",
                        solve_sh="touch /app/done\n")
    result = run(run_attempt(provider_of(proxy.route), task, oracle_agent(task), attempt_id="mirror", labels={}))
    assert result.outcome == Outcome.OK and result.reward == 1.0, (result.detail, result.egress)
    assert outside.gets["/uv/install.sh"] == 1
    assert result.egress.bytes == {"astral.example.test": len(FILES["/uv/install.sh"])}


def test_n_sandboxes_fetching_one_file_cost_one_upstream_fetch(provider_of, proxy_of, outside, tmp_path):
    proxy = proxy_of('allow = ["files.example.test"]\n' + PINNED)
    provider = provider_of(proxy.route)
    task = network_task(tmp_path)
    fetch = FETCH.format(url=outside.url("/pkg/big.bin", "files.example.test")) + " | wc -c"

    async def one(i: int):
        async def agent(sandbox):
            seen = await sandbox.exec(fetch, timeout_s=60)
            assert seen.output.split() == [str(len(FILES["/pkg/big.bin"]))], seen.output

        return await run_attempt(provider, task, agent, attempt_id=f"n{i}", labels={"rl360.run": provider.run_id})

    async def all_of():
        try:
            return await asyncio.gather(*(one(i) for i in range(6)))
        finally:
            await provider.close()

    results = run(all_of())
    assert all(r.outcome == Outcome.OK for r in results), [r.detail for r in results]
    assert outside.gets["/pkg/big.bin"] == 1
    assert sum(r.egress.cache_hits for r in results) == 5 and proxy.stats()["upstream_fetches"] == 1


TUNNEL = """python3 - {proxy_port} {host} {port} <<'PY'
import socket, sys
proxy, host, port = int(sys.argv[1]), sys.argv[2], sys.argv[3]
s = socket.create_connection(("127.0.0.1", proxy), timeout=20)
s.sendall(f"CONNECT {{host}}:{{port}} HTTP/1.1\\r\\nHost: {{host}}:{{port}}\\r\\n\\r\\n".encode())
head = b""
while b"\\r\\n\\r\\n" not in head:
    head += s.recv(1)
print(head.split(b"\\r\\n")[0].decode())
if b" 200 " in head.split(b"\\r\\n")[0]:
    s.sendall(f"GET /uv/install.sh HTTP/1.1\\r\\nHost: {{host}}\\r\\nConnection: close\\r\\n\\r\\n".encode())
    answer = b""
    while chunk := s.recv(65536):
        answer += chunk
    print(answer.split(b"\\r\\n\\r\\n", 1)[1].decode(), end="")
PY"""


def test_https_is_tunnelled_to_an_allowed_host_only(provider_of, proxy_of, outside, tmp_path):
    """CONNECT, as a client sends it for an https:// URL (the stand-in speaks plain HTTP inside the tunnel: the proxy
    never looks into it): to an allowed host, a tunnel whose bytes are counted; to one off the list, a 403."""
    proxy = proxy_of('allow = ["files.example.test"]\n' + PINNED)
    result, (tunnelled, refused) = attempt(
        provider_of(proxy.route), network_task(tmp_path),
        TUNNEL.format(proxy_port=proxy.route.port, host="files.example.test", port=outside.port),
        TUNNEL.format(proxy_port=proxy.route.port, host="evil.example.test", port=outside.port))
    assert tunnelled.output.split("\n", 1) == ["HTTP/1.1 200 Connection established",
                                               FILES["/uv/install.sh"].decode()], tunnelled.output
    assert refused.output.startswith("HTTP/1.1 403 Forbidden: rl360 egress: evil.example.test is not on"), refused.output
    assert outside.gets["/uv/install.sh"] == 1 and result.egress.denied == {"evil.example.test": 1}
    assert result.egress.bytes["files.example.test"] > len(FILES["/uv/install.sh"])  # both ways, headers included
    assert result.egress.cache_hits == 0  # a tunnel's bytes are never cached


# ----------------------------------------------------------------------------- https:// mirrors

FETCH_TLS = """python3 - {url} {cadata} <<'PY'
import ssl, sys, urllib.request
# With a CA given, that CA alone; else what the sandbox trusts (its system bundle, SSL_CERT_FILE).
context = ssl.create_default_context(cadata=sys.argv[2]) if len(sys.argv) > 2 else ssl.create_default_context()
sys.stdout.buffer.write(urllib.request.urlopen(sys.argv[1], timeout=20, context=context).read())
PY"""


def test_an_https_mirror_is_trusted_in_the_sandbox_and_other_https_stays_a_blind_tunnel(request, provider_of,
                                                                                         proxy_of, outside, tmp_path):
    """A client in the sandbox fetches https://astral.example.test/... with its default trust and gets the
    stand-in's bytes (the proxy answered as that host, under the rl360 egress CA the provider installed); an
    allowed https host is reached through a blind tunnel, its own certificate verified (a CA the proxy never
    had); an https host on no list is refused."""
    import shlex

    from rl360cli.egress.ca import EgressCA
    from rl360cli.egress.standin import InternetStandIn

    docker = request.node.callspec.params["provider_of"] == "docker"
    origin_ca = EgressCA.load_or_make(tmp_path / "origin-ca")
    with InternetStandIn(FILES, tls=origin_ca.server_context("files.example.test")) as origin:
        proxy = proxy_of('allow = ["files.example.test"]\n' + PINNED +
                         f'[egress.mirrors]\n"https://astral.example.test/uv/" = "{outside.url("/uv/")}"\n')
        if docker:
            # What Debian's ca-certificates and openssl lay out (here with the origin's root as the system one).
            task = load_task(write_task(tmp_path, "tls", image=None, files={"environment/bundle.pem": origin_ca.pem},
                                        dockerfile=f"FROM {PYTHON}\nCOPY bundle.pem /etc/ssl/certs/ca-certificates.crt\n"
                                                   "RUN mkdir -p /usr/lib/ssl && ln -s /etc/ssl/certs/ca-certificates.crt"
                                                   " /usr/lib/ssl/cert.pem\n"))
        else:
            task = network_task(tmp_path, "tls")
        blind = origin.url("/uv/install.sh", "files.example.test")
        commands = [FETCH_TLS.format(url="https://astral.example.test/uv/install.sh", cadata=""),
                    FETCH_TLS.format(url=blind, cadata=shlex.quote(origin_ca.pem)),
                    FETCH_TLS.format(url="https://evil.example.test/x", cadata="")]
        if docker:  # the system bundle kept its own roots: the default trust verifies the blind tunnel's host too
            commands.append(FETCH_TLS.format(url=blind, cadata=""))
        commands.append("printenv SSL_CERT_FILE")  # for uv, which reads its own roots otherwise
        commands.append("printenv REQUESTS_CA_BUNDLE")  # for requests, which reads certifi's otherwise
        result, seen = attempt(provider_of(proxy.route), task, *commands)
        assert seen.pop().output == seen.pop().output == "/etc/ssl/certs/ca-certificates.crt\n"
        mirrored, tunnelled, refused = seen[:3]
        assert mirrored.exit_code == 0 and mirrored.output == FILES["/uv/install.sh"].decode(), mirrored.output
        assert tunnelled.exit_code == 0 and tunnelled.output == FILES["/uv/install.sh"].decode(), tunnelled.output
        assert refused.exit_code != 0 and "403 Forbidden: rl360 egress: evil.example.test is not on" in refused.output
        if docker:
            assert seen[3].exit_code == 0 and seen[3].output == FILES["/uv/install.sh"].decode(), seen[3].output
        assert outside.gets["/uv/install.sh"] == 1 and origin.gets["/uv/install.sh"] == 1 + docker
        stats = proxy.stats()
        assert stats["tls_terminated"] == 1 and stats["tunnels"] == 1 + docker
        assert result.outcome == Outcome.OK and result.egress.denied == {"evil.example.test": 1}
        assert result.egress.bytes["astral.example.test"] == len(FILES["/uv/install.sh"])
        assert result.egress.bytes["files.example.test"] > len(FILES["/uv/install.sh"]) and not result.egress.failed


def test_tools_run_as_root_without_the_environment_go_through_the_proxy(docker_provider, proxy_of, tmp_path):
    """`sudo apt-get` in a task's solve.sh (Terminal-Bench 2.0's rstan-to-pystan, mcmc-sampling-stan): sudo resets
    the environment, so the proxy variables are gone. A docker sandbox behind the proxy has sudo told to keep them
    and apt its own proxy setting: apt with an empty environment asks the proxy, which refuses a host off the list
    (the refusal is the proof it went there; nothing leaves this machine). The image has no sudo: its sudoers
    drop-in is read back, not run."""
    from rl360cli.sandbox.config import WarmPoolConfig

    proxy = proxy_of("")
    provider = docker_provider(egress=proxy.route, warm_pool=WarmPoolConfig(size=0))
    result, (apt, sudoers) = attempt(
        provider, network_task(tmp_path),
        "env -i /usr/bin/apt-get -o Acquire::Retries=0 update 2>&1 | tail -3",
        "stat -c '%a %U' /etc/sudoers.d/rl360-egress && cat /etc/sudoers.d/rl360-egress")
    assert result.egress is not None and result.egress.denied.get("deb.debian.org", 0) >= 1, (apt.output,
                                                                                           result.egress)
    mode_owner, line = sudoers.output.strip().splitlines()
    assert mode_owner == "440 root"
    assert line == 'Defaults env_keep += "HTTP_PROXY HTTPS_PROXY NO_PROXY http_proxy https_proxy no_proxy"'
