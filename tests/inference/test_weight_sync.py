"""The weight broadcast, trainer (this process, rank 0) to real engine servers, over real gloo on loopback."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import urllib.request

import pytest
import torch

from rl360cli.inference.client import EngineClient
from rl360cli.trainer.broadcast import WeightBroadcaster, WeightSyncError, weight_buckets
from rl360cli.inference.process_group import StatelessGroup

from .conftest import free_port


@pytest.fixture(scope="module")
def pair(module_engines, tiny_model):
    """Two engines shared by the tests that leave them running."""
    return [e.url for e in module_engines(tiny_model, count=2)]


@pytest.fixture(scope="module")
def trainer_model(tiny_model):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()


def perturb(model, seed):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.05)


def greedy(url, prompt, n=12):
    async def go():
        async with EngineClient(url) as client:
            return await client.generate(prompt, {"temperature": 0, "max_new_tokens": n, "ignore_eos": True})
    return asyncio.run(go())


def trainer_greedy(model, prompt, n=12):
    out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def engine_param(url, name):
    request = urllib.request.Request(url + "/get_weights_by_name", data=json.dumps({"name": name,
                                                                                    "truncate_size": 4}).encode())
    with urllib.request.urlopen(request) as reply:
        return torch.tensor(json.load(reply))


def _peer(rank, port, world, queue):
    group = StatelessGroup.create(backend="gloo", master_address="127.0.0.1", master_port=port, rank=rank,
                                  world_size=world, group_name="t", timeout_s=30)
    t = torch.zeros(5)
    group.broadcast(t, src=0)
    queue.put((rank, t.tolist()))
    group.close()


def test_a_stateless_gloo_group_broadcasts_without_a_default_group():
    import torch.distributed as dist

    port, ctx = free_port(), multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    peers = [ctx.Process(target=_peer, args=(r, port, 3, queue)) for r in (1, 2)]
    for p in peers:
        p.start()
    group = StatelessGroup.create(backend="gloo", master_address="127.0.0.1", master_port=port, rank=0,
                                  world_size=3, group_name="t", timeout_s=30)
    group.broadcast(torch.arange(5.0), src=0)
    got = sorted(queue.get(timeout=60) for _ in peers)
    for p in peers:
        p.join(timeout=30)
    group.close()
    assert got == [(1, [0.0, 1.0, 2.0, 3.0, 4.0]), (2, [0.0, 1.0, 2.0, 3.0, 4.0])]
    assert not dist.is_initialized()  # the global default group was never touched


def test_a_sync_while_every_engine_restarts_sends_nothing_and_only_no_engine_at_all_fails():
    # One engine, being started again by the health watcher: the step's sync must not end the run (the
    # chaos bench's engine kill failed its run this way); the rejoin brings the engine to the version.
    weights = [("w", torch.zeros(4))]
    with WeightBroadcaster(["http://127.0.0.1:9"], master_port=free_port()) as sync:
        sync.mark_restarting("http://127.0.0.1:9")
        stats = sync.broadcast(weights, version=3)
        assert (stats.version, stats.num_engines, stats.bytes) == (3, 0, 0)
        assert stats.failed == {"http://127.0.0.1:9": "restarting (health watcher)"}
    # The same engine dead and not being restarted (nothing listens on the port): that is a failure.
    with WeightBroadcaster(["http://127.0.0.1:9"], master_port=free_port()) as sync, \
            pytest.raises(WeightSyncError, match="no engine is left"):
        sync.broadcast(weights, version=3)


def test_buckets_split_by_size_and_keep_order():
    named = [(f"t{i}", torch.zeros(n)) for i, n in enumerate([10, 10, 30, 5, 100])]
    buckets = weight_buckets(named, limit=25 * 4)
    assert [[n for n, _ in b] for b in buckets] == [["t0", "t1"], ["t2"], ["t3"], ["t4"]]


def test_broadcast_to_two_engines_updates_weights_and_version(pair, trainer_model):
    urls = pair
    before = greedy(urls[0], [5, 6, 7])
    perturb(trainer_model, seed=1)
    expected = trainer_greedy(trainer_model, [5, 6, 7])
    assert expected != before.output_ids  # the perturbation matters, so the check below means something

    with WeightBroadcaster(urls, master_port=free_port(), bucket_mb=0.05, timeout_s=60) as sync:
        sync.connect()
        stats = sync.broadcast(trainer_model.named_parameters(), version=1)
        params = list(trainer_model.named_parameters())
        assert stats.bytes == sum(p.numel() * p.element_size() for _, p in params)
        assert stats.buckets == len(weight_buckets(params, int(0.05 * (1 << 20)))) > 1
        assert stats.failed == {} and stats.num_engines == 2 and stats.version == 1
        for url in urls:
            after = greedy(url, [5, 6, 7])
            assert after.output_ids == expected and after.weight_version == 1
            name = "model.layers.1.mlp.down_proj.weight"
            assert torch.allclose(engine_param(url, name), dict(params)[name].detach()[:4])

        # A second sync reuses the group.
        perturb(trainer_model, seed=2)
        assert sync.broadcast(trainer_model.named_parameters(), version=2).failed == {}
        assert all(greedy(u, [5, 6, 7]).output_ids == trainer_greedy(trainer_model, [5, 6, 7]) for u in urls)


def test_a_request_in_flight_during_a_sync_finishes_under_the_new_version(pair, trainer_model):
    urls = pair

    async def go():
        async with EngineClient(urls[0]) as client:
            task = asyncio.ensure_future(client.generate([1, 2], {"max_new_tokens": 400, "ignore_eos": True}))
            while (await client.request("GET", "/get_load"))[0]["num_reqs"] == 0:
                await asyncio.sleep(0.01)
            with WeightBroadcaster(urls, master_port=free_port(), timeout_s=60) as sync:
                stats = await asyncio.to_thread(sync.broadcast, trainer_model.named_parameters(), 7)
            result = await task
            return stats, result

    stats, result = asyncio.run(go())
    assert stats.failed == {} and stats.buckets == 1
    assert len(result.output_ids) == 400 and result.weight_version == 7


def test_update_from_disk_is_the_fallback(pair, trainer_model, tmp_path):
    urls = pair
    perturb(trainer_model, seed=3)
    with WeightBroadcaster(urls, master_port=free_port()) as sync:
        stats = sync.update_from_disk(trainer_model, version=9, folder=tmp_path / "v9")
    assert stats.failed == {} and stats.bytes > 0
    for url in urls:
        result = greedy(url, [5, 6, 7])
        assert result.weight_version == 9 and result.output_ids == trainer_greedy(trainer_model, [5, 6, 7])


def test_weights_that_do_not_fit_fail_loudly_and_leave_the_engines_serving(pair):
    urls = pair
    bogus = [("model.norm.weight", torch.ones(3))]
    with WeightBroadcaster(urls, master_port=free_port(), timeout_s=30) as sync:
        with pytest.raises(WeightSyncError, match="does not fit"):
            sync.broadcast(bogus, version=99)
    for url in urls:
        assert greedy(url, [1], n=2).weight_version != 99


@pytest.mark.slow
def test_dead_engines_are_dropped_and_the_others_get_the_weights(start_engine, tiny_model, trainer_model):
    """One engine dies between two syncs, another in the middle of one: the trainer never hangs, the
    broadcaster names the dead, rebuilds the group with the survivor and every sync still lands there."""
    import threading

    # The engines' group timeout is the trainer's, as `rl360 serve` sets both from the recipe: a survivor of
    # the kill inside a sync waits out its own (60 s by default) for the bucket the trainer never sends.
    engines = start_engine(tiny_model, "--dist-timeout-s", "8", count=3)
    urls = [e.url for e in engines]
    with WeightBroadcaster(urls, master_port=free_port(), bucket_mb=0.1, timeout_s=8) as sync:
        sync.connect()
        assert sync.broadcast(trainer_model.named_parameters(), version=1).failed == {}

        engines[2].kill()  # between syncs
        perturb(trainer_model, seed=4)
        stats = sync.broadcast(trainer_model.named_parameters(), version=2)
        assert list(stats.failed) == [urls[2]] and stats.num_engines == 2 and stats.num_restarts == 1
        assert sync.engines == urls[:2] and urls[2] in sync.failed_engines
        assert all(greedy(u, [5, 6, 7]).weight_version == 2 for u in urls[:2])

        # Many small buckets, so that the kill lands inside the sync.
        heavy = list(trainer_model.named_parameters()) * 30
        killer = threading.Timer(0.3, engines[1].kill)
        killer.start()
        stats = sync.broadcast(heavy, version=3)
        killer.join()
        assert engines[1].proc.poll() is not None
        assert list(stats.failed) == [urls[1]] and stats.num_engines == 1
        assert sync.engines == [urls[0]] and set(sync.failed_engines) == {urls[1], urls[2]}

        # The next sync runs in the rebuilt group, without the dead engines.
        perturb(trainer_model, seed=5)
        assert sync.broadcast(trainer_model.named_parameters(), version=4).failed == {}
    result = greedy(urls[0], [5, 6, 7])
    assert result.weight_version == 4 and result.output_ids == trainer_greedy(trainer_model, [5, 6, 7])
