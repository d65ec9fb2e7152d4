"""The local engine's prefix cache: keys and values of token prefixes it has computed, reused by later prompts.

An agent's turn k+1 is its turn k (prompt and answer) plus an observation, and a GRPO group's samples
start from one prompt: without a cache, the engine prefills the same tokens again and again
(local-smoke: ~150 prompt tokens a session, most of them seen before). SGLang's radix cache does
this on a GPU; this is the same idea in its simplest form. Every sequence the engine prefilled or
finished is kept (its keys and values, [heads, tokens, head_dim] per layer) and indexed under a hash
of each of its prefixes, so a prompt finds the longest cached prefix with one dictionary look-up per
prompt length. The least recently used entries go when the cache passes its byte budget.

Keys and values depend on the weights: the engine clears the cache whenever its weights change, so a
prompt is never continued from keys computed by an older policy.

Tested by tests/inference/test_prefix_cache.py (and through the engine: its logprobs still equal a
plain forward pass).
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from dataclasses import dataclass

import torch

# A polynomial hash of every prefix, modulo a Mersenne prime: equal hashes are checked token by token.
_MODULUS = (1 << 61) - 1
_BASE = 1_000_003

Layers = list[tuple[torch.Tensor, torch.Tensor]]
"""Per layer, (keys, values) of one sequence: [heads, tokens, head_dim] each."""


@dataclass(eq=False)
class _Entry:
    tokens: tuple[int, ...]
    layers: Layers
    nbytes: int
    keys: list[tuple[int, int]]


def prefix_hashes(tokens: Sequence[int]) -> list[int]:
    """hashes[n - 1] is the hash of tokens[:n]."""
    out, h = [], 0
    for t in tokens:
        h = (h * _BASE + t + 1) % _MODULUS
        out.append(h)
    return out


class PrefixCache:
    """Cached sequences by every prefix, least recently used first out, within `max_bytes`."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.nbytes = 0
        self._entries: collections.OrderedDict[int, _Entry] = collections.OrderedDict()
        self._by_prefix: dict[tuple[int, int], _Entry] = {}
        self.hits = 0
        self.hit_tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    def longest_prefix(self, tokens: Sequence[int], *, at_most: int) -> tuple[int, Layers]:
        """The longest cached prefix of `tokens`, no longer than `at_most`: (its length, its keys and
        values cut to that length); (0, []) when none is cached."""
        hashes = prefix_hashes(tokens[:at_most])
        for n in range(len(hashes), 0, -1):
            entry = self._by_prefix.get((n, hashes[n - 1]))
            if entry is not None and entry.tokens[:n] == tuple(tokens[:n]):
                self._entries.move_to_end(id(entry))
                self.hits += 1
                self.hit_tokens += n
                return n, [(k[:, :n], v[:, :n]) for k, v in entry.layers]
        return 0, []

    def insert(self, tokens: Sequence[int], layers: Layers) -> None:
        """Keep `layers` (the keys and values of exactly `tokens`), unless the cache holds them already."""
        tokens = tuple(tokens)
        if not tokens:
            return
        hashes = prefix_hashes(tokens)
        held = self._by_prefix.get((len(tokens), hashes[-1]))
        if held is not None and held.tokens[:len(tokens)] == tokens:
            self._entries.move_to_end(id(held))
            return
        nbytes = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in layers)
        if nbytes > self.max_bytes:
            return
        entry = _Entry(tokens=tokens, layers=layers, nbytes=nbytes, keys=[(n, h) for n, h in enumerate(hashes, 1)])
        for key in entry.keys:  # the newest entry answers for a prefix that several share
            self._by_prefix[key] = entry
        self._entries[id(entry)] = entry
        self.nbytes += nbytes
        while self.nbytes > self.max_bytes:
            self._evict(next(iter(self._entries.values())))

    def clear(self) -> None:
        self._entries.clear()
        self._by_prefix.clear()
        self.nbytes = 0

    def _evict(self, entry: _Entry) -> None:
        del self._entries[id(entry)]
        self.nbytes -= entry.nbytes
        for key in entry.keys:
            if self._by_prefix.get(key) is entry:
                del self._by_prefix[key]
