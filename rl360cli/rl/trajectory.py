"""`Trajectory`: one task attempt, as the trainer and the analysis tools see it.

A trajectory holds the token ids of the whole multi-turn conversation (prompt, generated turns and
the observations between them), a loss mask that is 1 exactly on the tokens the policy generated,
the behaviour policy's logprob of every token (0.0 where the mask is 0), the policy version that
generated each turn, the reward and how the attempt ended (`Outcome`, with an `InfraCause` for
infrastructure failures), timings per phase and free-form metadata.

Storage. The three per-token sequences are stored as read-only numpy arrays (token_ids int32,
loss_mask uint8, logprobs float32), whatever sequence the constructor was given: a step of 8,192
trajectories of 2k-8k tokens is 40M tokens, and turning Python lists into tensors at that scale
costs seconds in the trainer, while the conversion here happens once, in the session actor that
assembles the trajectory. Arrays passed in are viewed, not copied. Index, slice and `len()` work
as on lists; note that `+` adds element-wise, so use `.tolist()` to get a list.

Versions are per turn (`versions[i]` generated turn i); staleness uses the oldest, `policy_version`.

Serialisation (`to_bytes`/`from_bytes`) is msgpack with a schema version; a newer schema is refused
with an error naming the fix. The per-token arrays travel as raw little-endian bytes, the loss mask
as bits and the logprobs only for generated tokens, so a round trip is exact and compact. Metadata
must hold msgpack types (str, bytes, int, float, bool, None, lists and str-keyed dicts); tuples come
back as lists. Compaction (dropping bulky provider metadata) is described in
`rl360cli.rl.compaction`.
"""

import dataclasses
import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Sequence

import msgpack
import numpy as np

from rl360cli.rl.compaction import DEFAULT_MAX_LOG_CHARS, CompactionReport, compact_metadata
from rl360cli.outcome import InfraCause, Outcome

SCHEMA_VERSION = 2
"""The serialisation schema this code writes and the newest it reads (2 adds `segment`; 1 reads as segment 0)."""

_INT32_MAX = np.iinfo(np.int32).max
_FIELDS = tuple(
    "task_id group_id sample_index token_ids loss_mask logprobs versions num_prompt_tokens reward outcome cause "
    "timings metadata segment".split()
)


