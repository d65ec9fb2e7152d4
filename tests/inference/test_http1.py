"""The engine client's HTTP/1.1 transport against real servers on loopback: an aiohttp application
(as the engines and the stand-ins serve) and raw sockets for the wire-level cases aiohttp would
never send (chunked and close-delimited bodies, interim answers, a connection closed while idle,
garbage)."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web

from rl360cli.inference.http1 import BadAnswer, ConnectFailed, ConnectionCut, Http1Client

from .conftest import free_port


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=30))


async def aiohttp_server(routes: list[web.RouteDef]) -> tuple[web.AppRunner, int, list]:
    """An aiohttp server on 127.0.0.1; the third value lists the peer (host, port) of each request."""
    peers: list = []

    @web.middleware
    async def note_peer(request, handler):
        peers.append(request.transport.get_extra_info("peername"))
        return await handler(request)

    app = web.Application(middlewares=[note_peer])
    app.add_routes(routes)
    runner = web.AppRunner(app, shutdown_timeout=0.1, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1], peers


async def raw_server(reply: bytes, *, then_close: bool = True) -> tuple[asyncio.Server, int]:
    """A server that reads one request head and body, writes `reply` as it is, and closes (or not)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        await reader.readexactly(length)
        writer.write(reply)
        await writer.drain()
        if then_close:
            writer.close()
        else:
            await asyncio.sleep(5)

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


def test_a_json_post_and_a_get_with_headers_prefix_and_one_kept_alive_connection():
    async def echo(request: web.Request) -> web.Response:
        return web.json_response({"path": request.path, "auth": request.headers.get("Authorization"),
                                  "body": await request.json() if request.can_read_body else None})

    async def go():
        runner, port, peers = await aiohttp_server([web.post("/v1/generate", echo), web.get("/v1/health", echo)])
        client = Http1Client(f"http://127.0.0.1:{port}/v1/", headers={"Authorization": "Bearer k"})
        try:
            posted = await client.request("POST", "/generate", json.dumps({"input_ids": [1, 2]}).encode())
            got = await client.request("GET", "/health")
            return posted, got, peers
        finally:
            await client.close()
            await runner.cleanup()

    posted, got, peers = run(go())
    assert posted.status == 200 and posted.content_type == "application/json"
    assert json.loads(posted.body) == {"path": "/v1/generate", "auth": "Bearer k", "body": {"input_ids": [1, 2]}}
    assert json.loads(got.body) == {"path": "/v1/health", "auth": "Bearer k", "body": None}
    assert len(peers) == 2 and peers[0] == peers[1]  # the second request went over the first's connection


def test_concurrent_requests_open_connections_up_to_the_cap_and_reuse_them():
    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(0.05)
        return web.Response(text="ok")

    async def go():
        runner, port, peers = await aiohttp_server([web.get("/slow", slow)])
        client = Http1Client(f"http://127.0.0.1:{port}", max_connections=3)
        try:
            answers = await asyncio.gather(*(client.request("GET", "/slow") for _ in range(12)))
            return answers, peers
        finally:
            await client.close()
            await runner.cleanup()

    answers, peers = run(go())
    assert [a.body for a in answers] == [b"ok"] * 12 and answers[0].content_type == "text/plain"
    assert len(set(peers)) == 3  # three connections, each used four times


@pytest.mark.parametrize("wire, body", [
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: application/json\r\n\r\n"
     b"4;ext=1\r\n{\"a\"\r\n3\r\n: 1\r\n1\r\n}\r\n0\r\nX-Trailer: t\r\n\r\n", b'{"a": 1}'),
    (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n{\"until\": \"eof\"}",
     b'{"until": "eof"}'),
    (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi", b"hi"),
    (b"HTTP/1.0 204 No Content\r\n\r\n", b""),
])
def test_bodies_delimited_every_way_http_1_1_allows(wire, body):
    async def go():
        server, port = await raw_server(wire)
        client = Http1Client(f"http://127.0.0.1:{port}")
        try:
            return await client.request("POST", "/generate", b"{}")
        finally:
            await client.close()
            server.close()

    answer = run(go())
    assert answer.body == body


@pytest.mark.parametrize("wire, error", [
    (b"", ConnectionCut),  # closed before a byte of the answer
    (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n{\"a\":", ConnectionCut),  # closed mid-body
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10\r\n{\"a\"", ConnectionCut),  # mid-chunk
    (b"SSH-2.0-OpenSSH_9.6\r\n\r\n", BadAnswer),
    (b"HTTP/1.1 200 OK\r\nContent-Length: many\r\n\r\n", BadAnswer),
    (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", BadAnswer),
])
def test_a_cut_or_garbled_answer_is_told_apart(wire, error):
    async def go():
        server, port = await raw_server(wire)
        client = Http1Client(f"http://127.0.0.1:{port}")
        try:
            await client.request("POST", "/generate", b"{}")
        finally:
            await client.close()
            server.close()

    with pytest.raises(error):
        run(go())


def test_nothing_listening_is_connect_failed():
    async def go():
        client = Http1Client(f"http://127.0.0.1:{free_port()}")
        await client.request("GET", "/health")

    with pytest.raises(ConnectFailed):
        run(go())


def test_a_connection_the_server_closed_while_idle_is_not_reused():
    """Servers end idle keep-alive connections (uvicorn after 5 s): the next request opens a new one."""

    async def go():
        server, port = await raw_server(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", then_close=False)
        client = Http1Client(f"http://127.0.0.1:{port}")
        try:
            first = await client.request("GET", "/a")
            (idle,) = client._idle
            idle.reader.feed_eof()  # as the server's FIN does once the loop has read it
            second = await client.request("GET", "/b")
            return first, second, idle
        finally:
            await client.close()
            server.close()

    first, second, idle = run(go())
    assert first.body == second.body == b"ok" and idle.writer.is_closing()


def test_a_request_cut_by_its_deadline_closes_its_connection():
    async def stall(request: web.Request) -> web.Response:
        await asyncio.sleep(10)
        return web.Response(text="late")

    async def go():
        runner, port, _ = await aiohttp_server([web.get("/stall", stall)])
        client = Http1Client(f"http://127.0.0.1:{port}")
        try:
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.2):
                    await client.request("GET", "/stall")
            return list(client._idle)
        finally:
            await client.close()
            await runner.cleanup()

    assert run(go()) == []  # never handed to the next request half-read


def test_only_plain_http_urls_are_taken():
    with pytest.raises(ValueError, match="plain http"):
        Http1Client("https://127.0.0.1:1")
