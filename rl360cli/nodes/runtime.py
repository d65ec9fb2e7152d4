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

from typing import TYPE_CHECKING

from rl360cli.nodes.base import DEFAULT_TIMEOUT_S, NodeRuntime
from rl360cli.nodes.docker_runtime import DockerRuntime, docker_client
from rl360cli.nodes.slurm_step import SlurmStep, SlurmStepRuntime

if TYPE_CHECKING:
    from rl360cli.nodes.config import NodeSpec


def connect(node: NodeSpec, *, timeout_s: float = DEFAULT_TIMEOUT_S, slurm_job: str | None = None,
            het_group: int | None = None, slurm_conf: str = "") -> NodeRuntime:
    """The node's daemon; `NodeError` when it does not answer.

    With `slurm_job`, the node's `unix://` socket is on the node itself and is worked through job steps
    of that allocation (rl360cli/nodes/slurm_step.py) instead of directly.
    """
    if slurm_job is not None:
        step = SlurmStep(job_id=slurm_job, het_group=het_group, node=node.name, docker_host=node.docker_host)
        return SlurmStepRuntime(node.name, step, slurm_conf=slurm_conf)
    return DockerRuntime(node.name, node.docker_host, docker_client(node, timeout_s=timeout_s))