@dataclass(frozen=True, kw_only=True, slots=True, eq=False, repr=False)
class Trajectory:
    """One task attempt: the conversation's tokens, what to train on, the reward and the outcome."""

    task_id: str
    # The task (a Harbor task folder name or dataset id).
    group_id: str
    # The prompt's uid: the samples of one prompt form the group GRPO normalises within.
    sample_index: int
    # This sample's index within its group (unique per group).
    token_ids: np.ndarray
    # Every token of the conversation, int32 [num_tokens].
    loss_mask: np.ndarray
    # 1 on tokens the policy generated, 0 on prompt and observation tokens, uint8 [num_tokens].
    logprobs: np.ndarray
    # The behaviour policy's logprob of each generated token, 0.0 elsewhere, float32 [num_tokens].
    versions: tuple[int, ...]
    # Policy version that generated each turn, in turn order (empty only for infra failures).
    num_prompt_tokens: int
    # Length of the initial prompt; its tokens are never trained on.
    reward: float | None
    # The verifier's reward; required unless the outcome is infra_failure.
    outcome: Outcome
    # How the attempt ended.
    cause: InfraCause | None = None
    # Why infrastructure failed; set exactly when outcome is infra_failure.
    timings: dict[str, float] = field(default_factory=dict)
    # Seconds per phase: the attempt's (start, agent, upload_tests, verify, reward, stop, total) and generate.
    metadata: dict[str, Any] = field(default_factory=dict)
    # Anything else (per-turn provider data, logs, sandbox placement); see compaction for the rules.
    segment: int = 0
    # Which segment of its session this is: a harness that rewrote its conversation's history starts a new
    # one (rl360cli/agent/session_record.py). The segments of a session share its reward and count once in
    # their group's statistics (rl/batch.py).

    def __post_init__(self) -> None:
        where = f"trajectory {self.task_id!r} group {self.group_id!r} sample {self.sample_index!r}"
        if not isinstance(self.task_id, str) or not isinstance(self.group_id, str):
            raise ValueError(f"{where}: task_id and group_id must be strings")
        if not _is_int(self.segment) or self.segment < 0:
            raise ValueError(f"{where}: segment must be an integer >= 0 (got {self.segment!r})")
        if not _is_int(self.sample_index) or self.sample_index < 0:
            raise ValueError(f"{where}: sample_index must be an integer >= 0 (got {self.sample_index!r})")
        outcome = _coerce_enum(Outcome, self.outcome, "outcome", where)
        cause = None if self.cause is None else _coerce_enum(InfraCause, self.cause, "cause", where)
        if (outcome is Outcome.INFRA_FAILURE) != (cause is not None):
            raise ValueError(
                f"{where}: cause must be set exactly when outcome is infra_failure "
                f"(got outcome={outcome.value}, cause={cause}); pass an InfraCause for infra failures only"
            )
        reward = self.reward
        if reward is not None:
            if isinstance(reward, bool) or not isinstance(reward, numbers.Real) or not math.isfinite(reward):
                raise ValueError(f"{where}: reward must be a finite number or None (got {reward!r})")
            reward = float(reward)
        elif outcome is not Outcome.INFRA_FAILURE:
            raise ValueError(
                f"{where}: reward is None but outcome is {outcome.value}; an attempt the verifier judged "
                "needs its reward, and an attempt without one is an infra_failure with a cause"
            )
        token_ids = _token_array(self.token_ids, where)
        n = token_ids.shape[0]
        loss_mask = _mask_array(self.loss_mask, n, where)
        logprobs = _logprob_array(self.logprobs, loss_mask, n, where)
        if not _is_int(self.num_prompt_tokens) or not (min(n, 1) <= self.num_prompt_tokens <= n):
            raise ValueError(
                f"{where}: num_prompt_tokens must be in [{min(n, 1)}, {n}] (got {self.num_prompt_tokens!r}); "
                "the first token is always prompt, since nothing predicts it"
            )
        if loss_mask[: self.num_prompt_tokens].any():
            raise ValueError(f"{where}: loss_mask is 1 inside the prompt; prompt tokens are never trained on")
        if n == 0 and outcome is not Outcome.INFRA_FAILURE:
            raise ValueError(f"{where}: token_ids is empty; only an infra failure may have no tokens")
        versions = tuple(self.versions)
        if not all(_is_int(v) and v >= 0 for v in versions):
            raise ValueError(f"{where}: versions must be integers >= 0, one per turn (got {list(versions)})")
        if not versions and outcome is not Outcome.INFRA_FAILURE:
            raise ValueError(f"{where}: versions is empty; give the policy version of each generated turn")
        # numpy integers are accepted but stored as int, which msgpack and json both take.
        normalised = {
            "outcome": outcome,
            "cause": cause,
            "reward": reward,
            "token_ids": token_ids,
            "loss_mask": loss_mask,
            "logprobs": logprobs,
            "versions": tuple(int(v) for v in versions),
            "sample_index": int(self.sample_index),
            "segment": int(self.segment),
            "num_prompt_tokens": int(self.num_prompt_tokens),
        }
        for name, value in normalised.items():
            object.__setattr__(self, name, value)

    @property
    def num_tokens(self) -> int:
        return int(self.token_ids.shape[0])

    @property
    def num_generated_tokens(self) -> int:
        """How many tokens the policy generated (the loss mask's ones)."""
        return int(np.count_nonzero(self.loss_mask))

    @property
    def policy_version(self) -> int | None:
        """The oldest policy version that generated a turn: what staleness is measured from."""
        return min(self.versions) if self.versions else None

    @property
    def is_valid(self) -> bool:
        """Whether the attempt enters group statistics and the loss (no infra failure, has a reward)."""
        return self.outcome is not Outcome.INFRA_FAILURE and self.reward is not None

    def to_bytes(self) -> bytes:
        """This trajectory as msgpack bytes, schema `SCHEMA_VERSION`."""
        generated = self.loss_mask.view(bool)
        payload = {
            "schema": SCHEMA_VERSION,
            "task_id": self.task_id,
            "group_id": self.group_id,
            "sample_index": self.sample_index,
            "num_tokens": self.num_tokens,
            "token_ids": self.token_ids.astype("<i4", copy=False).tobytes(),
            "loss_mask": np.packbits(self.loss_mask).tobytes(),
            # Logprobs are 0.0 off the mask by construction; only the generated ones carry information.
            "logprobs": self.logprobs[generated].astype("<f4", copy=False).tobytes(),
            "versions": list(self.versions),
            "num_prompt_tokens": self.num_prompt_tokens,
            "reward": self.reward,
            "outcome": self.outcome.value,
            "cause": None if self.cause is None else self.cause.value,
            "timings": self.timings,
            "metadata": self.metadata,
            "segment": self.segment,
        }
        try:
            return msgpack.packb(payload, use_bin_type=True)
        except (TypeError, ValueError, OverflowError) as err:
            raise ValueError(
                f"trajectory {self.task_id!r} group {self.group_id!r} sample {self.sample_index}: "
                f"timings or metadata hold a value msgpack cannot store ({err}); keep to str, bytes, "
                "int, float, bool, None, lists and str-keyed dicts (numpy arrays as .tobytes() or .tolist())"
            ) from None

    @classmethod
    def from_bytes(cls, data: bytes) -> "Trajectory":
        """The trajectory `to_bytes` wrote; refuses a schema newer than `SCHEMA_VERSION`."""
        try:
            payload = msgpack.unpackb(data, raw=False, strict_map_key=False)
        except (msgpack.UnpackException, ValueError, TypeError) as err:
            raise ValueError(f"not a serialised trajectory ({err})") from None
        if not isinstance(payload, dict) or not _is_int(payload.get("schema")):
            raise ValueError("not a serialised trajectory (no schema version)")
        schema = payload["schema"]
        if schema > SCHEMA_VERSION:
            raise ValueError(
                f"trajectory schema {schema} is newer than this rl360 reads ({SCHEMA_VERSION}); "
                "upgrade rl360 where the trajectories are read"
            )
        if schema < 1:
            raise ValueError(f"trajectory schema {schema} is not a valid schema version")
        payload.setdefault("segment", 0)  # schema 1: one segment per session
        missing = [key for key in (*_FIELDS, "num_tokens") if key not in payload]
        if missing:
            raise ValueError(f"serialised trajectory lacks {', '.join(missing)}; the writer is broken")
        n = payload["num_tokens"]
        loss_mask = np.unpackbits(np.frombuffer(payload["loss_mask"], dtype=np.uint8), count=n)
        logprobs = np.zeros(n, dtype=np.float32)
        logprobs[loss_mask.view(bool)] = np.frombuffer(payload["logprobs"], dtype="<f4")
        cause = payload["cause"]
        return cls(
            task_id=payload["task_id"],
            group_id=payload["group_id"],
            sample_index=payload["sample_index"],
            token_ids=np.frombuffer(payload["token_ids"], dtype="<i4").astype(np.int32, copy=False),
            loss_mask=loss_mask,
            logprobs=logprobs,
            versions=tuple(payload["versions"]),
            num_prompt_tokens=payload["num_prompt_tokens"],
            reward=payload["reward"],
            outcome=Outcome(payload["outcome"]),
            cause=None if cause is None else InfraCause(cause),
            timings=payload["timings"],
            metadata=payload["metadata"],
            segment=payload["segment"],
        )

    def compact(self, *, max_log_chars: int = DEFAULT_MAX_LOG_CHARS) -> tuple["Trajectory", CompactionReport]:
        """A compacted copy (this one is left unchanged) and what compaction saved.

        Drops routing ids and raw provider responses and cuts the logs to share `max_log_chars`
        characters (rules in `rl360cli.rl.compaction`); tokens, mask, logprobs, versions, reward,
        outcome, timings and the rest of the metadata are kept, so training and analysis see the
        same trajectory.
        """
        metadata, num_dropped, num_truncated = compact_metadata(self.metadata, max_log_chars=max_log_chars)
        compacted = dataclasses.replace(self, metadata=metadata)
        report = CompactionReport(
            bytes_before=len(self.to_bytes()),
            bytes_after=len(compacted.to_bytes()),
            num_dropped=num_dropped,
            num_truncated=num_truncated,
        )
        return compacted, report

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Trajectory):
            return NotImplemented
        return all(
            np.array_equal(getattr(self, name), getattr(other, name))
            if name in ("token_ids", "loss_mask", "logprobs")
            else getattr(self, name) == getattr(other, name)
            for name in _FIELDS
        )

    def __repr__(self) -> str:
        # The default repr would print the metadata, which can hold megabytes of provider data.
        cause = f", cause={self.cause.value}" if self.cause is not None else ""
        return (
            f"Trajectory(task_id={self.task_id!r}, group_id={self.group_id!r}, sample_index={self.sample_index}, "
            f"{f'segment={self.segment}, ' if self.segment else ''}"
            f"num_tokens={self.num_tokens}, num_generated_tokens={self.num_generated_tokens}, "
            f"versions={list(self.versions)}, reward={self.reward}, outcome={self.outcome.value}{cause})"
        )


