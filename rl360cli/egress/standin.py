"""InternetStandIn: a stand-in for the internet, an HTTP server on 127.0.0.1 and nothing more.

The dev machines reach no host but Debian's and PyPI's package registries (FACTS.md), and the egress tests
must never send a packet off this machine. So "pypi.org" or "astral.sh" in a test is this server, which the
test's profile pins with `[egress.hosts]` (or a mirror maps to): it serves the files it was given, at any
Host, counts the GETs per path (how many fetches reached "upstream"), and answers 404 otherwise. Given
`tls` (a server SSLContext, e.g. one of a test's own CA), it speaks HTTPS with that certificate: a host
reached through a blind tunnel, whose key the egress proxy never has. Given `vary` (a request header's
name), its answers say `Vary: <name>` and end with that header's value (an index answering JSON or HTML by
`Accept`, as PyPI's does). Given `headers` (path -> header -> value), those paths' answers carry them (a
Simple API page in JSON says `Content-Type: application/vnd.pypi.simple.v1+json`; a body given gzipped says
`Content-Encoding: gzip`). Given `answer` (path -> (body, headers) or None), a path it holds no file for is
answered by it (a path pattern: uv_standin.py's installer script for any version). It is no model of any
real site.

    with InternetStandIn({"/uv/install.sh": b"echo installed\\n"}) as outside:
        outside.url("/uv/install.sh"), outside.gets["/uv/install.sh"]

Used by tests/egress/ and bench/bench_egress.py.
"""

from __future__ import annotations

import ssl
import threading
from collections import Counter
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class InternetStandIn:
    """A stand-in for the internet on 127.0.0.1 (see the module docstring)."""

    def __init__(self, files: dict[str, bytes], *, cache_control: str = "", tls: ssl.SSLContext | None = None,
                 vary: str = "", headers: dict[str, dict[str, str]] | None = None,
                 answer: Callable[[str], tuple[bytes, dict[str, str]] | None] | None = None, port: int = 0):
        self.files = dict(files)
        extra = dict(headers or {})
        self.gets: Counter = Counter()
        standin = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                standin.gets[self.path] += 1
                body, more = standin.files.get(self.path), extra.get(self.path, {})
                if body is None and answer is not None:
                    body, more = answer(self.path) or (None, {})
                self.send_response(200 if body is not None else 404)
                body = body if body is not None else b"not here\n"
                if vary:
                    body += (self.headers.get(vary) or "").encode()
                self.send_header("Content-Length", str(len(body)))
                if cache_control:
                    self.send_header("Cache-Control", cache_control)
                for name, value in more.items():
                    self.send_header(name, value)
                if vary:
                    self.send_header("Vary", vary)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        if tls is not None:
            # The handshake runs in the handler's thread (the first read), not in the accepting one.
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True,
                                                 do_handshake_on_connect=False)
        self.scheme = "https" if tls is not None else "http"
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, name="internet-standin", daemon=True)

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"{self.scheme}://{host}:{self.port}{path}"

    def __enter__(self) -> InternetStandIn:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
