"""A node's Docker daemon through the docker SDK: unix://, tcp://, or ssh:// through paramiko.

`docker_client(node)` opens the daemon from `NodeSpec.docker_host`
(`ssh://user@host:port` uses the node's `key_path` and `known_hosts`,
rl360cli/nodes/ssh.py; the remote side runs `docker system dial-stdio`);
`DockerRuntime` is the `NodeRuntime` over it. Heavy import: the docker SDK.

Test: tests/images/test_node_runtime.py (the dev Docker and sshd nodes).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rl360cli.nodes.base import DEFAULT_TIMEOUT_S, LocalImage, NodeError
from rl360cli.nodes.ssh import ssh_docker_client

if TYPE_CHECKING:
    from rl360cli.images.config import ImageRef
    from rl360cli.nodes.config import NodeSpec


class DockerRuntime:
    """`NodeRuntime` over the docker SDK's low-level API client (one per node, shared by threads)."""

    def __init__(self, name: str, address: str, client):
        self.name = name
        self.address = address
        self.client = client
        self.api = client.api

    def images(self) -> list[LocalImage]:
        with _errors(self.address):
            rows = self.api.images(all=False)
        return [_local(row) for row in rows]

    def pull(self, ref: ImageRef, digest: str) -> LocalImage:
        with _errors(self.address):
            for line in self.api.pull(ref.name, tag=digest, stream=True, decode=True):
                if isinstance(line, dict) and line.get("error"):
                    message = line.get("errorDetail", {}).get("message") or line["error"]
                    raise NodeError(f"pull {ref.name}@{digest[:19]}: {message}",
                                    transient="manifest unknown" not in message and "not found" not in message)
            attrs = self.api.inspect_image(f"{ref.name}@{digest}")
        return _local(attrs)

    def tag(self, image_id: str, ref: ImageRef) -> None:
        if not ref.tag:
            return
        with _errors(self.address):
            self.api.tag(image_id, ref.name, ref.tag, force=True)

    def last_tag_time(self, image_id: str) -> str | None:
        with _errors(self.address):
            stamp = (self.api.inspect_image(image_id).get("Metadata") or {}).get("LastTagTime")
        if not stamp or stamp.startswith("0001-"):
            return None
        return stamp

    def running_image_ids(self) -> set[str]:
        with _errors(self.address):
            return {c.get("ImageID") for c in self.api.containers() if c.get("ImageID")}

    def remove(self, reference: str) -> None:
        with _errors(self.address):
            self.api.remove_image(reference, force=False, noprune=False)

    def close(self) -> None:
        self.client.close()


def docker_client(node: NodeSpec, *, timeout_s: float = DEFAULT_TIMEOUT_S):
    """A `docker.DockerClient` for the node's daemon (unix://, tcp:// or ssh:// with the node's key)."""
    if node.docker_host.startswith("ssh://"):

        with _errors(node.docker_host):
            return ssh_docker_client(node.docker_host, key_path=node.key_path, known_hosts=node.known_hosts,
                                     timeout_s=timeout_s)
    import docker

    with _errors(node.docker_host):
        return docker.DockerClient(base_url=node.docker_host, version="auto", timeout=int(timeout_s))


def docker_api(host: str, node: NodeSpec | None = None, *, timeout_s: float = 30):
    """The docker SDK's low-level `APIClient` for the daemon at `host`; an ssh:// daemon is reached with
    its node's key and known hosts, so `node` must be given for one."""
    if node is not None and host.startswith("ssh://"):
        return docker_client(node, timeout_s=timeout_s).api
    import docker

    return docker.APIClient(base_url=host, version="auto", timeout=int(timeout_s))


class _errors:
    """Turn docker SDK, requests and paramiko exceptions into a one-line `NodeError`."""

    def __init__(self, address: str):
        self.address = address

    def __enter__(self):
        return self

    def __exit__(self, kind, error, tb):
        if error is None or isinstance(error, NodeError):
            return False
        import docker.errors
        import requests.exceptions

        if isinstance(error, docker.errors.ImageNotFound):
            raise NodeError(f"{_explanation(error)}", transient=False) from error
        if isinstance(error, docker.errors.APIError):
            code = getattr(error, "status_code", None) or 0
            raise NodeError(f"daemon at {self.address}: {_explanation(error)}",
                            transient=code >= 500 and "manifest unknown" not in str(error)) from error
        if isinstance(error, (requests.exceptions.RequestException, docker.errors.DockerException, OSError,
                              EOFError)):
            raise NodeError(f"cannot reach the Docker daemon at {self.address}: {_root_cause(error)}") from error
        try:
            import paramiko
        except ImportError:  # pragma: no cover - paramiko is in the `nodes` extra with docker
            return False
        if isinstance(error, paramiko.SSHException):
            raise NodeError(f"ssh to {self.address} failed: {error}") from error
        return False


def _explanation(error) -> str:
    text = getattr(error, "explanation", None) or str(error)
    return " ".join(str(text).split())


def _root_cause(error: BaseException) -> str:
    """The innermost reason ('[Errno 2] No such file or directory'), not requests' nested wrappers."""
    seen = error
    while True:
        inner = seen.__cause__ or seen.__context__
        if inner is None or inner is seen:
            break
        seen = inner
    for arg in getattr(seen, "args", ()):
        if isinstance(arg, BaseException):
            seen = arg
    text = " ".join(str(seen).split()) or type(seen).__name__
    return text[:200]


def _local(row: dict) -> LocalImage:
    return LocalImage(
        id=row.get("Id", ""),
        tags=tuple(t for t in (row.get("RepoTags") or ()) if t and t != "<none>:<none>"),
        digests=tuple(d for d in (row.get("RepoDigests") or ()) if d and not d.startswith("<none>")),
        size=int(row.get("Size") or 0),
    )