def _is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _coerce_enum(enum_cls, value, name: str, where: str):
    try:
        return enum_cls(value)
    except ValueError:
        valid = ", ".join(member.value for member in enum_cls)
        raise ValueError(f"{where}: {name} must be one of {valid} (got {value!r})") from None


def _readonly(array: np.ndarray) -> np.ndarray:
    view = array.view()
    view.setflags(write=False)
    return view


def _token_array(values: Sequence[int] | np.ndarray, where: str) -> np.ndarray:
    array = np.asarray(values)
    if array.ndim != 1:
        raise ValueError(f"{where}: token_ids must be one-dimensional (got shape {array.shape})")
    if array.size == 0:
        return _readonly(np.zeros(0, dtype=np.int32))
    if array.dtype.kind not in "iu":
        raise ValueError(f"{where}: token_ids must be integers (got dtype {array.dtype})")
    if array.dtype != np.int32 and (array.max() > _INT32_MAX):
        raise ValueError(f"{where}: token id {int(array.max())} does not fit in int32")
    if array.min() < 0:
        raise ValueError(f"{where}: token ids must be >= 0 (got {int(array.min())})")
    return _readonly(array.astype(np.int32, copy=False))


def _mask_array(values: Sequence[int] | np.ndarray, n: int, where: str) -> np.ndarray:
    array = np.asarray(values)
    if array.shape != (n,):
        raise ValueError(f"{where}: loss_mask must have one entry per token ({n}), got shape {array.shape}")
    if array.dtype == np.bool_:
        return _readonly(array.view(np.uint8))
    if n and array.dtype.kind not in "iuf":
        raise ValueError(f"{where}: loss_mask must hold 0 and 1 (got dtype {array.dtype})")
    if n and not np.all((array == 0) | (array == 1)):
        raise ValueError(f"{where}: loss_mask must hold only 0 and 1")
    return _readonly(array.astype(np.uint8, copy=False))


def _logprob_array(values: Sequence[float] | np.ndarray, loss_mask: np.ndarray, n: int, where: str) -> np.ndarray:
    array = np.asarray(values, dtype=np.float32)
    if array.shape != (n,):
        raise ValueError(f"{where}: logprobs must have one entry per token ({n}), got shape {array.shape}")
    generated = loss_mask.view(bool)
    if not np.isfinite(array[generated]).all():
        raise ValueError(
            f"{where}: a generated token's logprob is not finite (NaN, inf or None); the engine returned a bad logprob"
        )
    if array[~generated].any():
        raise ValueError(f"{where}: logprobs must be 0.0 where loss_mask is 0 (prompt and observation tokens)")
    return _readonly(array)
