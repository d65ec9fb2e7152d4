"""Folders built once per machine under `$RL360_CACHE_DIR` (default `~/.cache/rl360`).

A dequantised GGUF model and a warmed-up tiny policy are deterministic for their inputs, so a
second run (or a second test) links the cached folder instead of rebuilding it. A folder is built
beside its place and renamed in, with a marker written last: a crash never leaves a half-built
folder that looks complete, and two processes building the same folder at once both succeed.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

DONE = "rl360-built.json"


def cache_root() -> Path:
    return Path(os.environ.get("RL360_CACHE_DIR") or Path.home() / ".cache" / "rl360")


def built_once(folder: Path, build: Callable[[Path], dict]) -> tuple[Path, dict]:
    """(`folder`, what `build` reported), calling `build(staging)` only when `folder` is not built yet."""
    if (folder / DONE).is_file():
        return folder, json.loads((folder / DONE).read_text())
    staging = folder.with_name(f".{folder.name}.staging-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        details = build(staging)
        (staging / DONE).write_text(json.dumps(details, indent=2) + "\n")
        try:
            staging.rename(folder)
        except OSError:
            # Another process built it meanwhile; theirs is as good as ours.
            if not (folder / DONE).is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return folder, json.loads((folder / DONE).read_text())
