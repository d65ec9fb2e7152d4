"""What rl360's servers of SGLang's HTTP API share (the CPU engine, server.py, and the stand-in engines,
sim_engine.py): SGLang's error shape, JSON bodies, and its API-key rule."""

from __future__ import annotations

import json
import secrets
from http import HTTPStatus
from typing import Any

from aiohttp import web

from rl360cli.inference.protocol import ProtocolError


def error(message: str, status: int = 400) -> web.Response:
    """SGLang's ErrorResponse shape."""
    body = {"object": "error", "message": message, "type": HTTPStatus(status).phrase, "param": None, "code": status}
    return web.json_response(body, status=status)


async def json_body(request: web.Request, *, optional: bool = False) -> Any:
    raw = await request.read()
    if not raw:
        if optional:
            return None
        raise ProtocolError("the request has no JSON body")
    try:
        return json.loads(raw)
    except json.JSONDecodeError as e:
        raise ProtocolError(f"the body is not valid JSON ({e})") from None


def api_key_middleware(api_key: str):
    @web.middleware
    async def check(request: web.Request, handler):
        # As SGLang's decide_request_auth (sglang/srt/utils/auth.py): probes stay open, everything else
        # needs the key, compared in constant time.
        if request.method == "OPTIONS" or request.path.startswith(("/health", "/ready", "/metrics")):
            return await handler(request)
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(token.encode(), api_key.encode()):
            return web.json_response({"error": "Unauthorized"}, status=401)
        return await handler(request)

    return check


@web.middleware
async def protocol_errors(request: web.Request, handler):
    """A request SGLang would refuse gets its 400, with the reason."""
    try:
        return await handler(request)
    except ProtocolError as e:
        return error(str(e))
