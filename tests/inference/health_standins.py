"""A stand-in engine for the health watcher's tests: a real process on a real port, no model.

    python -m tests.inference.health_standins --port P [--version 3]

`StandInEngine` answers `GET /health` (200), `GET /model_info` (`weight_version`), `GET /workers` (none: as a
router with no engine, for the control plane's tests), `POST /generate`
(after `{"sleep_s": s}` seconds, a minimal SGLang answer) and `POST /cut` (closes the connection without an
answer, the server stays up). It does not generate, take weights, or join a process group: the watcher's
tests need only a process that is alive, dead, hung (SIGSTOP) or gone, and a port that answers or not.
"""

from __future__ import annotations

import argparse
import json
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class StandInEngine(BaseHTTPRequestHandler):
    version = "0"

    def log_message(self, *args) -> None:  # quiet
        pass

    def _json(self, body: object) -> None:
        raw = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self) -> None:
        if self.path == "/health":
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif self.path == "/model_info":
            self._json({"weight_version": self.version})
        elif self.path == "/workers":
            self._json({"workers": []})
        else:
            self.send_error(404)

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        if self.path == "/cut":
            self.close_connection = True
            self.connection.close()
            return
        if self.path == "/generate":
            time.sleep(float(body.get("sleep_s") or 0))
            self._json({"text": "", "output_ids": [1], "meta_info": {
                "finish_reason": {"type": "stop"}, "output_token_logprobs": [[-0.5, 1, None]],
                "weight_version": self.version, "prompt_tokens": 1}})
            return
        self.send_error(404)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--version", default="0")
    args = parser.parse_args()
    StandInEngine.version = args.version
    ThreadingHTTPServer.allow_reuse_address = True
    ThreadingHTTPServer(("127.0.0.1", args.port), StandInEngine).serve_forever()


if __name__ == "__main__":
    main()
