"""A node's Docker daemon, reached the way the cluster profile says: what its image cache holds, pull, tag, remove.

`connect(node)` opens the node's daemon from `NodeSpec.docker_host`:
`unix:///path.sock` and `tcp://host:port` through the docker SDK directly,
`ssh://user@host:port` through paramiko with the node's `key_path` and
`known_hosts` (rl360cli/nodes/ssh.py; the remote side runs
`docker system dial-stdio`). Slurm nodes without a reachable daemon are
driven by job steps instead (rl360cli/nodes/slurm_step.py).

Everything that goes wrong talking to a node is a `NodeError` carrying a
one-line reason, marked `transient` when a retry may help (connection
refused, a reset, a 5xx) and permanent otherwise (manifest unknown, bad
credentials): the prewarm reports the node failed with that reason.

    runtime = connect(profile.node("n1"))
    warm = {d for image in runtime.images() for d in image.digests}

Heavy import: the docker SDK (and paramiko for ssh://) are imported here, so
the CLI imports this module only inside the commands that reach nodes.
Test: tests/images/test_node_runtime.py (the dev Docker and sshd nodes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from rl360cli.config import NodeSpec
    from rl360cli.images.config import ImageRef

DEFAULT_TIMEOUT_S = 120.0


class NodeError(Exception):
    """Talking to a node's daemon failed; `reason` is one line, `transient` says whether to retry."""

    def __init__(self, reason: str, *, transient: bool = True):
        super().__init__(reason)
        self.reason = reason
        self.transient = transient


@dataclass(frozen=True, kw_only=True, slots=True)
class LocalImage:
    """One image in a node's cache."""

    id: str
    tags: tuple[str, ...]
    # `registry/repository@sha256:...`, one per repository it was pulled from or pushed to.
    digests: tuple[str, ...]
    size: int

    def has_digest(self, name: str, digest: str) -> bool:
        return f"{name}@{digest}" in self.digests


class NodeRuntime(Protocol):
    name: str
    address: str

    def images(self) -> list[LocalImage]:
        """Every image in the node's cache."""

    def pull(self, ref: ImageRef, digest: str) -> LocalImage:
        """Pull `ref.name@digest` (by digest, so a tag that moves meanwhile cannot change what lands)."""

    def tag(self, image_id: str, ref: ImageRef) -> None:
        """Point `ref`'s tag at `image_id` (sandboxes start images by tag)."""

    def last_tag_time(self, image_id: str) -> str | None:
        """When the image was last tagged or pulled on the node (ISO time), if the daemon says."""

    def running_image_ids(self) -> set[str]:
        """Image ids of the node's running containers (never pruned)."""

    def remove(self, reference: str) -> None:
        """Untag / remove one image reference; refuses (NodeError) when a container uses it."""

    def close(self) -> None: ...


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


def connect(node: NodeSpec, *, timeout_s: float = DEFAULT_TIMEOUT_S, slurm_job: str | None = None,
            het_group: int | None = None, slurm_conf: str = "") -> NodeRuntime:
    """The node's daemon; `NodeError` when it does not answer.

    With `slurm_job`, the node's `unix://` socket is on the node itself and is worked through job steps
    of that allocation (rl360cli/nodes/slurm_step.py) instead of directly.
    """
    if slurm_job is not None:
        from rl360cli.nodes.slurm_step import SlurmStep, SlurmStepRuntime

        step = SlurmStep(job_id=slurm_job, het_group=het_group, node=node.name, docker_host=node.docker_host)
        return SlurmStepRuntime(node.name, step, slurm_conf=slurm_conf)
    return DockerRuntime(node.name, node.docker_host, docker_client(node, timeout_s=timeout_s))


def docker_client(node: NodeSpec, *, timeout_s: float = DEFAULT_TIMEOUT_S):
    """A `docker.DockerClient` for the node's daemon (unix://, tcp:// or ssh:// with the node's key)."""
    if node.docker_host.startswith("ssh://"):
        from rl360cli.nodes.ssh import ssh_docker_client

        with _errors(node.docker_host):
            return ssh_docker_client(node.docker_host, key_path=node.key_path, known_hosts=node.known_hosts,
                                     timeout_s=timeout_s)
    import docker

    with _errors(node.docker_host):
        return docker.DockerClient(base_url=node.docker_host, version="auto", timeout=int(timeout_s))


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
