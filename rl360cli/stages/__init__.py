"""The stages, one module each; `up_stages()` gives those of `rl360 up`, in the order it runs them.

`up_stages` imports its stages when called, not when this package is imported: `rl360 status`
(which imports `stages.status`) would otherwise pay ~50 ms for the image and sandbox modules.
"""

from __future__ import annotations

from types import ModuleType


def up_stages() -> list[ModuleType]:
    """The stages of `rl360 up`, in dependency order: tiers, node caches (Docker images or Daytona
    snapshots), engines and router, trainer."""
    from rl360cli.stages import prewarm_images, prewarm_snapshots, provision, serve, train

    return [provision, prewarm_images, prewarm_snapshots, serve, train]
