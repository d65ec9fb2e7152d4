"""A tiny MCP-like server (streamable HTTP without streaming: one JSON-RPC reply per POST to /mcp).

Tools: `get_secret`, which returns a secret made up when the server starts, so only a client that reached
this very server knows it. `initialize`, `tools/list` and `tools/call` are answered; /health says ok.
"""
import json
import os
import secrets
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SECRET = "s-" + secrets.token_hex(8)
TOOLS = [{"name": "get_secret", "description": "Return the secret.",
          "inputSchema": {"type": "object", "properties": {}}}]


def answer(request):
    method, rid = request.get("method"), request.get("id")
    if method == "initialize":
        result = {"protocolVersion": "2025-03-26", "capabilities": {"tools": {}},
                  "serverInfo": {"name": "rl360-example", "version": "1"}}
    elif method == "tools/list":
        result = {"tools": TOOLS}
    elif method == "tools/call" and (request.get("params") or {}).get("name") == "get_secret":
        result = {"content": [{"type": "text", "text": SECRET}], "isError": False}
    else:
        return {"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": f"no method {method}"}}
    return {"jsonrpc": "2.0", "id": rid, "result": result}


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        self.reply(200, {"ok": True} if self.path == "/health" else {"error": "POST JSON-RPC to /mcp"})

    def do_POST(self):
        if self.path.rstrip("/") != "/mcp":
            return self.reply(404, {"error": "POST JSON-RPC to /mcp"})
        try:
            request = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        except ValueError:
            return self.reply(400, {"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": "parse error"}})
        if "id" not in request:  # a notification (notifications/initialized): accepted, no body
            return self.reply(202, None)
        self.reply(200, answer(request))

    def reply(self, status, body):
        data = b"" if body is None else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    ThreadingHTTPServer(("0.0.0.0", int(os.environ.get("MCP_PORT", "8000"))), Handler).serve_forever()
