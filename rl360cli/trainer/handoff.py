"""Weights handed over by reference to engines on the same machine: one-GPU colocation.

When the trainer and an engine share a device, copying every weight through a process group is
wasted work: the engine can map the trainer's tensors and copy from them on the device. This is
SGLang's `/update_weights_from_tensor` (what verl and SkyRL use when colocated): each bucket of
`(name, tensor)` pairs is pickled with torch's `ForkingPickler`, which turns a CUDA tensor into a
CUDA IPC handle and a CPU tensor into the name of a shared-memory file (torch's `file_system`
strategy: file descriptors cannot cross between two unrelated processes), and the engine rebuilds
the tensors from the handles and copies them into its own parameters. Only the handles travel over
HTTP; the trainer keeps the tensors alive until the engine answers.

While the trainer steps, `release_engine_memory()` asks the engines to give the device back (their
KV cache, and their weights if the trainer needs that room too: SGLang's
`/release_memory_occupation`); `resume_engine_memory()` undoes it before generation goes on.

The same code path runs on the CPU (tests/trainer/test_handoff.py, against the real local engine
process) and on a GPU (bench/gpu/check.py, where it is timed against a raw device copy of the same
bytes). On a CPU the first hand-over moves each parameter's storage into shared memory (once: the
optimizer updates it in place afterwards).

    sync = TensorHandoff(["http://127.0.0.1:31002"], api_key=key)
    sync.connect()
    stats = sync.broadcast(trainer.named_tensors(), trainer.version)
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator
from multiprocessing.reduction import ForkingPickler
from typing import Any

import torch
import torch.multiprocessing

from rl360cli.trainer.broadcast import SyncStats, WeightSyncError, weight_buckets


class TensorHandoff:
    """A `WeightSync` for engines on the trainer's machine; see the module docstring."""

    def __init__(self, engine_urls: Iterable[str], *, bucket_mb: float = 512, api_key: str | None = None,
                 timeout_s: float = 120.0):
        self.engines = [u.rstrip("/") for u in engine_urls]
        if not self.engines:
            raise ValueError("engine_urls is empty: nothing to hand weights to")
        if bucket_mb <= 0:
            raise ValueError(f"bucket_mb must be positive (got {bucket_mb})")
        self.bucket_bytes = int(bucket_mb * (1 << 20))
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.failed_engines: dict[str, str] = {}

    def connect(self) -> None:
        """Nothing to form (no process group): check that every engine answers."""
        for url in list(self.engines):
            try:
                self._post(url, "/health", None, method="GET")
            except WeightSyncError as e:
                self._drop(url, str(e))
        if not self.engines:
            raise WeightSyncError("no engine answers for the weight hand-over",
                                  f"see the engines' logs; dropped: {self.failed_engines}")

    def broadcast(self, named_tensors: Iterable[tuple[str, Any]], version: int) -> SyncStats:
        """Hand every tensor to every engine, bucket by bucket; the last bucket sets `version`. An engine on
        the trainer's own machine that fails is not a lost node to work around: it raises."""
        began = time.perf_counter()
        buckets = weight_buckets(list(named_tensors), self.bucket_bytes)
        for engine in list(self.engines):
            self._post(engine, "/pause_generation", {"mode": "retract"})
            try:
                for i, bucket in enumerate(buckets):
                    last = i == len(buckets) - 1
                    # Held here until the engine answers: the handles name these tensors' memory.
                    tensors = [(name, t.detach().contiguous()) for name, t in bucket]
                    answer = self._post(engine, "/update_weights_from_tensor", {
                        "serialized_named_tensors": [serialize(tensors)],
                        "flush_cache": last,
                        "weight_version": str(version) if last else None,
                    })
                    if not answer.get("success", False):
                        raise WeightSyncError(f"{engine} refused the weights: {answer.get('message')}",
                                              "check that the engine serves the trainer's architecture")
            finally:
                with contextlib.suppress(WeightSyncError):
                    self._post(engine, "/continue_generation", {})
        total = sum(t.numel() * t.element_size() for bucket in buckets for _, t in bucket)
        return SyncStats(version=version, seconds=time.perf_counter() - began, bytes=total, buckets=len(buckets),
                         num_engines=len(self.engines))

    def release_engine_memory(self, *, weights: bool = False) -> None:
        """Before a training step: the engines drop their KV cache (and move their weights off the device)."""
        tags = ["kv_cache", "weights"] if weights else ["kv_cache"]
        for engine in self.engines:
            self._post(engine, "/release_memory_occupation", {"tags": tags})

    def resume_engine_memory(self, *, weights: bool = False) -> None:
        tags = ["kv_cache", "weights"] if weights else ["kv_cache"]
        for engine in self.engines:
            self._post(engine, "/resume_memory_occupation", {"tags": tags})

    def close(self) -> None:
        """Nothing is held between hand-overs."""

    def _drop(self, url: str, why: str) -> None:
        self.engines.remove(url)
        self.failed_engines[url] = why

    def _post(self, url: str, path: str, body: Any, *, method: str = "POST") -> dict:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(url + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        if self.api_key:
            request.add_header("Authorization", f"Bearer {self.api_key}")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as answer:
                text = answer.read().decode()
        except urllib.error.HTTPError as e:
            detail = e.read().decode(errors="replace")[:300]
            if e.code == 400:  # the engine read the request and said why it refuses it
                with contextlib.suppress(ValueError):
                    return {"success": False, **json.loads(detail)}
            raise WeightSyncError(f"{url}{path}: HTTP {e.code} {detail}", "see the engine's log") from None
        except OSError as e:
            raise WeightSyncError(f"{url}{path}: {e}", "is the engine running on this machine?") from None
        with contextlib.suppress(ValueError):
            parsed = json.loads(text)
            return parsed if isinstance(parsed, dict) else {"answer": parsed}
        return {"answer": text}


def serialize(named: list[tuple[str, torch.Tensor]]) -> str:
    """Base64 of a ForkingPickler dump of `[(name, tensor)]`: handles, not the tensors' bytes. The caller
    keeps the tensors alive until the receiver has rebuilt them."""
    buffer = io.BytesIO()
    with _shared_memory_by_file():
        ForkingPickler(buffer).dump(named)
    return base64.b64encode(buffer.getvalue()).decode()


@contextlib.contextmanager
def _shared_memory_by_file() -> Iterator[None]:
    """CPU tensors shared by file name for the hand-over (another process can open a file by its name, not
    a descriptor it was never sent); the process's own strategy comes back afterwards."""
    before = torch.multiprocessing.get_sharing_strategy()
    torch.multiprocessing.set_sharing_strategy("file_system")
    try:
        yield
    finally:
        torch.multiprocessing.set_sharing_strategy(before)
