"""The sidecar's healthcheck: its /health answers."""
import os
import urllib.request

urllib.request.urlopen(f"http://127.0.0.1:{os.environ.get('MCP_PORT', '8000')}/health", timeout=2).read()
