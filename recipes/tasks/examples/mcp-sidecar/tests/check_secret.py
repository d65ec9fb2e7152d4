"""Prints 1 when /app/secret.txt is the sidecar's secret, else 0."""
import json
import urllib.request

request = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "get_secret", "arguments": {}}}
post = urllib.request.Request("http://mcp-server:8000/mcp", data=json.dumps(request).encode(),
                              headers={"Content-Type": "application/json", "Accept": "application/json"})
secret = json.load(urllib.request.urlopen(post, timeout=10))["result"]["content"][0]["text"]
try:
    written = open("/app/secret.txt").read()
except OSError:
    written = None
print(1 if written == secret else 0)
