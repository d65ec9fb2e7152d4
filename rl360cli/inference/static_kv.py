"""The engine's static KV cache and its captured decode step (`--static-kv`, `[engine] static_kv`).

On a GPU the dynamic path (kv.py) is host-bound: a 28-layer model's decode step launches ~1,400 kernels,
and growing, padding and trimming the cache's tensors every step adds more. Here the cache is allocated
once, per layer `[slots, kv_heads, capacity, head_dim]` for keys and for values, and a decode step has one
shape per batch bucket (1, 2, 4, ..., max_batch_size), so on CUDA it is captured once per bucket with
`torch.cuda.CUDAGraph` and replayed: one launch a step instead of hundreds.

Layout: the running batch's row i sits in slot i, its tokens left-aligned in columns [0, length_i). A step
feeds each row's last token at position length_i, writes its new keys and values at column length_i (a
scatter, inside the model's attention through `_BucketCache.update`), and attends with a mask of columns
<= length_i. Slots past the live rows are padding: a pad token at position 0 that attends only to itself
(never a fully masked row, so no NaN) and writes into a free slot. Every input of a step lives in static
buffers (`_inputs`, the cache, `_columns`), so replaying a graph computes on whatever they hold now.
Prefill stays eager (a Hugging Face `DynamicCache`, its shapes vary); its rows are copied in (`join`).
Rows that end are compacted to the front (`select`), keeping the order the engine keeps its rows in.

The buffers grow when needed (slots to the next bucket, capacity doubling up to the context length);
growing copies the cache and drops the graphs, which are captured again on next use. A weight load copies
into the model's parameters in place (`weights.load_named`), so graphs stay valid across it; the engine
drops this whole object when it releases memory (parameters moved, cache freed). Without a GPU the same
step runs uncaptured (`graphs=None`), which is how the CPU tests check it token for token against the
dynamic path (tests/inference/test_static_kv.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from rl360cli.inference.kv import BatchKV

log = logging.getLogger("rl360.engine")

# The smallest capacity allocated (columns): keeps the attention mask's last dimension a multiple of 16,
# which CUDA's memory-efficient attention wants.
MIN_CAPACITY = 64

Forward = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, object], torch.Tensor]
"""forward(input_ids [b, 1], position_ids [b, 1], attention_mask [b, 1, 1, capacity], cache) -> logits [b, 1, V]."""


def decode_buckets(max_batch_size: int) -> tuple[int, ...]:
    """The batch sizes a decode step runs at: powers of two below `max_batch_size`, and it."""
    sizes = [1 << k for k in range(max_batch_size.bit_length()) if 1 << k < max_batch_size]
    return (*sizes, max_batch_size)


class CapturedStep(Protocol):
    output: torch.Tensor

    def replay(self) -> None: ...


class StepGraphs(Protocol):
    """Captures a step function so that `replay()` recomputes `output` in place."""

    def capture(self, step: Callable[[], torch.Tensor]) -> CapturedStep: ...

    def reset(self) -> None: ...


@dataclass
class _Graph:
    graph: object
    output: torch.Tensor

    def replay(self) -> None:
        self.graph.replay()  # type: ignore[attr-defined]


class CudaGraphs:
    """`torch.cuda.CUDAGraph` captures on the current device; the graphs share one memory pool (they
    never run at once: a step's logits are read before the next step replays)."""

    def __init__(self) -> None:
        self._pool = torch.cuda.graph_pool_handle()

    def capture(self, step: Callable[[], torch.Tensor]) -> CapturedStep:
        # Warm-up outside the graph (lazy initialisations, cuBLAS workspaces), on a side stream as torch
        # asks. It computes the step on the real inputs: its writes are the ones the replay makes again.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # thread_local: the engine thread captures while the server's threads may touch CUDA (IPC handles).
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            output = step()
        return _Graph(graph=graph, output=output)

    def reset(self) -> None:
        self._pool = torch.cuda.graph_pool_handle()


class _BucketCache:
    """What a Hugging Face model's attention layers call on their cache (`update`), over the first `b`
    slots of the static buffers: the step's keys and values go in at each row's position, and the whole
    capacity comes back (the mask hides what is not the row's)."""

    def __init__(self, keys: list[torch.Tensor], values: list[torch.Tensor], positions: torch.Tensor):
        self.keys, self.values = keys, values
        rows, heads, _, dim = keys[0].shape
        self._index = positions.view(rows, 1, 1, 1).expand(rows, heads, 1, dim)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = self.keys[layer_idx], self.values[layer_idx]
        keys.scatter_(2, self._index, key_states.to(keys.dtype))
        values.scatter_(2, self._index, value_states.to(values.dtype))
        return keys, values

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return int(self.keys[layer_idx].shape[2])


class StaticKV:
    """The running batch's keys and values in fixed buffers, and the decode step over them.

    It offers the engine what `BatchKV` does (`rows`, `join`, `select`, `row_layers`) plus `decode`.
    `graphs`: how steps are captured (`CudaGraphs()` on CUDA); None runs every step uncaptured.
    `eager_mask`: an additive float mask (the `eager` attention implementation) instead of a boolean one.
    """

    def __init__(self, forward: Forward, *, buckets: Sequence[int], max_length: int, pad_id: int,
                 graphs: StepGraphs | None = None, eager_mask: bool = False):
        self._forward = forward
        self.buckets = tuple(sorted(buckets))
        self.max_length = max_length
        self.pad_id = pad_id
        self.eager_mask = eager_mask
        self._graphs = graphs
        self.lengths: list[int] = []
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.slots = 0
        self.capacity = 0
        self._inputs: torch.Tensor | None = None  # [2, slots]: each slot's token id, then its position
        self._columns: torch.Tensor | None = None  # [capacity]: 0, 1, 2, ...
        self._steps: dict[int, Callable[[], torch.Tensor]] = {}
        self._captured: dict[int, CapturedStep] = {}
        self.captures = 0  # graphs captured so far (each bucket once per allocation)
        self.capture_error: str | None = None  # why capturing failed (then every step runs uncaptured)

    @property
    def rows(self) -> int:
        return len(self.lengths)

    def bucket(self, rows: int) -> int:
        """The smallest bucket that holds `rows` rows."""
        for size in self.buckets:
            if size >= rows:
                return size
        raise ValueError(f"{rows} rows is more than the largest decode bucket ({self.buckets[-1]})")

    def adopt(self, kv: BatchKV) -> StaticKV:
        """Start over with `kv`'s rows (a fresh batch after a prefill); returns self."""
        self.lengths = []
        self.join(kv)
        return self

    def join(self, kv: BatchKV) -> None:
        """Append `kv`'s rows (a prefill's `DynamicCache` and mask) after ours, each row's real tokens
        left-aligned (a row continued from the prefix cache may have padding inside it)."""
        layers = list(kv.cache.layers)  # type: ignore[attr-defined]
        counts = kv.mask.sum(dim=1).tolist()
        first = self.rows
        self._reserve(first + len(counts), max(counts + self.lengths) + 1, like=layers[0].keys,
                      num_layers=len(layers))
        width = max(counts)
        # Each row's real columns first, in their order (a stable sort of "is padding").
        order = torch.sort((kv.mask == 0).to(torch.int32), dim=1, stable=True).indices[:, :width]
        rows = slice(first, first + len(counts))
        for keys, values, layer in zip(self.keys, self.values, layers, strict=True):
            _, heads, _, dim = layer.keys.shape
            index = order[:, None, :, None].expand(-1, heads, -1, dim)
            keys[rows, :, :width] = layer.keys.gather(2, index)
            values[rows, :, :width] = layer.values.gather(2, index)
        self.lengths.extend(int(n) for n in counts)

    def select(self, keep: list[int]) -> None:
        """Keep only rows `keep` (in that order), moved to the front slots."""
        kept = [self.lengths[i] for i in keep]
        if keep and keep != list(range(len(keep))):
            width = max(kept)
            index = torch.tensor(keep, dtype=torch.long, device=self.keys[0].device)
            for buffer in (*self.keys, *self.values):
                buffer[:len(keep), :, :width] = buffer[index, :, :width]
        self.lengths = kept

    def row_layers(self, row: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Row `row`'s keys and values, per layer ([heads, tokens, head_dim] copies: the slot is reused)."""
        n = self.lengths[row]
        return [(k[row, :, :n].clone(), v[row, :, :n].clone()) for k, v in zip(self.keys, self.values)]

    def reserve(self, rows: int, length: int) -> None:
        """Make room now for `rows` rows of `length` tokens (the buffers otherwise grow as batches need),
        so that no growth, and no capture again, falls inside a measured run. Needs one `join` first."""
        self._reserve(rows, length)

    def decode(self, tokens: list[int]) -> torch.Tensor:
        """One step: `tokens[i]` (row i's last token) in, the next token's logits [rows, V] out."""
        n = len(tokens)
        if n != self.rows:
            raise ValueError(f"{n} tokens for {self.rows} rows")
        size = self.bucket(n)
        self._reserve(size, max(self.lengths) + 1)
        pad = size - n
        host = torch.tensor([list(tokens) + [self.pad_id] * pad, self.lengths + [0] * pad], dtype=torch.long)
        self._inputs[:, :size].copy_(host)
        logits = self._run(size)
        self.lengths = [length + 1 for length in self.lengths]
        return logits[:n, -1]

    # ------------------------------------------------------------------ inside

    def _run(self, size: int) -> torch.Tensor:
        if self._graphs is None or self.capture_error is not None:
            return self._step(size)()
        captured = self._captured.get(size)
        if captured is None:
            try:
                captured = self._captured[size] = self._graphs.capture(self._step(size))
            except Exception as e:  # noqa: BLE001 - a model that cannot be captured still decodes, uncaptured
                self.capture_error = f"{type(e).__name__}: {e}"
                log.warning("capturing the decode step failed; decoding uncaptured from now on (%s)",
                            self.capture_error)
                return self._step(size)()
            self.captures += 1
        captured.replay()
        return captured.output

    def _step(self, size: int) -> Callable[[], torch.Tensor]:
        """The decode step of bucket `size`, bound to the buffers as they are now (as a graph would be)."""
        step = self._steps.get(size)
        if step is not None:
            return step
        ids = self._inputs[0, :size].unsqueeze(1)
        positions = self._inputs[1, :size].unsqueeze(1)
        columns = self._columns
        cache = _BucketCache([k[:size] for k in self.keys], [v[:size] for v in self.values], positions)
        forward, eager_mask, dtype = self._forward, self.eager_mask, self.keys[0].dtype

        def step() -> torch.Tensor:
            allowed = (columns[None, :] <= positions)[:, None, None, :]  # [b, 1, 1, capacity]
            if eager_mask:
                mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
                allowed = mask.masked_fill(~allowed, torch.finfo(dtype).min)
            return forward(ids, positions, allowed, cache)

        self._steps[size] = step
        return step

    def _reserve(self, rows: int, length: int, *, like: torch.Tensor | None = None, num_layers: int = 0) -> None:
        """Room for `rows` rows of `length` tokens: the buffers grow (and the graphs go) when they lack it."""
        slots = self.bucket(rows)
        if slots <= self.slots and length <= self.capacity:
            return
        capacity = self.capacity
        if length > capacity:
            ceiling = max(length, -(-self.max_length // MIN_CAPACITY) * MIN_CAPACITY)
            capacity = min(max(MIN_CAPACITY, 1 << (length - 1).bit_length()), ceiling)
        slots = max(slots, self.slots)
        like = like if like is not None else self.keys[0]
        num_layers = num_layers or len(self.keys)
        _, heads, _, dim = like.shape
        old = (self.keys, self.values)
        self.keys = [like.new_zeros(slots, heads, capacity, dim) for _ in range(num_layers)]
        self.values = [like.new_zeros(slots, heads, capacity, dim) for _ in range(num_layers)]
        for new, previous in zip((self.keys, self.values), old):
            for buffer, before in zip(new, previous):
                buffer[:self.slots, :, :self.capacity] = before
        self.slots, self.capacity = slots, capacity
        self._inputs = torch.zeros(2, slots, dtype=torch.long, device=like.device)
        self._columns = torch.arange(capacity, device=like.device)
        self._steps.clear()
        if self._captured:
            self._captured.clear()
            self._graphs.reset()  # type: ignore[union-attr]
