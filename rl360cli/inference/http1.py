"""A small HTTP/1.1 client for the rollout's hot path: one request at a time per connection, kept alive.

Every agent turn is a `POST /generate` to the router, and at the reference scale the session actors
make ~1,000 of them a second. aiohttp's client session (cookie jar, tracing hooks, multidicts, its
payload and response classes) took 128 us of the client's CPU per request with 64 at once; this
client takes 79 us, JSON and the answer's checks included, and the session actors' CPU fell by a
fifth (docs/benchmarks.md, "Engine client" and "Scale simulation"). It speaks only what rl360's
servers answer: plain `http://` (the router and the engines listen on their node's network), bodies
delimited by Content-Length, chunked, or the connection's end; no redirects, proxies, cookies or
compression.

What can go wrong is told apart, because the caller's retry policy depends on it
(rl360cli/inference/client.py): `ConnectFailed` — the connection could not be opened, so nothing
was sent; `ConnectionCut` — the connection ended or broke before the whole answer came, so the
request may have run; `BadAnswer` — the server answered something that is not HTTP/1.x. A deadline
is the caller's (`asyncio.timeout` around `request`): a request cut by it, or cancelled, closes its
connection, which is never reused half-read.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from urllib.parse import urlsplit

# Longest status line plus headers read before an answer is refused: rl360's servers send a few hundred bytes.
MAX_HEAD_BYTES = 64 * 1024


class ConnectFailed(OSError):
    """The connection could not be opened: nothing was sent."""


class ConnectionCut(ConnectionError):
    """The connection ended or broke before the whole answer came: the request may have run."""


class BadAnswer(ValueError):
    """What came back is not an HTTP/1.x answer."""


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    # The media type, lower case, without its parameters ("application/json").
    content_type: str
    body: bytes


@dataclass(slots=True)
class _Connection:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    def usable(self) -> bool:
        """Still open on both sides: a server that closed an idle connection has fed it its end."""
        return not (self.reader.at_eof() or self.writer.is_closing())

    def close(self) -> None:
        self.writer.close()


class Http1Client:
    """Requests to one `http://host:port[/prefix]`, over connections kept alive and reused (last
    used first). `max_connections` > 0 caps the connections open at once (0: no cap). Use it inside
    one event loop."""

    def __init__(self, base_url: str, *, headers: dict[str, str] | None = None, max_connections: int = 0):
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"{base_url!r}: rl360's engine client speaks plain http://host:port only")
        self.host = parts.hostname
        self.port = parts.port or 80
        self.prefix = parts.path.rstrip("/")
        host = f"[{self.host}]" if ":" in self.host else self.host
        fixed = {"Host": f"{host}:{self.port}", "User-Agent": "rl360", "Accept": "*/*", **(headers or {})}
        self._fixed = "".join(f"{k}: {v}\r\n" for k, v in fixed.items())
        self._idle: list[_Connection] = []
        self._slots = asyncio.Semaphore(max_connections) if max_connections > 0 else None

    async def request(self, method: str, path: str, body: bytes | None = None, *,
                      content_type: str = "application/json") -> Answer:
        """One exchange. Raises ConnectFailed, ConnectionCut or BadAnswer (see the module docstring)."""
        head = f"{method} {self.prefix}{path} HTTP/1.1\r\n{self._fixed}"
        if body is not None:
            head += f"Content-Type: {content_type}\r\n"
        if body is not None or method in ("POST", "PUT", "PATCH"):
            head += f"Content-Length: {len(body or b'')}\r\n"
        message = (head + "\r\n").encode("latin-1") + (body or b"")
        if self._slots is None:
            return await self._exchange(message, method)
        async with self._slots:
            return await self._exchange(message, method)

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()
        for connection in idle:
            with contextlib.suppress(OSError):
                await connection.writer.wait_closed()

    async def _exchange(self, message: bytes, method: str) -> Answer:
        connection = self._reuse() or await self._open()
        keep = False
        try:
            connection.writer.write(message)
            await connection.writer.drain()
            answer, keep = await _read_answer(connection.reader, method)
            return answer
        except asyncio.IncompleteReadError as e:
            raise ConnectionCut(f"the connection ended {len(e.partial)} byte(s) into a part of the answer") from None
        except OSError as e:  # reset, broken pipe, ...
            raise ConnectionCut(f"{type(e).__name__}: {e}") from None
        finally:
            if keep:
                self._idle.append(connection)
            else:
                connection.close()

    def _reuse(self) -> _Connection | None:
        while self._idle:
            connection = self._idle.pop()
            if connection.usable():
                return connection
            connection.close()
        return None

    async def _open(self) -> _Connection:
        try:
            reader, writer = await asyncio.open_connection(self.host, self.port, limit=MAX_HEAD_BYTES)
        except OSError as e:
            raise ConnectFailed(e.errno, e.strerror or str(e)) from None
        return _Connection(reader, writer)


async def _read_answer(reader: asyncio.StreamReader, method: str) -> tuple[Answer, bool]:
    """The status, headers and body of one answer; and whether the connection may carry another."""
    while True:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError:
            raise BadAnswer(f"the answer's head is longer than {MAX_HEAD_BYTES} bytes") from None
        status_line, *lines = head[:-4].decode("latin-1").split("\r\n")
        version, _, rest = status_line.partition(" ")
        code = rest[:3]
        if not (version.startswith("HTTP/1.") and len(code) == 3 and code.isdigit()):
            raise BadAnswer(f"not an HTTP/1.x status line: {status_line[:80]!r}")
        status = int(code)
        if status >= 200 or status == 101:
            break  # 1xx answers are interim: the real one follows
    headers: dict[str, str] = {}
    for line in lines:
        name, sep, value = line.partition(":")
        if not sep:
            raise BadAnswer(f"a header line without a colon: {line[:80]!r}")
        headers[name.strip().lower()] = value.strip()
    length = headers.get("content-length")
    if method == "HEAD" or status in (204, 304):
        body, delimited = b"", True
    elif "chunked" in headers.get("transfer-encoding", "").lower():
        body, delimited = await _read_chunked(reader), True
    elif length is not None:
        if not length.isdigit():
            raise BadAnswer(f"Content-Length is {length[:40]!r}")
        body, delimited = await reader.readexactly(int(length)), True
    else:
        body, delimited = await reader.read(), False  # until the server closes the connection
    keep = delimited and version == "HTTP/1.1" and headers.get("connection", "").lower() != "close"
    content_type = headers.get("content-type", "application/octet-stream").partition(";")[0].strip().lower()
    return Answer(status=status, content_type=content_type, body=body), keep


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    parts = []
    while True:
        size_line = (await reader.readuntil(b"\r\n")).split(b";", 1)[0].strip()
        try:
            size = int(size_line, 16)
        except ValueError:
            raise BadAnswer(f"a chunk size of {size_line[:40]!r}") from None
        if size == 0:
            while await reader.readuntil(b"\r\n") != b"\r\n":  # trailers, up to the empty line
                pass
            return b"".join(parts)
        parts.append(await reader.readexactly(size))
        if await reader.readexactly(2) != b"\r\n":
            raise BadAnswer("a chunk not followed by CRLF")
