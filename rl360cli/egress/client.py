"""The providers' side of the egress proxy: the route a sandbox's network takes, attaching a sandbox to its
node's proxy, and what the proxy counted for it.

    route = EgressRoute(mode="allow", control="/.../egress/control.sock")
    route = route.on_node(node_name())           # on Slurm: the proxy of the node this process runs on
    ca_pem = await route.attach(sandbox_id, pid) # the proxy now listens in that process's namespace
    env = route.proxy_env(no_proxy=("mcp-server",))
    await route.open_door(sandbox_id, upstream)  # an installed agent's way to its own session (door.py)
    report = await route.detach(sandbox_id)      # EgressReport: bytes, denials, failures per host

Test: tests/egress/test_egress_sandboxes.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import os
import socket
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from rl360cli.egress.config import EgressConfig
from rl360cli.state import queries
from rl360cli.state.schema import StateDoc

# A control call the proxy does not answer within this is a proxy that failed.
CONTROL_TIMEOUT_S = 10.0
# What `proxy_env` sets, and what sudo is told to keep (`system_config_command`).
PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy")


class EgressUnavailable(Exception):
    """The node's proxy did not do what was asked (not running, or it could not enter the sandbox)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class EgressReport:
    """What one sandbox (or, merged, one attempt's sandboxes) did through the proxy."""

    bytes: dict[str, int] = field(default_factory=dict)
    denied: dict[str, int] = field(default_factory=dict)
    # Hosts the sandbox was allowed to reach and the proxy could not: the infrastructure's failures.
    failed: dict[str, int] = field(default_factory=dict)
    cache_hits: int = 0
    # One line per denial or failure, in order (the first few): what the attempt's log says.
    lines: tuple[str, ...] = ()
    # The first failure's line ("" without one).
    failure: str = ""

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> EgressReport:
        return cls(bytes=dict(data.get("bytes") or {}), denied=dict(data.get("denied") or {}),
                   failed=dict(data.get("failed") or {}), cache_hits=int(data.get("cache_hits") or 0),
                   lines=tuple(data.get("lines") or ()), failure=str(data.get("failure") or ""))

    def to_json(self) -> dict[str, Any]:
        return {"bytes": self.bytes, "denied": self.denied, "failed": self.failed, "cache_hits": self.cache_hits,
                "lines": list(self.lines), "failure": self.failure}

    @staticmethod
    def merged(reports: Iterable[EgressReport | None]) -> EgressReport | None:
        """The sum of `reports` (None when there is none)."""
        found = [r for r in reports if r is not None]
        if not found:
            return None
        out: dict[str, Counter] = {"bytes": Counter(), "denied": Counter(), "failed": Counter()}
        for report in found:
            for name, counter in out.items():
                counter.update(getattr(report, name))
        return EgressReport(**{k: dict(v) for k, v in out.items()}, cache_hits=sum(r.cache_hits for r in found),
                            lines=tuple(line for r in found for line in r.lines),
                            failure=next((r.failure for r in found if r.failure), ""))


# The proxy's record in the state file (`tier/name`) on one machine, which the `egress` stage writes; on Slurm
# each rollout node's is `rollout/egress-<node>`. Every one has this kind.
EGRESS_COMPONENT = "rollout/egress"
EGRESS_KIND = "egress"
# In the paths of a node's proxy (Slurm): that node's name, filled in on the node by the proxy and by the session
# actors alike. So they meet on any node, also once a requeue has moved both to a node that replaced theirs.
NODE_FIELD = "{node}"
# Longer node names are hashed: a unix socket's path holds at most 107 bytes.
MAX_NODE_TAG = 32


