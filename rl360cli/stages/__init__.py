"""The stages, one module each, in the order `rl360 up` runs them.

A stage module that does not exist yet is simply absent from `up` and `plan`.
"""

from __future__ import annotations

import importlib
from types import ModuleType

UP_ORDER = ("provision", "prewarm_images", "serve", "train")


def up_stages() -> list[ModuleType]:
    """The built stages of `rl360 up`, in dependency order."""
    stages = []
    for name in UP_ORDER:
        try:
            stages.append(importlib.import_module(f"rl360cli.stages.{name}"))
        except ModuleNotFoundError as e:
            if e.name != f"rl360cli.stages.{name}":
                raise
    return stages
