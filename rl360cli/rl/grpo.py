"""GRPO's learning signal: group-relative advantages, the clipped policy loss and KL estimators.

torch in, torch out. The formulas follow verl (volcengine/verl, `trainer/ppo/core_algos.py`) so
that results compare one to one; where rl360 differs it says so and why:
- a group of one gets advantage 0 (verl gives it r / (1 + eps): a sample with no baseline should
  not be pushed either way), and a group whose rewards are all equal gets exactly 0 even when
  float rounding makes r - mean a few ulps off zero;
- the sequence-mean aggregations count only sequences that have loss tokens, so padding rows do
  not change the loss;
- masked positions are selected out with `torch.where` before anything is computed from them, so
  their gradient is exactly zero even when the padding holds garbage (NaN, inf).

The loss is built from small pure functions, and `policy_loss` is their composition (a trainer
that needs another loss composes them itself):

    log_ratio = log_importance_ratio(logprobs, old_logprobs, mask); ratio = log_ratio.exp()
    pg = clipped_pg_losses(ratio, token_advantages, clip_low=..., clip_high=..., clip_c=...)
    tis = truncated_is_weights(old_logprobs, rollout_logprobs, mask, tis_cap=...)     # optional
    pg_loss = aggregate_loss(pg.losses * tis.weights, mask, aggregation, denominator=...)
    kl_loss = aggregate_loss(kl_penalty(logprobs, ref_logprobs, estimator, mask=mask), mask, ...)
    stats = loss_stats(mask, loss=..., pg_loss=..., kl_loss=..., ratio=..., log_ratio=..., pg=pg, tis=tis)

Settings (clip_low, aggregation, tis_cap, ...) are validated once, by `GRPOConfig` when the recipe
is loaded; these functions take them as given and check only their inputs (shapes, and that the
optional terms get the tensors they need). A mode outside the valid ones is a KeyError, never a
fallback to another mode.

Micro-batching: a loss split over micro-batches equals the whole batch's loss when every part is
divided by the whole batch's denominator; pass `denominator=micro_batch.loss_denominator(...)`.
"""

import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch

LOG_RATIO_CLAMP = 20.0
"""log(pi / pi_old) is clamped to +-20 before exp, as verl does: exp(20) is finite in float32."""

K3_CLAMP = 10.0
"""The k3 (low_var_kl) estimate is clamped to +-10 per token, as verl does."""


