"""The running batch's KV cache: left-padded rows that can be joined, dropped and trimmed between steps.

Continuous batching on a Hugging Face model: every row of the batch is a
sequence; its keys and values sit right-aligned in `[B, heads, T, head_dim]`
tensors, with an attention mask marking the left padding. New sequences are
prefilled on their own and then joined (both sides padded on the left to the
same length); finished ones are dropped, and columns that became padding in
every row are trimmed away. Position ids come from each row's own count of
real tokens, so padding never shifts a position and the logits match an
unpadded forward pass. Tested by tests/inference/test_engine.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class BatchKV:
    """A Hugging Face `DynamicCache` plus its `[B, T]` attention mask (1: a real token, 0: left padding)."""

    cache: object
    mask: torch.Tensor

    @property
    def rows(self) -> int:
        return int(self.mask.shape[0])

    @property
    def length(self) -> int:
        return int(self.mask.shape[1])

    def next_positions(self) -> torch.Tensor:
        """`[B, 1]` position ids of each row's next token (its number of real tokens)."""
        return self.mask.sum(dim=1, keepdim=True)

    def grow_mask(self) -> torch.Tensor:
        """The mask for a decode step: one more real column for every row."""
        return torch.cat([self.mask, torch.ones(self.rows, 1, dtype=self.mask.dtype, device=self.mask.device)], dim=1)

    def select(self, keep: list[int]) -> None:
        """Keep only rows `keep` (in that order), then drop columns that are padding in every kept row."""
        index = torch.tensor(keep, dtype=torch.long, device=self.mask.device)
        for layer in _layers(self.cache):
            layer.keys = layer.keys.index_select(0, index)
            layer.values = layer.values.index_select(0, index)
        self.mask = self.mask.index_select(0, index)
        real = self.mask.any(dim=0).nonzero()
        start = int(real[0]) if len(real) else self.length
        if start > 0:
            for layer in _layers(self.cache):
                layer.keys = layer.keys[:, :, start:, :]
                layer.values = layer.values[:, :, start:, :]
            self.mask = self.mask[:, start:]

    def row_layers(self, row: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Row `row`'s keys and values without its padding, per layer ([heads, tokens, head_dim] copies)."""
        real = self.mask[row].nonzero()[:, 0]
        first = int(real[0]) if len(real) else self.length
        # Usually the padding is all on the left: a slice copies faster than a gather.
        columns = slice(first, None) if len(real) == self.length - first else real
        return [(layer.keys[row][:, columns].contiguous(), layer.values[row][:, columns].contiguous())
                for layer in _layers(self.cache)]

    def join(self, other: BatchKV) -> None:
        """Append `other`'s rows after ours, padding the shorter side on the left."""
        length = max(self.length, other.length)
        mine, theirs = length - self.length, length - other.length
        for a, b in zip(_layers(self.cache), _layers(other.cache), strict=True):
            a.keys = torch.cat([_pad_left(a.keys, mine), _pad_left(b.keys, theirs)], dim=0)
            a.values = torch.cat([_pad_left(a.values, mine), _pad_left(b.values, theirs)], dim=0)
        self.mask = torch.cat([F.pad(self.mask, (mine, 0)), F.pad(other.mask, (theirs, 0))], dim=0)


def _layers(cache: object) -> list:
    return list(cache.layers)  # type: ignore[attr-defined]


def _pad_left(t: torch.Tensor, n: int) -> torch.Tensor:
    # [B, H, T, D]: pad the T dimension on the left.
    return F.pad(t, (0, 0, n, 0)) if n else t


def left_padded(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask, position_ids) for prompts of different lengths, right-aligned."""
    length = max(len(r) for r in rows)
    ids = torch.full((len(rows), length), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), length), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, length - len(r):] = torch.tensor(r, dtype=torch.long)
        mask[i, length - len(r):] = 1
    positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
    return ids, mask, positions