def node_name() -> str:
    """The node this process runs on, as Slurm names it (a job step's, or a Ray worker's started as one), else its
    host name: how a session actor finds its node's proxy."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def on_node_path(template: str, node: str) -> str:
    """`template` with `{node}` replaced by `node` (by its hash when longer than MAX_NODE_TAG characters)."""
    tag = node if len(node) <= MAX_NODE_TAG else hashlib.sha256(node.encode()).hexdigest()[:12]
    return template.replace(NODE_FIELD, tag)


@dataclass(frozen=True, kw_only=True, slots=True)
class EgressRoute:
    """How a provider's sandboxes that may use the network go out: the profile's `[egress] mode`, and in
    `allow` the control socket of the proxy on this node (recorded by the `egress` stage)."""

    mode: Literal["none", "allow", "open"] = "none"
    # On Slurm, before `on_node`, a template with `{node}`: a proxy serves its own node's sandboxes only (it
    # enters their namespaces), so a process takes its own node's.
    control: str = ""
    # Where the proxy listens inside each sandbox ([egress] sandbox_port).
    port: int = 3128
    # The node `on_node` filled in ("" on one machine): named when its proxy does not answer.
    node: str = ""
    # The agents of these sandboxes live inside them (installed agents): each sandbox gets its session's door
    # (door.py), on this port of its 127.0.0.1 ([egress] door_port), whatever else it gets (network.py decides).
    door: bool = False
    door_port: int = 3129
    # [egress] ca_bundle: what an installed agent's install step trusts beside the image's roots (installed.py).
    ca_bundle: str = ""

    @classmethod
    def of(cls, config: EgressConfig, records: Iterable[Mapping[str, Any]]) -> EgressRoute:
        """The route of a profile's `[egress]`, through the proxies the `egress` stage recorded (`records`): the
        machine's (local backend), or the rollout nodes' (Slurm: one control template for them all)."""
        if config.mode != "allow":
            return cls(mode=config.mode, port=config.sandbox_port, door_port=config.door_port,
                       ca_bundle=config.ca_bundle)
        control = next((str(r.get("url") or "") for r in records), "").removeprefix("unix://")
        return cls(mode="allow", control=control, port=config.sandbox_port, door_port=config.door_port,
                   ca_bundle=config.ca_bundle)

    @classmethod
    def recorded(cls, config: EgressConfig, doc: StateDoc) -> EgressRoute:
        """The route of a profile's `[egress]` through the proxies the state file `doc` records: what every
        provider is handed (by `rl360 tasks check`, calibration and a run's session actors alike)."""
        return cls.of(config, queries.components_of_kind(doc, EGRESS_KIND).values())

    def on_node(self, node: str) -> EgressRoute:
        """The route as a process on `node` takes it: that node's proxy. The machine's proxy stays as it is."""
        if self.mode != "allow" or (self.control and NODE_FIELD not in self.control):
            return self
        return dataclasses.replace(self, control=on_node_path(self.control, node), node=node)

    def proxy_env(self, *, no_proxy: Iterable[str] = ()) -> dict[str, str]:
        """The environment that points a sandbox's tools at the proxy (curl reads only the lowercase
        http_proxy; apt, pip, uv and Python read either)."""
        url = f"http://127.0.0.1:{self.port}"
        # The sandbox's own addresses: a server it runs is reached straight, also at 0.0.0.0 (which connects to
        # this host), as a verifier of Terminal-Bench 2.0 queries its agent's server; the proxy would refuse it.
        local = ",".join(["localhost", "127.0.0.1", "::1", "0.0.0.0", *no_proxy])
        return {"HTTP_PROXY": url, "HTTPS_PROXY": url, "http_proxy": url, "https_proxy": url,
                "NO_PROXY": local, "no_proxy": local}

    def system_config_command(self) -> str:
        """A root shell command that points a sandbox's tools at the proxy where the environment does not reach
        them: `sudo` resets the environment (its env_reset drops *_PROXY), so `sudo apt-get` and `sudo pip`
        found no way out (Terminal-Bench 2.0's rstan-to-pystan, mcmc-sampling-stan); sudo keeps them after
        this, and apt reads its own proxy setting. In Harbor a sandbox has a network and no proxy: these make
        the proxy what a network is to a tool run as root. Best effort, silent: an image without /etc/apt or
        sudo is left as it is (the sudoers.d folder is made, as sudo's package would make it)."""
        url = f"http://127.0.0.1:{self.port}"
        keep = " ".join(PROXY_VARIABLES)
        return ("{ mkdir -p /etc/sudoers.d"
                f" && printf 'Defaults env_keep += \"{keep}\"\\n' > /etc/sudoers.d/rl360-egress"
                " && chmod 0440 /etc/sudoers.d/rl360-egress;"
                f" [ -d /etc/apt/apt.conf.d ] && printf 'Acquire::http::Proxy \"{url}\";\\n"
                f"Acquire::https::Proxy \"{url}\";\\n' > /etc/apt/apt.conf.d/99rl360-egress; }} >/dev/null 2>&1")

    def door_env(self, key: str) -> dict[str, str]:
        """The environment that points an agent inside a sandbox at its session's door (OpenAI's and Anthropic's
        clients read these), `key` its session's own."""
        base = f"http://127.0.0.1:{self.door_port}"
        return {"OPENAI_BASE_URL": f"{base}/v1", "OPENAI_API_KEY": key, "ANTHROPIC_BASE_URL": base,
                "ANTHROPIC_API_KEY": key}

    async def open_door(self, sandbox: str, upstream: str) -> None:
        """Have the proxy open `sandbox`'s door (attached for it by its provider) onto `upstream`, its session's
        prefix on its actor's endpoint (`http://127.0.0.1:<port>/s/<token>`)."""
        await self._call({"op": "door", "sandbox": sandbox, "upstream": upstream})

    async def attach(self, sandbox: str, pid: int, task_hosts: tuple[str, ...] | None = None, *,
                     trusts_ca: bool = False, outbound: bool = True) -> str:
        """Have the proxy listen in the network namespace of process `pid` for `sandbox`, which reaches only
        `task_hosts` of the profile's allowed hosts when given (its task's `allowed_hosts`). Returns the rl360
        egress CA's certificate (PEM) that the sandbox must trust, "" when the profile has no https:// mirror
        or dated index (trust.py says where a provider puts it). `trusts_ca`: the caller puts it there (a
        sandbox; not an image build or a sidecar), so the proxy also dates its https:// index pages
        (`[egress] pypi_as_of`); a mirror's host is answered under the CA either way. `outbound` False: the
        sandbox goes nowhere through the proxy, attached for its session's door alone (`open_door`)."""
        request = {"op": "attach", "sandbox": sandbox, "pid": pid, "trusts_ca": trusts_ca, "outbound": outbound}
        if task_hosts is not None:
            request["task_hosts"] = list(task_hosts)
        return str((await self._call(request)).get("ca") or "")

    async def detach(self, sandbox: str) -> EgressReport:
        """Stop serving `sandbox`; what it did."""
        return EgressReport.from_json((await self._call({"op": "detach", "sandbox": sandbox}))["report"])

    async def stats(self) -> dict[str, Any]:
        return await self._call({"op": "stats"})

    async def _call(self, request: dict[str, Any]) -> dict[str, Any]:
        where = f" of node {self.node}" if self.node else ""
        if not self.control:
            raise EgressUnavailable(f'[egress] mode is "allow" but no egress proxy{where} is recorded: '
                                    "start it with `rl360 up` (its `egress` stage)")
        try:
            async with asyncio.timeout(CONTROL_TIMEOUT_S):
                reader, writer = await asyncio.open_unix_connection(self.control)
                try:
                    writer.write(json.dumps(request).encode() + b"\n")
                    await writer.drain()
                    answer = json.loads(await reader.readline() or b"{}")
                finally:
                    writer.close()
        except (OSError, TimeoutError, ValueError) as e:
            raise EgressUnavailable(f"the egress proxy{where} at {self.control} does not answer "
                                    f"({e or type(e).__name__})") from None
        if not answer.get("ok"):
            raise EgressUnavailable(f"the egress proxy: {answer.get('error') or 'no answer'}")
        return answer