def group_advantages(
    rewards: torch.Tensor | Sequence[float],
    group_ids: torch.Tensor | np.ndarray | Sequence[Hashable],
    *,
    std_normalize: bool = True,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Each sample's reward relative to its group: (r - mean) / (std + eps), std unbiased (N - 1).

    `std_normalize=False` gives Dr. GRPO's r - mean. A group of one sample, or whose rewards are
    all equal, gets zeros. Statistics are computed in float64; the result has the rewards' dtype
    when they are a floating tensor, float32 otherwise.
    """
    if isinstance(rewards, torch.Tensor):
        out_dtype = rewards.dtype if rewards.is_floating_point() else torch.float32
        values = rewards.detach().to(torch.float64)
    else:
        out_dtype = torch.float32
        values = torch.as_tensor(rewards, dtype=torch.float64)
    if values.dim() != 1:
        raise ValueError(f"rewards must be one-dimensional (got shape {tuple(values.shape)})")
    if not torch.isfinite(values).all():
        raise ValueError("rewards must be finite; an attempt without a reward is an infra failure, masked before this")
    index, num_groups = _dense_group_index(group_ids, values.shape[0], values.device)
    if values.shape[0] == 0:
        return values.to(out_dtype)
    count = torch.zeros(num_groups, dtype=torch.float64, device=values.device)
    count.index_add_(0, index, torch.ones_like(values))
    total = torch.zeros_like(count).index_add_(0, index, values)
    centered = values - (total / count)[index]
    if std_normalize:
        # Two passes (mean, then squared deviations) rather than E[r^2] - E[r]^2, which cancels badly.
        squares = torch.zeros_like(count).index_add_(0, index, centered * centered)
        std = torch.sqrt(squares / (count - 1).clamp(min=1))
        advantages = centered / (std[index] + eps)
    else:
        advantages = centered
    high = torch.full_like(count, -math.inf).scatter_reduce(0, index, values, reduce="amax")
    low = torch.full_like(count, math.inf).scatter_reduce(0, index, values, reduce="amin")
    no_signal = (count < 2) | (high == low)
    advantages = torch.where(no_signal[index], torch.zeros_like(advantages), advantages)
    return advantages.to(out_dtype)


def kl_penalty(
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    estimator: str = "k3",
    *,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from the sampled tokens' logprobs; 0 off `mask` (bool).

    k1: log pi - log pi_ref. k2: half its square. k3 / low_var_kl (the same estimator): with
    d = log pi_ref - log pi clamped to +-20, exp(d) - d - 1, clamped to +-10 (Schulman, "Approximating
    KL divergence", 2020; verl's clamps).
    """
    log_ratio = logprobs - ref_logprobs
    if mask is not None:
        # Selected before the estimator's exp, so that garbage off the mask cannot reach the gradient.
        log_ratio = torch.where(mask, log_ratio, 0.0)
    return _KL_ESTIMATES[estimator](log_ratio)


def log_importance_ratio(logprobs: torch.Tensor, base_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log(pi / pi_base) per token, clamped to +-20 so that its exp is finite; 0 off `mask` (bool).

    No gradient flows into `base_logprobs` (the behaviour policy's, or the rollout engine's).
    """
    # Select before computing, so that garbage in masked positions cannot reach the gradient.
    log_ratio = torch.where(mask, logprobs - base_logprobs.detach(), 0.0)
    return log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


@dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class PGLosses:
    """Per-token clipped policy-gradient losses and where each clip acted, [B, T]."""

    losses: torch.Tensor
    # max(-A * ratio, -A * clamp(ratio, 1 - clip_low, 1 + clip_high)), bounded by the dual clip.
    clipped: torch.Tensor
    # bool: PPO clipping raised the token's loss (the clipped term won the max).
    dual_clipped: torch.Tensor
    # bool: the dual clip bounded the token's loss (all False without clip_c).


def clipped_pg_losses(
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
    clip_c: float | None = None,
) -> PGLosses:
    """PPO-clip token losses from the importance ratio and the per-token advantages (0 off the mask).

    loss = max(-A * ratio, -A * clamp(ratio, 1 - clip_low, 1 + clip_high)); with `clip_c`, a token
    with A < 0 is further bounded by -A * clip_c (dual clip, Ye et al. 2020), so that a huge ratio
    on a bad token cannot dominate the step.
    """
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    losses = torch.maximum(unclipped, clipped)
    dual_clipped = torch.zeros_like(losses, dtype=torch.bool)
    if clip_c is not None:
        bound = -advantages * clip_c
        negative = advantages < 0
        dual_clipped = negative & (losses > bound)
        losses = torch.where(negative, torch.minimum(losses, bound), losses)
    return PGLosses(losses=losses, clipped=clipped > unclipped, dual_clipped=dual_clipped)


@dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class TISWeights:
    """Truncated importance-sampling weights, [B, T], without gradient."""

    weights: torch.Tensor
    # min(exp(old - rollout), tis_cap); 1 off the mask.
    capped: torch.Tensor
    # bool: the weight hit tis_cap.


def truncated_is_weights(
    old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, mask: torch.Tensor, *, tis_cap: float
) -> TISWeights:
    """Each token's weight min(pi_old / pi_rollout, tis_cap), from log-probs with the +-20 clamp.

    For a trainer that recomputes `old_logprobs` with its own engine: the weight corrects for the
    rollout engine's probabilities differing slightly from the trainer's, and the cap bounds the
    variance the correction adds.
    """
    raw = torch.exp(log_importance_ratio(old_logprobs.detach(), rollout_logprobs, mask))
    return TISWeights(weights=raw.clamp(max=tis_cap), capped=raw > tis_cap)


def aggregate_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    aggregation: str = "token-mean",
    *,
    denominator: float | None = None,
    norm_tokens: int | None = None,
) -> torch.Tensor:
    """Token losses [B, T] to one scalar, with verl's meanings of the modes.

    - token-mean: sum of all loss tokens / number of loss tokens.
    - seq-mean-token-mean: mean over sequences of each sequence's token mean.
    - seq-mean-token-sum: mean over sequences of each sequence's token sum.
    - seq-mean-token-sum-norm: sum of all loss tokens / `norm_tokens` (Dr. GRPO's constant),
      which defaults to the padded width T as in verl.
    Sequence means count only sequences with at least one loss token. `denominator` replaces the
    divisor (the loss-token count, the sequence count or norm_tokens): pass the whole batch's
    when summing micro-batch losses.
    """
    _check_shapes("loss_mat", loss_mat, loss_mask=loss_mask)
    mask = _bool_mask(loss_mask)
    selected = torch.where(mask, loss_mat, 0.0)
    tokens_per_seq = mask.sum(dim=-1)
    total = _AGGREGATED_SUMS[aggregation](selected, tokens_per_seq)
    if denominator is None:
        # No loss tokens at all: the sum is zero and so is the loss (the divisor is at least 1).
        return total / aggregation_divisor(
            aggregation,
            num_loss_tokens=mask.sum(),
            num_loss_seqs=(tokens_per_seq > 0).sum(),
            width=loss_mask.shape[-1],
            norm_tokens=norm_tokens,
        )
    if not denominator > 0:
        raise ValueError(f"denominator must be > 0 (got {denominator}); pass the whole batch's loss_denominator()")
    return total / denominator


def aggregation_divisor(
    aggregation: str,
    *,
    num_loss_tokens: int | torch.Tensor,
    num_loss_seqs: int | torch.Tensor,
    width: int,
    norm_tokens: int | None = None,
) -> int:
    """What `aggregate_loss` divides the summed token losses by under `aggregation`, at least 1.

    `num_loss_seqs` counts sequences with at least one loss token; `width` is the padded width,
    the divisor of seq-mean-token-sum-norm without `norm_tokens`. Counts may be 0-d tensors: only
    the one the mode needs is copied to the host.
    """
    divisors = {
        "token-mean": num_loss_tokens,
        "seq-mean-token-mean": num_loss_seqs,
        "seq-mean-token-sum": num_loss_seqs,
        "seq-mean-token-sum-norm": width if norm_tokens is None else norm_tokens,
    }
    return max(int(divisors[aggregation]), 1)


@dataclass(frozen=True, kw_only=True, slots=True)
class LossStats:
    """Statistics of one `policy_loss` call, as floats; token means are over its loss tokens."""

    loss: float
    # The returned loss: pg_loss + kl_coef * kl_loss.
    pg_loss: float
    # The clipped policy-gradient term.
    kl_loss: float
    # The aggregated KL-to-reference estimate (0 without a reference).
    clip_frac: float
    # Fraction of tokens where PPO clipping changed the loss.
    clip_frac_lower: float
    # Fraction of tokens where the dual clip (clip_c) bounded a negative-advantage loss.
    ratio_mean: float
    # Mean importance ratio pi / pi_old.
    approx_kl: float
    # KL(pi_old || pi) by the k3 estimator: mean of (ratio - 1) - log ratio, >= 0.
    tis_weight_mean: float
    # Mean truncated importance weight (1 without TIS).
    tis_clip_frac: float
    # Fraction of tokens whose importance weight hit tis_cap.
    num_tokens: int
    # Loss tokens in this call.


def loss_stats(
    mask: torch.Tensor,
    *,
    loss: torch.Tensor,
    pg_loss: torch.Tensor,
    kl_loss: torch.Tensor,
    ratio: torch.Tensor,
    log_ratio: torch.Tensor,
    pg: PGLosses,
    tis: TISWeights | None = None,
) -> LossStats:
    """The `LossStats` of one loss, with one device-to-host copy for all the figures, not one per figure."""
    with torch.no_grad():
        num_tokens = mask.sum()

        def token_mean(values: torch.Tensor) -> torch.Tensor:
            # float64, so that bfloat16 logprobs still give exact counts and fractions.
            return torch.where(mask, values.double(), 0.0).sum() / num_tokens.clamp(min=1)

        scalars = {"loss": loss, "pg_loss": pg_loss, "kl_loss": kl_loss}
        token_values = {
            "clip_frac": pg.clipped,
            "clip_frac_lower": pg.dual_clipped,
            "ratio_mean": ratio,
            "approx_kl": ratio - 1.0 - log_ratio,
            "tis_weight_mean": torch.ones_like(ratio) if tis is None else tis.weights,
            "tis_clip_frac": torch.zeros_like(mask) if tis is None else tis.capped,
        }
        figures = torch.stack(
            [
                *(value.detach().double() for value in scalars.values()),
                *(token_mean(values) for values in token_values.values()),
                num_tokens.double(),
            ]
        ).tolist()
    return LossStats(**dict(zip([*scalars, *token_values], figures)), num_tokens=int(figures[-1]))


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor | Sequence[float],
    loss_mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    clip_c: float | None = None,
    aggregation: str = "token-mean",
    denominator: float | None = None,
    norm_tokens: int | None = None,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    kl_estimator: str = "k3",
    rollout_logprobs: torch.Tensor | None = None,
    tis_cap: float | None = None,
) -> tuple[torch.Tensor, LossStats]:
    """The PPO-clip policy loss of GRPO, and its statistics.

    Shapes: `logprobs` (with grad), `old_logprobs`, `loss_mask` and the optional logprobs are
    [B, T], aligned so that position t scores the same token in all of them; `advantages` is [B]
    (one per sequence, broadcast) or [B, T]. The other inputs are moved to `logprobs`' device.
    The settings are taken as given: `GRPOConfig` validated them (pass `**config.loss_kwargs()`).

    Per token, with ratio = exp(clamp(logprobs - old_logprobs, -20, 20)) and advantage A:
    loss = max(-A * ratio, -A * clamp(ratio, 1 - clip_low, 1 + clip_high)); with `clip_c`, a token
    with A < 0 is further bounded by -A * clip_c (dual clip). Token losses are aggregated by
    `aggregate_loss` (`aggregation`, `denominator`, `norm_tokens`).

    KL: with `kl_coef` > 0, `ref_logprobs` is required and kl_coef * the aggregated
    `kl_penalty(logprobs, ref_logprobs, kl_estimator)` is added.

    Truncated importance sampling: when the trainer recomputes `old_logprobs` with its own
    engine, pass the engine's `rollout_logprobs` and `tis_cap`; each token's loss is weighted by
    min(exp(old_logprobs - rollout_logprobs), tis_cap), without gradient.
    """
    _check_shapes(
        "logprobs", logprobs, old_logprobs=old_logprobs, loss_mask=loss_mask,
        ref_logprobs=ref_logprobs, rollout_logprobs=rollout_logprobs,
    )  # fmt: skip
    _check_optional_terms(kl_coef, ref_logprobs, tis_cap, rollout_logprobs)
    # Batches are built on the host; the logprobs come from the model, wherever it runs.
    device = logprobs.device
    mask = _bool_mask(loss_mask.to(device))
    old_logprobs = old_logprobs.to(device)
    token_advantages = _token_advantages(advantages, mask, dtype=logprobs.dtype)
    log_ratio = log_importance_ratio(logprobs, old_logprobs, mask)
    ratio = torch.exp(log_ratio)
    pg = clipped_pg_losses(ratio, token_advantages, clip_low=clip_low, clip_high=clip_high, clip_c=clip_c)
    token_losses = pg.losses
    tis = None
    if tis_cap is not None:
        tis = truncated_is_weights(old_logprobs, rollout_logprobs.to(device), mask, tis_cap=tis_cap)
        token_losses = token_losses * tis.weights
    aggregate = partial(
        aggregate_loss, loss_mask=mask, aggregation=aggregation, denominator=denominator, norm_tokens=norm_tokens
    )
    pg_loss = aggregate(token_losses)
    kl_loss = torch.zeros((), dtype=logprobs.dtype, device=device)
    # `!= 0` rather than `> 0`: GRPOConfig keeps kl_coef >= 0, and a weight given directly is
    # applied as given, never silently dropped.
    if kl_coef != 0:
        kl_loss = aggregate(kl_penalty(logprobs, ref_logprobs.to(device).detach(), kl_estimator, mask=mask))
    loss = pg_loss + kl_coef * kl_loss
    stats = loss_stats(
        mask, loss=loss, pg_loss=pg_loss, kl_loss=kl_loss, ratio=ratio, log_ratio=log_ratio, pg=pg, tis=tis
    )
    return loss, stats


def _k1(log_ratio: torch.Tensor) -> torch.Tensor:
    return log_ratio


def _k2(log_ratio: torch.Tensor) -> torch.Tensor:
    return 0.5 * log_ratio.square()


def _k3(log_ratio: torch.Tensor) -> torch.Tensor:
    d = (-log_ratio).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return (torch.exp(d) - d - 1.0).clamp(-K3_CLAMP, K3_CLAMP)


_KL_ESTIMATES: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "k1": _k1,
    "k2": _k2,
    "k3": _k3,
    "low_var_kl": _k3,
}
"""KL estimate per token from log_ratio = log pi - log pi_ref, by estimator (config.KL_ESTIMATORS)."""


def _sum_of_token_losses(selected: torch.Tensor, tokens_per_seq: torch.Tensor) -> torch.Tensor:
    return selected.sum()


def _sum_of_sequence_token_means(selected: torch.Tensor, tokens_per_seq: torch.Tensor) -> torch.Tensor:
    return (selected.sum(dim=-1) / tokens_per_seq.clamp(min=1)).sum()


_AGGREGATED_SUMS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "token-mean": _sum_of_token_losses,
    "seq-mean-token-mean": _sum_of_sequence_token_means,
    "seq-mean-token-sum": _sum_of_token_losses,
    "seq-mean-token-sum-norm": _sum_of_token_losses,
}
"""What each aggregation (config.AGGREGATIONS) sums before `aggregation_divisor` divides it."""


def _bool_mask(loss_mask: torch.Tensor) -> torch.Tensor:
    return loss_mask if loss_mask.dtype == torch.bool else loss_mask > 0


def _token_advantages(
    advantages: torch.Tensor | Sequence[float], mask: torch.Tensor, *, dtype: torch.dtype
) -> torch.Tensor:
    """Advantages [B] (broadcast over tokens) or [B, T] as [B, T], 0 off the mask, without gradient."""
    adv = torch.as_tensor(advantages, dtype=dtype, device=mask.device).detach()
    if adv.dim() == 1:
        if adv.shape[0] != mask.shape[0]:
            raise ValueError(f"advantages [B] must have B={mask.shape[0]} entries (got {adv.shape[0]})")
        adv = adv[:, None].expand(mask.shape)
    elif adv.shape != mask.shape:
        raise ValueError(f"advantages must be [B] or {tuple(mask.shape)} (got {tuple(adv.shape)})")
    return torch.where(mask, adv, 0.0)


def _check_shapes(name: str, tensor: torch.Tensor, **aligned: torch.Tensor | None) -> None:
    """`tensor` is [batch, tokens] and each of the `aligned` tensors that is given has its shape."""
    if tensor.dim() != 2:
        raise ValueError(f"{name} must be [batch, tokens] (got shape {tuple(tensor.shape)})")
    for other, value in aligned.items():
        if value is not None and value.shape != tensor.shape:
            raise ValueError(
                f"{other} must have the shape of {name} {tuple(tensor.shape)} (got {tuple(value.shape)})"
            )


def _check_optional_terms(
    kl_coef: float, ref_logprobs: torch.Tensor | None, tis_cap: float | None, rollout_logprobs: torch.Tensor | None
) -> None:
    """The KL term and truncated importance sampling get the tensors they need."""
    if kl_coef != 0 and ref_logprobs is None:
        raise ValueError(
            f"kl_coef > 0 needs ref_logprobs (got kl_coef={kl_coef}); pass the reference policy's logprobs"
        )
    if (tis_cap is None) != (rollout_logprobs is None):
        raise ValueError(
            "truncated importance sampling needs both rollout_logprobs and tis_cap; pass both "
            "(when the trainer recomputes old_logprobs) or neither"
        )


def _dense_group_index(
    group_ids: torch.Tensor | np.ndarray | Sequence[Hashable], n: int, device: torch.device
) -> tuple[torch.Tensor, int]:
    """Group ids as dense indices 0..G-1 (first-seen order for sequences) and G."""
    if isinstance(group_ids, torch.Tensor):
        if group_ids.dim() != 1 or group_ids.shape[0] != n:
            raise ValueError(f"group_ids must be one id per reward ({n}), got shape {tuple(group_ids.shape)}")
        uniques, index = torch.unique(group_ids, return_inverse=True)
        return index.to(device), int(uniques.shape[0])
    if isinstance(group_ids, np.ndarray) and group_ids.dtype != object:
        if group_ids.shape != (n,):
            raise ValueError(f"group_ids must be one id per reward ({n}), got shape {group_ids.shape}")
        uniques, index = np.unique(group_ids, return_inverse=True)
        return torch.from_numpy(index.astype(np.int64)).to(device), int(uniques.shape[0])
    ids = list(group_ids)
    if len(ids) != n:
        raise ValueError(f"group_ids must be one id per reward ({n}), got {len(ids)}")
    dense: dict[Hashable, int] = {}
    index = [dense.setdefault(group, len(dense)) for group in ids]
    return torch.tensor(index, dtype=torch.long, device=device), len(dense)
