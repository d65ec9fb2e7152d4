"""What a docker sandbox and its sidecars need of the provider that made them, as a Protocol.

`DockerSandbox` (sandbox.py) and `DockerSidecars` (sidecars.py) hold a `SandboxOwner`, not the
`DockerProvider`, so neither imports the provider back (provider.py imports them); `DockerProvider`
satisfies it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

from rl360cli.nodes.config import NodeSpec
from rl360cli.sandbox.docker.container import ContainerSpec
from rl360cli.sandbox.docker.daemons import Daemons
from rl360cli.sandbox.docker.images import NodeImages
from rl360cli.sandbox.taxonomy import Event, SandboxError


class SandboxOwner(Daemons, Protocol):
    """The daemons, plus the nodes' images and the bookkeeping of the sandboxes on them."""

    # node name -> its [[nodes]] entry.
    specs: Mapping[str, NodeSpec]
    # What each node holds: image ids, USERs, ENTRYPOINTs, the build network.
    node_images: NodeImages
    # node name -> its CPUs as its daemon counts them (absent before the first start there).
    node_cpus: Mapping[str, int]

    @property
    def images(self) -> Mapping[tuple[str, str], str]:
        """(node, image ref) -> image id, of the images seen on the nodes."""
        ...

    async def ensure_image(self, node: str, task) -> tuple[str, bool]:
        """(image ref on the node, whether it was there already)."""
        ...

    def failure(self, node: str, error: BaseException, event: Event, what: str) -> SandboxError:
        """`error` of a call to `node`'s daemon as the attempt sees it."""
        ...

    async def ping(self, node: str) -> bool:
        """Whether `node`'s daemon answers."""
        ...

    def clock_offset(self, node: str) -> float:
        """Seconds the node's daemon clock is ahead of this machine's."""
        ...

    def release(self, node: str, spec: ContainerSpec, container_id: str, *, containers: int = 1,
                then: Callable[[], None] | None = None) -> None:
        """An attempt is over: free the reservation of its `containers` (the sandbox and its sidecars) and
        GPUs, remove the container soon, then run `then` (the sidecars' removal)."""
        ...
