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

Micro-batching: a loss split over micro-batches equals the whole batch's loss when every part is
divided by the whole batch's denominator; pass `denominator=micro_batch.loss_denominator(...)`.
"""

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from rl360cli.rl.config import AGGREGATIONS, KL_ESTIMATORS

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
    if eps < 0:
        raise ValueError(f"eps must be >= 0 (got {eps})")
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


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from the sampled tokens' logprobs.

    k1: log pi - log pi_ref. k2: half its square. k3 / low_var_kl (the same estimator): with
    d = log pi_ref - log pi clamped to +-20, exp(d) - d - 1, clamped to +-10 (Schulman, "Approximating
    KL divergence", 2020; verl's clamps).
    """
    return _kl_from_log_ratio(logprobs - ref_logprobs, estimator)


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
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {', '.join(AGGREGATIONS)} (got {aggregation!r})")
    if loss_mat.dim() != 2 or loss_mat.shape != loss_mask.shape:
        raise ValueError(
            "loss_mat and loss_mask must both be [batch, tokens] "
            f"(got {tuple(loss_mat.shape)} and {tuple(loss_mask.shape)})"
        )
    mask = loss_mask if loss_mask.dtype == torch.bool else loss_mask > 0
    selected = torch.where(mask, loss_mat, torch.zeros_like(loss_mat))
    tokens_per_seq = mask.sum(dim=-1)
    if aggregation == "seq-mean-token-mean":
        total = (selected.sum(dim=-1) / tokens_per_seq.clamp(min=1)).sum()
    else:
        total = selected.sum()
    if denominator is None:
        if aggregation == "token-mean":
            divisor = mask.sum()
        elif aggregation == "seq-mean-token-sum-norm":
            divisor = norm_tokens if norm_tokens is not None else loss_mask.shape[-1]
        else:
            divisor = (tokens_per_seq > 0).sum()
        # No loss tokens at all: the sum is zero and so is the loss.
        return total / max(int(divisor), 1)
    if not denominator > 0:
        raise ValueError(f"denominator must be > 0 (got {denominator}); pass the whole batch's loss_denominator()")
    return total / denominator


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
    if logprobs.dim() != 2:
        raise ValueError(f"logprobs must be [batch, tokens] (got shape {tuple(logprobs.shape)})")
    others = {"old_logprobs": old_logprobs, "loss_mask": loss_mask, "ref_logprobs": ref_logprobs}
    others["rollout_logprobs"] = rollout_logprobs
    for name, tensor in others.items():
        if tensor is not None and tensor.shape != logprobs.shape:
            raise ValueError(
                f"{name} must have the shape of logprobs {tuple(logprobs.shape)} (got {tuple(tensor.shape)})"
            )
    if not (0.0 <= clip_low < 1.0 and clip_high >= 0.0):
        raise ValueError(f"clip_low must be in [0, 1) and clip_high >= 0 (got {clip_low}, {clip_high})")
    if clip_c is not None and not clip_c > 1.0:
        raise ValueError(f"clip_c must be > 1 (got {clip_c}); use e.g. 3.0, or None to disable dual clip")
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {', '.join(AGGREGATIONS)} (got {aggregation!r})")
    if kl_estimator not in KL_ESTIMATORS:
        raise ValueError(f"kl_estimator must be one of {', '.join(KL_ESTIMATORS)} (got {kl_estimator!r})")
    if kl_coef < 0 or (kl_coef > 0 and ref_logprobs is None):
        raise ValueError(
            f"kl_coef > 0 needs ref_logprobs (got kl_coef={kl_coef}); pass the reference policy's logprobs"
        )
    if (tis_cap is None) != (rollout_logprobs is None):
        raise ValueError(
            "truncated importance sampling needs both rollout_logprobs and tis_cap; pass both "
            "(when the trainer recomputes old_logprobs) or neither"
        )
    if tis_cap is not None and not tis_cap > 0:
        raise ValueError(f"tis_cap must be > 0 (got {tis_cap})")

    # Batches are built on the host; the logprobs come from the model, wherever it runs.
    device = logprobs.device
    old_logprobs = old_logprobs.to(device)
    loss_mask = loss_mask.to(device)
    ref_logprobs = None if ref_logprobs is None else ref_logprobs.to(device)
    rollout_logprobs = None if rollout_logprobs is None else rollout_logprobs.to(device)
    mask = loss_mask if loss_mask.dtype == torch.bool else loss_mask > 0
    zeros = torch.zeros_like(logprobs)
    adv = torch.as_tensor(advantages, dtype=logprobs.dtype, device=device).detach()
    if adv.dim() == 1:
        if adv.shape[0] != logprobs.shape[0]:
            raise ValueError(f"advantages [B] must have B={logprobs.shape[0]} entries (got {adv.shape[0]})")
        adv = adv[:, None].expand_as(logprobs)
    elif adv.shape != logprobs.shape:
        raise ValueError(f"advantages must be [B] or {tuple(logprobs.shape)} (got {tuple(adv.shape)})")
    adv = torch.where(mask, adv, zeros)

    # Select before computing, so that garbage in masked positions cannot reach the gradient.
    log_ratio = torch.where(mask, logprobs - old_logprobs.detach(), zeros).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    pg_unclipped = -adv * ratio
    pg_clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    pg_losses = torch.maximum(pg_unclipped, pg_clipped)
    dual_clipped = torch.zeros_like(mask)
    if clip_c is not None:
        bound = -adv * clip_c
        dual_clipped = (adv < 0) & (pg_losses > bound)
        pg_losses = torch.where(adv < 0, torch.minimum(pg_losses, bound), pg_losses)

    tis_weight = torch.ones_like(logprobs)
    tis_capped = torch.zeros_like(mask)
    if tis_cap is not None:
        log_w = torch.where(mask, old_logprobs - rollout_logprobs, zeros).detach()
        log_w = log_w.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        raw_weight = torch.exp(log_w)
        tis_capped = raw_weight > tis_cap
        tis_weight = raw_weight.clamp(max=tis_cap)
        pg_losses = pg_losses * tis_weight

    pg_loss = aggregate_loss(pg_losses, mask, aggregation, denominator=denominator, norm_tokens=norm_tokens)
    kl_loss = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    if kl_coef > 0:
        kl_mat = _kl_from_log_ratio(torch.where(mask, logprobs - ref_logprobs.detach(), zeros), kl_estimator)
        kl_loss = aggregate_loss(kl_mat, mask, aggregation, denominator=denominator, norm_tokens=norm_tokens)
    loss = pg_loss + kl_coef * kl_loss

    with torch.no_grad():
        num_tokens = mask.sum()

        def token_mean(values: torch.Tensor) -> torch.Tensor:
            # float64, so that bfloat16 logprobs still give exact counts and fractions.
            return torch.where(mask, values.double(), 0.0).sum() / num_tokens.clamp(min=1)

        # One device-to-host copy for all the figures, not one per figure.
        figures = torch.stack(
            [
                loss.detach().double(),
                pg_loss.detach().double(),
                kl_loss.detach().double(),
                token_mean(pg_clipped > pg_unclipped),
                token_mean(dual_clipped),
                token_mean(ratio),
                token_mean(ratio - 1.0 - log_ratio),
                token_mean(tis_weight),
                token_mean(tis_capped),
                num_tokens.double(),
            ]
        ).tolist()
    stats = LossStats(
        loss=figures[0],
        pg_loss=figures[1],
        kl_loss=figures[2],
        clip_frac=figures[3],
        clip_frac_lower=figures[4],
        ratio_mean=figures[5],
        approx_kl=figures[6],
        tis_weight_mean=figures[7],
        tis_clip_frac=figures[8],
        num_tokens=int(figures[9]),
    )
    return loss, stats


def _kl_from_log_ratio(log_ratio: torch.Tensor, estimator: str) -> torch.Tensor:
    """KL estimate per token from log_ratio = log pi - log pi_ref."""
    if estimator == "k1":
        return log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio.square()
    if estimator in ("k3", "low_var_kl"):
        d = (-log_ratio).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        return (torch.exp(d) - d - 1.0).clamp(-K3_CLAMP, K3_CLAMP)
    raise ValueError(f"kl_estimator must be one of {', '.join(KL_ESTIMATORS)} (got {estimator!r})")


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
