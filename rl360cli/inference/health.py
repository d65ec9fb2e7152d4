"""Is an engine or the router alive, and which engines does the router send to: probes and the router's worker API.

    probe(url + "/health", timeout_s=2.0)          # None when it answers 200, else why not (one line)
    served_versions(urls, api_key=key)             # the policy version each engine serves now
    router_forget(router_url, engine_url, api_key=key); router_register(router_url, engine_url, api_key=key)

The run's control plane (rl360cli/run/control.py) watches the run's engines and router with these and starts
again what dies; `rl360 status` asks the engines their version; `rl360 serve --restart` takes an engine out
of the router and back. Tested by tests/inference/test_health.py.
"""

from __future__ import annotations

import concurrent.futures
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from typing import Any

from rl360cli.errors import Rl360Error
from rl360cli.inference.router import router_workers

ROUTER_WORKER_TIMEOUT_S = 60.0


# ----------------------------------------------------------------------------- probes


def probe(url: str, *, timeout_s: float) -> str | None:
    """None if `url` answers 200 within `timeout_s`, else why not (one line)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as reply:
            return None if reply.status == 200 else f"answered {reply.status}"
    except urllib.error.HTTPError as e:
        return f"answered {e.code}"
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        return f"no answer in {timeout_s:g}s" if isinstance(reason, TimeoutError) else f"unreachable ({reason})"


def served_version(url: str, *, api_key: str | None, timeout_s: float = 2.0) -> int | None:
    """The policy version the engine at `url` serves now (its `/model_info`), None if it does not tell."""
    request = urllib.request.Request(url.rstrip("/") + "/model_info")
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as reply:
            return int(json.load(reply)["weight_version"])
    except (urllib.error.URLError, OSError, ValueError, KeyError, TypeError):
        return None


def served_versions(urls: Sequence[str], *, api_key: str | None, timeout_s: float = 2.0) -> dict[str, int | None]:
    """`served_version` of every URL, asked all at once (one slow engine costs `timeout_s`, not N times it)."""
    if not urls:
        return {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(32, len(urls))) as pool:
        found = pool.map(lambda u: served_version(u, api_key=api_key, timeout_s=timeout_s), urls)
        return dict(zip(urls, found))



# ----------------------------------------------------------------------------- the router's worker API


def _router_call(router_url: str, method: str, path: str, *, api_key: str | None, body: Any = None,
                 timeout_s: float = 5.0) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(router_url.rstrip("/") + path, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    with urllib.request.urlopen(request, timeout=timeout_s) as reply:
        raw = reply.read()
    return json.loads(raw) if raw.strip() else {}


def router_forget(router_url: str, engine_url: str, *, api_key: str | None) -> bool:
    """Take `engine_url` out of the router (sglang-router 0.3.x deletes workers by id); True if it was there."""
    listed = _router_call(router_url, "GET", "/workers", api_key=api_key).get("workers", [])
    ids = [w["id"] for w in listed if w.get("url", "").rstrip("/") == engine_url.rstrip("/") and w.get("id")]
    for worker_id in ids:
        _router_call(router_url, "DELETE", f"/workers/{urllib.parse.quote(worker_id, safe='')}", api_key=api_key)
    return bool(ids)


def router_register(router_url: str, engine_url: str, *, api_key: str | None,
                    timeout_s: float = ROUTER_WORKER_TIMEOUT_S) -> None:
    """Add `engine_url` to the router (the router sends it the run's key) and wait until it counts it healthy.

    sglang-router adds a worker in the background (202) after probing it; a probe that fails (a loaded
    node, a slow answer) drops the addition silently, so it is asked again every few seconds until then."""
    body: dict[str, Any] = {"url": engine_url}
    if api_key:
        body["api_key"] = api_key
    deadline = time.monotonic() + timeout_s
    asked_at = -1e9
    seen: dict[str, bool] = {}
    num_unanswered = 0
    while True:
        try:
            seen = router_workers(router_url, api_key=api_key)
            num_unanswered = 0
            if seen.get(engine_url):
                return
            if engine_url not in seen and time.monotonic() - asked_at > 5.0:
                _router_call(router_url, "POST", "/workers", api_key=api_key, body=body)
                asked_at = time.monotonic()
        except (urllib.error.URLError, OSError, ValueError) as e:
            num_unanswered += 1
            if num_unanswered >= 3:  # the router is down: its restart takes the live engines in
                raise Rl360Error(f"the router at {router_url} does not answer ({e})", "see the router's log") from None
        if time.monotonic() > deadline:
            raise Rl360Error(f"the router at {router_url} did not take {engine_url} in {timeout_s:g}s "
                             f"(it sees {seen})", "see the router's log")
        time.sleep(0.25)
