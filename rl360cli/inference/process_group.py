"""A torch.distributed process group that lives beside, never inside, the default one.

The weight broadcast joins the trainer (rank 0) and every engine (ranks 1..N)
in one group. The trainer may already own the global default group (Megatron,
torchrun), and the engines own theirs (SGLang's tensor parallel group), so the
broadcast group is built *statelessly*: its own `TCPStore` (hosted by rank 0)
and a `ProcessGroupGloo` / `ProcessGroupNCCL` made from it directly, without
`init_process_group` and without registering anything in torch's global world.

The store keys are laid out exactly as SGLang's `init_custom_process_group`
lays them out (a `tcp://` rendezvous store, `PrefixStore(group_name)`, then
`{group_name}/` and `{device}/` prefixes as torch's `_new_process_group_helper`
adds them), so rl360's trainer and a real SGLang engine meet in the same group.

    group = StatelessGroup.create(backend="gloo", master_address="127.0.0.1", master_port=29600,
                                  rank=0, world_size=3, group_name="rl360_weights", timeout_s=60)
    group.broadcast(tensor, src=0)
    group.close()

Set GLOO_SOCKET_IFNAME=lo for a loopback-only gloo group (the engine server does).
Tested by tests/inference/test_process_group.py.
"""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any


def _device_for(backend: str) -> str:
    return "cuda" if backend == "nccl" else "cpu"


@dataclass
class StatelessGroup:
    """A process group of `world_size` ranks with its own store; `close()` releases both."""

    backend: str
    rank: int
    world_size: int
    group_name: str
    store: Any
    pg: Any

    @classmethod
    def create(cls, *, backend: str, master_address: str, master_port: int, rank: int, world_size: int,
               group_name: str, timeout_s: float = 60.0) -> StatelessGroup:
        """Join (rank > 0) or host (rank 0) the group; blocks until every rank has joined or `timeout_s` passes."""
        import torch.distributed as dist

        if backend not in ("gloo", "nccl"):
            raise ValueError(f"backend must be 'gloo' or 'nccl' (got {backend!r})")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, {world_size}) (got {rank})")
        timeout = timedelta(seconds=timeout_s)
        # Rank 0 hosts the store, as a `tcp://` rendezvous does; the others connect to it.
        store = dist.TCPStore(master_address, master_port, world_size, is_master=(rank == 0), timeout=timeout,
                              wait_for_workers=False, multi_tenant=True)
        prefixed = dist.PrefixStore(f"{_device_for(backend)}/",
                                    dist.PrefixStore(f"{group_name}/", dist.PrefixStore(group_name, store)))
        if backend == "gloo":
            if master_address.startswith("127."):
                # Loopback rendezvous: keep gloo's own connections on lo too.
                os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
            pg = dist.ProcessGroupGloo(prefixed, rank, world_size, timeout)
        else:
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = timeout
            pg = dist.ProcessGroupNCCL(prefixed, rank, world_size, options)
        return cls(backend=backend, rank=rank, world_size=world_size, group_name=group_name, store=store, pg=pg)

    @property
    def port(self) -> int:
        """The store's port (useful when the host asked for port 0)."""
        return self.store.port

    def broadcast(self, tensor: Any, *, src: int = 0, async_op: bool = False) -> Any:
        """Broadcast `tensor` in place from rank `src`; returns the work handle when `async_op`."""
        import torch.distributed as dist

        options = dist.BroadcastOptions()
        options.rootRank = src
        options.rootTensor = 0
        work = self.pg.broadcast([tensor], options)
        if async_op:
            return work
        work.wait()
        return None

    def barrier(self) -> None:
        import torch

        # A one-element all-reduce is a barrier every backend has.
        self.pg.allreduce([torch.zeros(1, device=_device_for(self.backend))]).wait()

    def close(self) -> None:
        """Drop the group and its store. Peers blocked on it see an error at once: destroying a gloo group
        closes its connections (its `abort()` would not), and an NCCL group is aborted."""
        pg, self.pg = self.pg, None
        if pg is not None and self.backend == "nccl":
            try:
                pg.abort()
            except Exception:  # noqa: BLE001 - closing a broken group must not raise
                pass
        del pg
        self.store = None
        gc.collect()
