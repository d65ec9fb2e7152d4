"""The trainer's side of the weight broadcast: new weights to every engine, in buckets, tagged with a version.

    sync = WeightBroadcaster(["http://127.0.0.1:31001", "http://127.0.0.1:31002"], backend="gloo",
                             master_port=29600, bucket_mb=64)
    sync.connect()                                      # engines join ranks 1..N, the trainer is rank 0
    stats = sync.broadcast(model.named_parameters(), version=step)
    stats.seconds, stats.bytes, stats.buckets, stats.failed   # failed: {url: why} engines dropped
    sync.close()

One sync is SGLang's protocol, as slime and verl drive it: `/pause_generation`
(retract) on every engine; for each bucket, `/update_weights_from_distributed`
(names, dtypes, shapes) posted to every engine at once while rank 0 broadcasts
the bucket's tensors one by one; the last bucket carries `flush_cache` and the
new `weight_version`; then `/continue_generation`. Engines load, flush and go
on under the new version.

Failures never hang the trainer: every HTTP call and every collective has a
timeout. When an engine fails during a sync (its HTTP call cannot reach it,
or it stops answering), the broadcaster aborts the group at once (so the
survivors' pending receives fail fast instead of waiting out their timeout),
drops the failed engine, builds a new group with the survivors under a new
group name (`<name>-g<generation>`: stale store keys never collide) and sends
the whole sync again. The dropped engines are reported in `SyncStats.failed`
and `failed_engines`; the loop marks them failed and goes on. Only when no
engine is left does `broadcast` raise `WeightSyncError`; when every engine left
is one the health watcher is restarting, it sends nothing and returns (each
rejoins with the trainer's weights of then, so no version is lost).

Rejoin: an engine the run's control plane restarted (run/control.py) comes back at the same URL,
holding policy v0 and no group. `rejoin(url, named_tensors, version)` takes it back: it is no longer
counted failed, the current group is torn down and a new one is formed with every live engine (a
gloo or NCCL group has a fixed world size: no rank can be added to a formed group, so the group is
re-formed, under the next generation's name), and the current weights go to all of them once — the
others already hold that version, for them it is one short pause. A sync that meets an engine which
answers "no weight update group named ..." (it restarted between two syncs, before the watcher said
so) does the same by itself: before each sync the engines of the group are asked which groups they
hold (`/server_info`'s `weight_update_groups`, rl360's engine), and one without the current group is
taken in by re-forming it. (Found only by its refusal of a bucket, as an engine that does not say
which groups it holds, the others' receives wait out their timeout first.) `mark_restarting(url)`,
which the watcher calls as soon as it finds an engine dead and which never waits for a sync, keeps
the engine out of the next syncs until its `rejoin`. Calls from several threads (the loop's
broadcasts, the watcher's rejoins) are serialized by one lock.

`update_from_disk` is the fallback: `save_pretrained` into a folder every
engine can read, then `/update_weights_from_disk` on each.

The sync methods run their HTTP calls on a private event loop thread, so they
can be called from plain (synchronous) trainer code. Tested by tests/inference/test_weight_sync.py.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rl360cli.errors import RunFailed
from rl360cli.inference.process_group import StatelessGroup

log = logging.getLogger("rl360.broadcast")
# What an engine (rl360's, as SGLang's) answers a bucket for a group it does not hold (inference/weights.py).
NO_GROUP = "no weight update group named"


class WeightSyncError(RunFailed):
    """No engine could take the new weights."""


@dataclass(frozen=True, kw_only=True, slots=True)
class SyncStats:
    version: int
    seconds: float
    bytes: int
    buckets: int
    num_engines: int
    # Engines dropped during this sync, with the reason; the others hold `version` now.
    failed: dict[str, str] = field(default_factory=dict)
    # How many times the sync started over after dropping failed engines.
    num_restarts: int = 0


class _SyncFailed(Exception):
    def __init__(self, dead: dict[str, str], detail: str, *, retryable: bool = True):
        self.dead = dead
        self.retryable = retryable
        super().__init__(detail)


class WeightBroadcaster:
    """Rank 0 of the weight-update group; see the module docstring."""

    def __init__(self, engine_urls: Iterable[str], *, backend: str = "gloo", master_address: str = "127.0.0.1",
                 master_port: int, bucket_mb: float = 64, group_name: str = "rl360_weights",
                 api_key: str | None = None, timeout_s: float = 120.0, http_timeout_s: float | None = None):
        self.engines = [u.rstrip("/") for u in engine_urls]
        if not self.engines:
            raise ValueError("engine_urls is empty: nothing to broadcast to")
        if backend not in ("gloo", "nccl"):
            raise ValueError(f"backend must be 'gloo' or 'nccl' (got {backend!r})")
        if not 0 < master_port < 65536:
            raise ValueError(f"master_port must be a TCP port the engines can reach (got {master_port})")
        if bucket_mb <= 0:
            raise ValueError(f"bucket_mb must be positive (got {bucket_mb})")
        self.backend = backend
        self.master_address = master_address
        self.master_port = master_port
        self.bucket_bytes = int(bucket_mb * (1 << 20))
        self.group_name = group_name
        self.api_key = api_key
        self.timeout_s = timeout_s
        # An engine stuck in a broken group answers once its own group timeout (the recipe's
        # weight_sync_timeout_s, at most `timeout_s`) passes: wait a little longer than that for it.
        self.http_timeout_s = http_timeout_s or timeout_s + 30
        self.failed_engines: dict[str, str] = {}
        self.generation = 0
        self._group: Any = None
        self._group_engines: list[str] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="rl360-broadcast", daemon=True)
        self._thread.start()
        self._session: Any = None
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="rl360-dist")
        # One sync at a time: the loop broadcasts, the health watcher's rejoins come from another thread.
        self._lock = threading.RLock()
        # Engines the health watcher is restarting: left out of the syncs until they rejoin.
        self._restarting: set[str] = set()

    # ------------------------------------------------------------------ public, synchronous

    @property
    def current_group_name(self) -> str:
        return f"{self.group_name}-g{self.generation}"

    def connect(self) -> None:
        """Build the group with every live engine (ranks 1..N); engines that do not join are dropped."""
        self._run(self._connect())

    def broadcast(self, named_tensors: Iterable[tuple[str, Any]], version: int) -> SyncStats:
        """Send every tensor to every engine; returns what it took. Raises WeightSyncError if no engine is left."""
        # References only: a list of the parameters themselves, so that a restart can send them again.
        named = [(name, tensor) for name, tensor in named_tensors]
        return self._run(self._broadcast(named, int(version)))

    def update_from_disk(self, model_or_path: Any, version: int, *, folder: str | Path | None = None) -> SyncStats:
        """The fallback path: save the model (or use a saved folder) and have every engine load it."""
        return self._run(self._update_from_disk(model_or_path, int(version), folder))

    def close(self) -> None:
        """Leave the group (engines are told to drop theirs) and stop the private loop."""
        if self._thread.is_alive():
            try:
                self._run(self._teardown(tell=self._group_engines))
                self._run(self._close_session())
            finally:
                self._loop.call_soon_threadsafe(self._loop.stop)
                self._thread.join(timeout=5)
        self._pool.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> WeightBroadcaster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ internals

    def mark_restarting(self, url: str) -> None:
        """The engine at `url` died and is being started again: leave it out until `rejoin(url, ...)`.
        Takes no lock (a sync may be under way): the next sync drops it."""
        self._restarting.add(url.rstrip("/"))

    def rejoin(self, url: str, named_tensors: Iterable[tuple[str, Any]], version: int) -> SyncStats:
        """Take a restarted engine at `url` back into the group and bring every engine to `version`
        (see the module docstring). Raises WeightSyncError if it (or every engine) cannot take it."""
        url = url.rstrip("/")
        named = [(name, tensor) for name, tensor in named_tensors]
        with self._lock:
            self._restarting.discard(url)
            self.failed_engines.pop(url, None)
            if url not in self.engines:
                self.engines.append(url)
            # The old group's ranks are fixed: form a new one, whoever is in it now.
            self._run(self._teardown(tell=[u for u in self._group_engines if u != url]))
            stats = self._run(self._broadcast(named, int(version)))
        if url in stats.failed or url not in self.engines:
            raise WeightSyncError(f"the restarted engine {url} did not take weight version {version}: "
                                  f"{stats.failed.get(url, 'dropped')}", "see the engine's log")
        return stats

    def _run(self, coro: Any) -> Any:
        # Re-entrant: rejoin holds the lock across its two steps; broadcast and connect take it here.
        with self._lock:
            return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def _http(self) -> Any:
        import aiohttp

        if self._session is None:
            headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
            self._session = aiohttp.ClientSession(headers=headers)
        return self._session

    async def _close_session(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _post(self, url: str, path: str, body: Any = None, *, timeout_s: float | None = None) -> dict:
        """POST and return the JSON answer; raise _Unreachable when the engine cannot be reached or hangs."""
        import aiohttp

        timeout = aiohttp.ClientTimeout(total=timeout_s or self.http_timeout_s)
        try:
            async with self._http().post(url + path, json=body, timeout=timeout) as reply:
                try:
                    data = await reply.json(content_type=None)
                except ValueError:
                    data = {"text": (await reply.text())[:300]}
                if not isinstance(data, dict):
                    data = {"value": data}
                data.setdefault("success", reply.status < 400)
                data["status"] = reply.status
                return data
        except TimeoutError:
            raise _Unreachable(f"{path} got no answer in {timeout.total:g}s") from None
        except (aiohttp.ClientError, OSError) as e:
            raise _Unreachable(f"{path}: {type(e).__name__}: {e}") from None

    async def _live(self, urls: list[str]) -> tuple[list[str], dict[str, str]]:
        """Split `urls` into those whose /health answers 200 and the others (with why)."""
        import aiohttp

        async def probe(url: str) -> str | None:
            try:
                async with self._http().get(url + "/health", timeout=aiohttp.ClientTimeout(total=5)) as reply:
                    return None if reply.status == 200 else f"/health answered {reply.status}"
            except (TimeoutError, aiohttp.ClientError, OSError) as e:
                return f"/health unreachable ({type(e).__name__})"

        answers = await asyncio.gather(*(probe(u) for u in urls))
        dead = {u: why for u, why in zip(urls, answers) if why is not None}
        return [u for u in urls if u not in dead], dead

    def _drop(self, dead: dict[str, str]) -> None:
        for url, why in dead.items():
            if url in self.engines:
                log.warning("weight sync: dropping engine %s (%s)", url, why)
                self.engines.remove(url)
                self.failed_engines[url] = why

    async def _connect(self) -> dict[str, str]:
        """(Re)build the group with the live engines; returns the engines dropped on the way."""
        dropped: dict[str, str] = {}
        await self._teardown(tell=self._group_engines)
        for _ in range(len(self.engines) + 1):
            live, dead = await self._live(self.engines)
            self._drop(dead)
            dropped.update(dead)
            if not live:
                raise WeightSyncError("no engine is left to take the weights",
                                      f"see the engines' logs; dropped: {self.failed_engines}")
            self.generation += 1
            name, world = self.current_group_name, len(live) + 1
            host = self._loop.run_in_executor(self._pool, functools.partial(
                StatelessGroup.create, backend=self.backend, master_address=self.master_address,
                master_port=self.master_port, rank=0, world_size=world, group_name=name, timeout_s=self.timeout_s))
            bodies = [{"master_address": self.master_address, "master_port": self.master_port, "rank_offset": i + 1,
                       "world_size": world, "group_name": name, "backend": self.backend} for i in range(len(live))]
            joins = await asyncio.gather(*(self._post(u, "/init_weights_update_group", b)
                                           for u, b in zip(live, bodies)), return_exceptions=True)
            try:
                group = await host
            except Exception as e:  # noqa: BLE001 - a rank did not join: find out which, retry without it
                group = None
                host_error = e
            bad = {u: _why(j) for u, j in zip(live, joins) if isinstance(j, Exception) or not j.get("success")}
            if group is not None and not bad:
                self._group, self._group_engines = group, live
                log.info("weight sync group %s: trainer + %d engines", name, len(live))
                return dropped
            if group is not None:
                group.close()
            if not bad:
                raise WeightSyncError(f"the weight-update group {name} did not form ({host_error})",
                                      "check master_address/master_port are reachable from the engines")
            self._drop(bad)
            dropped.update(bad)
        raise WeightSyncError("the weight-update group did not form", "see the engines' logs")

    async def _teardown(self, *, tell: list[str]) -> None:
        """Close our end of the group; engines in `tell` are asked to drop theirs (best effort)."""
        group, self._group = self._group, None
        self._group_engines = []
        if group is not None:
            group.close()
        if tell:
            name = self.current_group_name
            await asyncio.gather(*(self._post(u, "/destroy_weights_update_group", {"group_name": name}, timeout_s=10)
                                   for u in list(tell)), return_exceptions=True)

    async def _broadcast(self, named: list[tuple[str, Any]], version: int) -> SyncStats:
        t0 = time.perf_counter()
        dropped: dict[str, str] = {}
        restarts = 0
        while True:
            restarting = {u: "restarting (health watcher)" for u in list(self._restarting) if u in self.engines}
            self._drop(restarting)
            dropped.update(restarting)
            if not self.engines and self._restarting:
                # Every engine is being started again: none to send to now, and each rejoins with the
                # trainer's weights of then (`rejoin`), so this version is not lost. Not a failed run.
                await self._teardown(tell=[])
                return SyncStats(version=version, seconds=time.perf_counter() - t0, bytes=0, buckets=0,
                                 num_engines=0, failed=dropped, num_restarts=restarts)
            if not self.engines:
                raise WeightSyncError(f"no engine is left to take weight version {version}",
                                      f"see the engines' logs; dropped: {self.failed_engines}")
            if self._group is None or self._group_engines != self.engines or await self._left_the_group():
                dropped.update(await self._connect())
            try:
                nbytes, nbuckets = await self._sync_once(named, version)
                return SyncStats(version=version, seconds=time.perf_counter() - t0, bytes=nbytes, buckets=nbuckets,
                                 num_engines=len(self.engines), failed=dropped, num_restarts=restarts)
            except _SyncFailed as e:
                self._drop(e.dead)
                dropped.update(e.dead)
                await self._teardown(tell=self.engines)
                # The survivors were paused for the sync: let them generate again (the restart pauses anew).
                await asyncio.gather(*(self._post(u, "/continue_generation", {}, timeout_s=10)
                                       for u in self.engines), return_exceptions=True)
                if not e.retryable:
                    # Every engine is alive and one refused the weights: a wrong model, not a failure to mask.
                    raise WeightSyncError(f"weight sync to version {version} failed: {e}",
                                          "check that the engines serve the trainer's architecture") from None
                log.warning("weight sync to version %d failed (%s); restarting without %s", version, e, list(e.dead))
                restarts += 1
                if not self.engines:
                    raise WeightSyncError(f"no engine took weight version {version}",
                                          f"see the engines' logs; dropped: {dropped}") from None
                if restarts > len(dropped) + 1:
                    raise WeightSyncError(f"weight sync to version {version} keeps failing ({e})",
                                          "see the engines' logs") from None

    async def _left_the_group(self) -> bool:
        """True if an engine of the group no longer holds it (it restarted since the group formed). Only
        engines that list their groups (`weight_update_groups`, rl360's engine) can tell; the others pass."""
        import aiohttp

        name = self.current_group_name

        async def holds(url: str) -> bool:
            try:
                async with self._http().get(url + "/server_info", timeout=aiohttp.ClientTimeout(total=5)) as reply:
                    info = await reply.json(content_type=None)
            except (TimeoutError, aiohttp.ClientError, OSError, ValueError):
                return True  # unreachable: the sync finds out and drops it
            groups = info.get("weight_update_groups") if isinstance(info, dict) else None
            return not isinstance(groups, list) or name in groups

        answers = await asyncio.gather(*(holds(u) for u in self._group_engines))
        return not all(answers)

    async def _sync_once(self, named: list[tuple[str, Any]], version: int) -> tuple[int, int]:
        engines, group = list(self._group_engines), self._group
        await self._on_all(engines, "/pause_generation", {"mode": "retract"})
        buckets = weight_buckets(named, self.bucket_bytes)
        total = 0
        for i, bucket in enumerate(buckets):
            last = i == len(buckets) - 1
            tensors = [_sendable(t, self.backend) for _, t in bucket]
            body = {
                "names": [n for n, _ in bucket],
                "dtypes": [str(t.dtype).removeprefix("torch.") for t in tensors],
                "shapes": [list(t.shape) for t in tensors],
                "group_name": self.current_group_name,
                "flush_cache": last,
                "weight_version": str(version) if last else None,
            }
            await self._bucket(engines, group, body, tensors)
            total += sum(t.numel() * t.element_size() for t in tensors)
        # SGLang's route requires a JSON body (a 422 without one): {} takes its defaults.
        await self._on_all(engines, "/continue_generation", {})
        return total, len(buckets)

    async def _bucket(self, engines: list[str], group: Any, body: dict, tensors: list[Any]) -> None:
        """Post the bucket to every engine while rank 0 broadcasts it; on the first failure abort the group."""
        posts = {asyncio.ensure_future(self._post(u, "/update_weights_from_distributed", body)): u for u in engines}

        def send() -> None:
            works = [group.broadcast(t, src=0, async_op=True) for t in tensors]
            for work in works:
                work.wait()

        sender = asyncio.ensure_future(self._loop.run_in_executor(self._pool, send))
        pending = set(posts) | {sender}
        failure: str | None = None
        unreachable: dict[str, str] = {}
        refused: dict[str, str] = {}
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task is sender:
                    if task.exception() is not None:
                        failure = failure or f"broadcast: {task.exception()}"
                    continue
                url = posts[task]
                if task.exception() is not None:
                    unreachable[url] = str(task.exception())
                elif not task.result().get("success"):
                    refused[url] = str(task.result().get("message"))
            if (unreachable or failure or any(NO_GROUP in why for why in refused.values())) and group is not None:
                # Abort now: the other engines' receives fail at once instead of waiting out their timeout.
                group.close()
                group = None
                failure = failure or ("an engine became unreachable" if unreachable else None)
        if not unreachable and not refused and failure is None:
            return
        # Engines that still answer /health are alive: they failed (or timed out) only because the group
        # broke under them, and take part in the restart. The others are dropped.
        _, dead = await self._live(list(unreachable) + list(refused))
        dead = {u: unreachable.get(u, why) for u, why in dead.items()}
        # An engine that holds no group of this name restarted since the group formed: re-form it with them.
        lost_group = {u for u, why in refused.items() if u not in dead and NO_GROUP in why}
        if lost_group and group is not None:
            group.close()
            group = None
        if not dead and failure is None and not unreachable and not lost_group:
            raise _SyncFailed({}, f"engines refused the bucket: {refused}", retryable=False)
        if lost_group and not dead:
            raise _SyncFailed({}, f"engines {sorted(lost_group)} restarted and hold no group: re-forming it")
        raise _SyncFailed(dead, failure or "engine failure")

    async def _on_all(self, engines: list[str], path: str, body: Any) -> None:
        answers = await asyncio.gather(*(self._post(u, path, body) for u in engines), return_exceptions=True)
        dead = {u: _why(a) for u, a in zip(engines, answers) if isinstance(a, Exception)}
        if dead:
            raise _SyncFailed(dead, f"{path} failed")

    async def _update_from_disk(self, model_or_path: Any, version: int, folder: str | Path | None) -> SyncStats:
        t0 = time.perf_counter()
        if isinstance(model_or_path, (str, Path)):
            path = Path(model_or_path)
        else:
            if folder is None:
                raise ValueError("update_from_disk(model, ...) needs folder= (a path every engine can read)")
            path = Path(folder)
            await asyncio.get_running_loop().run_in_executor(self._pool, model_or_path.save_pretrained, str(path))
        nbytes = sum(f.stat().st_size for f in path.glob("*.safetensors"))
        body = {"model_path": str(path.absolute()), "weight_version": str(version), "flush_cache": True}
        engines = list(self.engines)
        answers = await asyncio.gather(*(self._post(u, "/update_weights_from_disk", body) for u in engines),
                                       return_exceptions=True)
        failed = {u: _why(a) for u, a in zip(engines, answers) if isinstance(a, Exception) or not a.get("success")}
        self._drop(failed)
        if not self.engines:
            raise WeightSyncError(f"no engine loaded weight version {version} from {path}", f"dropped: {failed}")
        return SyncStats(version=version, seconds=time.perf_counter() - t0, bytes=nbytes, buckets=1,
                         num_engines=len(self.engines), failed=failed)


class _Unreachable(Exception):
    """The engine could not be reached, or did not answer in time."""


def _why(answer: Any) -> str:
    if isinstance(answer, Exception):
        return str(answer) or type(answer).__name__
    return str(answer.get("message") or answer)


def weight_buckets(named: list[tuple[str, Any]], limit: int) -> list[list[tuple[str, Any]]]:
    """Consecutive groups of at most `limit` bytes; a tensor bigger than that goes alone."""
    buckets: list[list[tuple[str, Any]]] = []
    current: list[tuple[str, Any]] = []
    size = 0
    for name, tensor in named:
        n = tensor.numel() * tensor.element_size()
        if current and size + n > limit:
            buckets.append(current)
            current, size = [], 0
        current.append((name, tensor))
        size += n
    if current:
        buckets.append(current)
    return buckets


def _sendable(tensor: Any, backend: str) -> Any:
    t = tensor.detach()
    if backend == "gloo" and t.device.type != "cpu":
        t = t.cpu()
    return t.contiguous()
