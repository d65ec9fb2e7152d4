#!/bin/bash
# The oracle: one tools/call to the sidecar, its text into /app/secret.txt.
python3 - <<'PY'
import json
import urllib.request

request = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "get_secret", "arguments": {}}}
post = urllib.request.Request("http://mcp-server:8000/mcp", data=json.dumps(request).encode(),
                              headers={"Content-Type": "application/json", "Accept": "application/json"})
reply = json.load(urllib.request.urlopen(post, timeout=10))
open("/app/secret.txt", "w").write(reply["result"]["content"][0]["text"])
PY
