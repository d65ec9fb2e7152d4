"""Compaction of a trajectory's metadata: drop what only the provider needed, cap the logs.

A turn record from the engine can carry far more than training and analysis use: the
mixture-of-experts routing ids of every generated token in every layer (48 layers x top-8 x
32k tokens is 12M ints), the raw provider response, and unbounded sandbox logs. Session actors
keep them while a trajectory is assembled (routing replay needs the ids during a step); before a
trajectory is stored or shipped to the trainer, `Trajectory.compact()` applies the rules here.

The rules, applied at any depth of the metadata mapping (inside nested dicts and lists):
- a key in `DROPPED_KEYS` is removed with its value;
- the strings under a key in `LOG_KEYS` (directly, or inside lists and dicts under it) share a
  budget of `max_log_chars` per trajectory: every log shorter than the fair share is kept whole,
  the longer ones are cut to that share (the largest cap that fits the budget), keeping their head
  and tail and a marker saying how much was cut. Logs of a 100-turn trajectory cannot add up to
  more than the budget, and one huge log cannot crowd out the short ones;
- everything else is kept as is.
"""

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

DROPPED_KEYS = frozenset({"routed_experts", "raw_response"})
"""Metadata keys of bulky provider data; store per-turn routing ids and raw responses under these."""

LOG_KEYS = frozenset({"logs", "stdout", "stderr"})
"""Metadata keys whose string values are logs, which share the `max_log_chars` budget."""

DEFAULT_MAX_LOG_CHARS = 32_768
"""Log characters a compacted trajectory keeps by default, all its logs together."""


@dataclass(frozen=True, kw_only=True, slots=True)
class CompactionReport:
    """What one compaction did, measured on the serialised trajectory."""

    bytes_before: int
    bytes_after: int
    num_dropped: int
    # How many `DROPPED_KEYS` entries were removed.
    num_truncated: int
    # How many log strings were cut.

    @property
    def ratio(self) -> float:
        """bytes_before / bytes_after: how many times smaller the trajectory became."""
        return self.bytes_before / self.bytes_after


def compact_metadata(metadata: dict[str, Any], *, max_log_chars: int) -> tuple[dict[str, Any], int, int]:
    """A compacted copy of `metadata`, the number of dropped entries and of truncated logs.

    The input is not modified: dicts and lists are copied, the values in them shared.
    """
    if max_log_chars < 0:
        raise ValueError(f"max_log_chars must be >= 0 (got {max_log_chars}); use e.g. {DEFAULT_MAX_LOG_CHARS}")
    cap = log_cap(list(_log_lengths(metadata, in_log=False)), max_log_chars)
    counts = [0, 0]
    compacted = _walk(metadata, in_log=False, cap=cap, counts=counts)
    return compacted, counts[0], counts[1]


def log_cap(lengths: list[int], budget: int) -> int | None:
    """The largest per-log length such that all logs, each cut to it, fit `budget` (None: no cut)."""
    if sum(lengths) <= budget:
        return None
    remaining, count = budget, len(lengths)
    for length in sorted(lengths):
        share = remaining // count
        if length > share:
            return share
        remaining -= length
        count -= 1
    return None  # unreachable: the total exceeds the budget, so some log exceeds its share


def truncate_log(text: str, max_chars: int) -> str:
    """`text` cut to `max_chars` characters (plus a marker): the head and the tail, where errors usually are."""
    if len(text) <= max_chars:
        return text
    head = max_chars // 2
    tail = max_chars - head
    cut = len(text) - head - tail
    return f"{text[:head]}\n[... {cut} chars cut by compaction ...]\n{text[len(text) - tail:]}"


def _log_lengths(value: Any, *, in_log: bool) -> Iterator[int]:
    """Lengths of the log strings that compaction keeps (those not under a dropped key)."""
    if isinstance(value, dict):
        for key, item in value.items():
            if key not in DROPPED_KEYS:
                yield from _log_lengths(item, in_log=in_log or key in LOG_KEYS)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _log_lengths(item, in_log=in_log)
    elif in_log and isinstance(value, str):
        yield len(value)


def _walk(value: Any, *, in_log: bool, cap: int | None, counts: list[int]) -> Any:
    """A copy of `value` without `DROPPED_KEYS` and with logs longer than `cap` cut."""
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if key in DROPPED_KEYS:
                counts[0] += 1
                continue
            out[key] = _walk(item, in_log=in_log or key in LOG_KEYS, cap=cap, counts=counts)
        return out
    if isinstance(value, (list, tuple)):
        return [_walk(item, in_log=in_log, cap=cap, counts=counts) for item in value]
    if in_log and isinstance(value, str) and cap is not None and len(value) > cap:
        counts[1] += 1
        return truncate_log(value, cap)
    return value
