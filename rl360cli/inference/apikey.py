"""A run's API key: made once by `rl360 serve`, kept in `<run>/api-key` (mode 0600), never printed.

Every engine and the router of the run require it (`Authorization: Bearer KEY`,
as SGLang's `--api-key`); the driver, the weight broadcast and the session
actors read it from the file. Launch commands never hold the key itself: they
name the file (`--api-key-file`), or hold `KEY_PLACEHOLDER`, which
`python -m rl360cli.inference.keyed_launch` replaces on the node just before
it starts the real program (see keyed_launch.py). Plans and logs therefore show
`--api-key <api-key file>`.

    path = create_api_key(run_dir)       # idempotent: an existing key is kept
    key = read_api_key(path)

Tested by tests/inference/test_api_key.py.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

from rl360cli.errors import Rl360Error

API_KEY_FILE = "api-key"
# What launch commands, plans and logs show where the key goes.
KEY_PLACEHOLDER = "<api-key file>"


def api_key_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / API_KEY_FILE


def create_api_key(run_dir: str | Path) -> Path:
    """The run's key file, made (32 random bytes, URL-safe) if it does not exist yet; only the user can read it."""
    path = api_key_path(run_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        # O_EXCL: two `serve` calls racing never end with two different keys.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        read_api_key(path)  # refuses a file others can read
        return path
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_urlsafe(32) + "\n")
    return path


def read_api_key(path: str | Path) -> str:
    """The key in `path`; refuses a missing or empty file and one that others than the user can read."""
    path = Path(path)
    try:
        mode = path.stat().st_mode
        key = path.read_text().strip()
    except FileNotFoundError:
        raise Rl360Error(f"the run's API key file {path} is missing",
                         "start the run's engines with `rl360 serve` (it creates the key)") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise Rl360Error(f"the API key file {path} is readable by others (mode {stat.filemode(mode)})",
                         f"run: chmod 600 {path}")
    if not key:
        raise Rl360Error(f"the API key file {path} is empty", "remove it and run `rl360 serve` again")
    return key


def optional_api_key(run_dir: str | Path) -> str | None:
    """The run's key, or None for a run served before keys existed (its engines take none)."""
    path = api_key_path(run_dir)
    return read_api_key(path) if path.exists() else None
