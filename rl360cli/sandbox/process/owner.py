"""What a process sandbox needs of the provider that made it, as a Protocol.

`ProcessSandbox` (process/sandbox.py) holds a `SandboxOwner`, not the `ProcessProvider`, so it does not
import the provider back (provider.py imports it); `ProcessProvider` satisfies it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

from rl360cli.egress.client import EgressRoute
from rl360cli.sandbox.config import SandboxConfig
from rl360cli.sandbox.process.isolation import Isolation


class SandboxOwner(Protocol):
    """The provider's settings, isolation and file threads, and its keeper's program."""

    config: SandboxConfig
    # Where a network task's sandbox goes: the profile's [egress].
    egress: EgressRoute
    isolation: Isolation
    # [sandbox] process_namespace = "sandbox" in effect: one keeper per sandbox (process/keeper.py).
    keeps_namespaces: bool
    # The keeper's seccomp filter (it also refuses SIGCONT), or None where there is none.
    keeper_seccomp: bytes | None

    @property
    def keeper_sh(self) -> Path:
        """The keeper's program (process/keeper.py), made at first use."""
        ...

    def files(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Awaitable[Any]:
        """Run a blocking file operation on the provider's own threads."""
        ...

    def discard(self, folder: Path) -> None:
        """Remove a stopped sandbox's folder (in the background)."""
        ...

    def reservation(self, task) -> tuple[float, int]:
        """(CPUs, memory MB) a sandbox of `task` gets."""
        ...

    def image_ref(self, task) -> str:
        """The image a sandbox of `task` runs ("host" where the task has no Dockerfile)."""
        ...
