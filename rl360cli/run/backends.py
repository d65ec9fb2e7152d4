"""`backend_for`: the one place a backend is chosen for a cluster profile.

    backend = backend_for(profile, state)      # LocalBackend or SlurmBackend
    backend.launch(spec, log_path); backend.observe(records); backend.stop(records, grace_s=10)

The stages (through `Context.backend_named`) and the run's control plane use it alike, so a component is
started, watched and started again by the same kind of backend whoever does it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rl360cli.backends.local import LocalBackend
from rl360cli.backends.slurm import SlurmBackend
from rl360cli.errors import Rl360Error

if TYPE_CHECKING:
    from rl360cli.backends.base import Backend
    from rl360cli.config import ClusterProfile
    from rl360cli.state.store import StateFile

BACKENDS = ("local", "slurm")


def backend_for(profile: ClusterProfile, state: StateFile, *, name: str | None = None) -> Backend:
    """The backend that manages records marked `backend = name` (default: the profile's own backend)."""
    name = name or profile.backend
    if name == "slurm":
        return SlurmBackend(profile, state)
    if name == "local":
        return LocalBackend(profile)
    raise Rl360Error(f"no backend named {name!r}", f"use one of: {', '.join(BACKENDS)}")
