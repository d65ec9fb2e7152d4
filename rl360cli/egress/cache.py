"""The egress proxy's per-node cache of GET responses: files on the node's disk, an index in memory.

What is cached: a 200 answer to a GET that carried no credentials (no Authorization, Cookie or Range),
unless the answer says `no-store`, `private` or `no-cache`, fresh for its `max-age` (else the profile's
`cache_ttl_s`). An answer that says `Vary` is kept with the request's values of the headers it names, and
served only to a request with the same values (RFC 9111 4.1: PyPI's simple index answers JSON or HTML by
`Accept`); another request is fetched upstream, not cached. Bytes of HTTPS tunnels are never seen, so never cached. The least recently used entries
go first once the cache is past `cache_mb`. `fetch_once` lets one request per URL go upstream at a time:
N sandboxes that ask for the same file together cost one upstream fetch, the others served from what
it brought. The index lives as long as the proxy; the folder is emptied when a proxy starts.

Test: tests/egress/test_proxy.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import re
import shutil
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

_MAX_AGE = re.compile(r"(?:s-maxage|max-age)\s*=\s*(\d+)")
# Request headers that make an answer someone else's (or a part of the file).
PRIVATE_REQUEST = ("authorization", "cookie", "range")


@dataclass(frozen=True, slots=True)
class Entry:
    status: bytes  # the status line, e.g. b"HTTP/1.1 200 OK"
    headers: tuple[tuple[str, str], ...]  # end-to-end headers, without the framing ones
    path: Path
    size: int
    expires: float
    # The request's values of the headers the answer's Vary names (lowercase names): who else it may serve.
    varies: tuple[tuple[str, str], ...] = ()

    def serves(self, request: list[tuple[str, str]]) -> bool:
        """Whether this entry answers a request with these headers (its Vary headers have the same values)."""
        return all(_value(request, name) == value for name, value in self.varies)


def _value(headers: list[tuple[str, str]], name: str) -> str:
    return next((v for k, v in headers if k.lower() == name), "")


def varied(answer: dict[str, str], request: list[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """The request's values of the headers that an answer (lowercase header names) says it varies by."""
    names = [n.strip().lower() for n in answer.get("vary", "").split(",") if n.strip()]
    return tuple((name, _value(request, name)) for name in names)


def freshness(headers: dict[str, str], default_s: float) -> float | None:
    """Seconds an answer with these headers (lowercase names) may be served from the cache; None: never."""
    control = headers.get("cache-control", "").lower()
    if any(word in control for word in ("no-store", "private", "no-cache")) or headers.get("vary", "") == "*":
        return None
    found = _MAX_AGE.search(control)
    return float(found.group(1)) if found else default_s


class GetCache:
    def __init__(self, folder: Path, *, max_bytes: int, ttl_s: float):
        self.folder = folder
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self.entries: OrderedDict[str, Entry] = OrderedDict()
        self.size = 0
        self._inflight: dict[str, asyncio.Future] = {}

    def get(self, url: str) -> Entry | None:
        """The fresh entry for `url` (now the most recently used), or None."""
        entry = self.entries.get(url)
        if entry is None:
            return None
        if entry.expires < time.monotonic() or not entry.path.exists():
            self._drop(url)
            return None
        self.entries.move_to_end(url)
        return entry

    def new_file(self, url: str) -> Path:
        """Where an answer being fetched for `url` is written before `commit` (a name of its own)."""
        digest = hashlib.sha256(url.encode()).hexdigest()[:32]
        return self.folder / f"{digest}.{os.getpid()}.{time.monotonic_ns()}.part"

    def commit(self, url: str, part: Path, *, status: bytes, headers: tuple[tuple[str, str], ...],
               fresh_s: float, varies: tuple[tuple[str, str], ...] = ()) -> None:
        """Keep the fetched answer in `part` for `url`; least recently used entries make room."""
        size = part.stat().st_size
        if size > self.max_bytes:
            part.unlink(missing_ok=True)
            return
        final = part.with_suffix(".body")
        os.replace(part, final)
        self._drop(url)
        self.entries[url] = Entry(status=status, headers=headers, path=final, size=size,
                                  expires=time.monotonic() + fresh_s, varies=varies)
        self.size += size
        while self.size > self.max_bytes and self.entries:
            self._drop(next(iter(self.entries)))

    def _drop(self, url: str) -> None:
        entry = self.entries.pop(url, None)
        if entry is not None:
            self.size -= entry.size
            # An answer being served from it keeps its open file: unlinking only takes the name.
            with contextlib.suppress(OSError):
                entry.path.unlink()

    async def fetch_once(self, url: str, fetch: Callable[[], Awaitable[bool]]) -> bool:
        """Run `fetch` (which serves the asker and may `commit`) unless a fetch of `url` runs already: then
        wait for it and return False, the caller looking in the cache again. True when `fetch` ran."""
        running = self._inflight.get(url)
        if running is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(running)
            return False
        done = asyncio.get_running_loop().create_future()
        self._inflight[url] = done
        try:
            await fetch()
        finally:
            del self._inflight[url]
            done.set_result(None)
        return True
