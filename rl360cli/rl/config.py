"""`GRPOConfig`: the knobs of the learning signal, validated when a recipe is loaded.

Imports nothing heavy, so `rl360 plan` can check a recipe without torch. The trainer hands the
fields on with `build_batch(trajectories, **config.batch_kwargs())` and
`policy_loss(..., **config.loss_kwargs())`. `__post_init__` is the one place the settings are
checked: `build_batch`, `policy_loss` and `aggregate_loss` take them as given (and check only
their inputs), so a bad value is refused once, when the recipe is loaded, not on every
micro-batch.
"""

from dataclasses import dataclass
from typing import Any, Literal, get_args

from rl360cli.configload import (check_above, check_at_least, check_finite, check_integer, check_non_negative,
                                 check_one_of, check_positive, check_range)

Aggregation = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
KLEstimator = Literal["k1", "k2", "k3", "low_var_kl"]

AGGREGATIONS: tuple[str, ...] = get_args(Aggregation)
KL_ESTIMATORS: tuple[str, ...] = get_args(KLEstimator)


@dataclass(frozen=True, kw_only=True, slots=True)
class GRPOConfig:
    """Group-relative advantages, the clipped policy loss and how a step's batch is filtered."""

    std_normalize: bool = True
    # Divide (r - group mean) by the group's unbiased std (GRPO); False gives Dr. GRPO's r - mean.
    eps: float = 1e-6
    # Added to the group std before dividing, so a near-constant group does not explode.
    clip_low: float = 0.2
    # PPO-clip lower epsilon: the ratio is clipped below at 1 - clip_low.
    clip_high: float = 0.2
    # PPO-clip upper epsilon: the ratio is clipped above at 1 + clip_high (DAPO's clip-higher uses 0.28).
    clip_c: float | None = None
    # Dual-clip bound for negative advantages (the loss never exceeds -A * clip_c); None disables it.
    aggregation: Aggregation = "token-mean"
    # How token losses become one scalar, with verl's meanings (see rl360cli.rl.grpo.aggregate_loss).
    norm_tokens: int | None = None
    # Divisor of "seq-mean-token-sum-norm" (Dr. GRPO's constant, e.g. the maximum response length);
    # None divides by the padded width, as verl does, which then varies with padding.
    kl_coef: float = 0.0
    # Weight of the KL-to-reference term in the loss; 0 disables it (no reference model needed).
    kl_estimator: KLEstimator = "k3"
    # KL estimator: k1 = log-ratio, k2 = half squared log-ratio, k3 = low_var_kl (clamped to +-10).
    tis_cap: float | None = None
    # Truncated importance sampling: cap on exp(training-time old logprob - rollout logprob);
    # None disables the correction.
    min_valid: int = 2
    # A group left with fewer valid (not infra-failed, not stale) samples than this is dropped.
    filter_zero_std: bool = True
    # Dynamic filtering: drop groups whose valid rewards are all equal (they carry no signal).
    max_staleness: int | None = None
    # Drop samples generated more than this many policy versions ago; None keeps every sample.
    pass_threshold: float = 1.0
    # A valid sample with reward >= this counts as a pass in the pass-rate metric.

    def __post_init__(self) -> None:
        # None (clip_c, norm_tokens, tis_cap, max_staleness) turns a setting off and passes every rule.
        check_positive(self, "eps", fix="use a small positive number such as 1e-6")
        check_range(self, 0, 1, "clip_low", high_open=True, fix="use e.g. 0.2")
        check_non_negative(self, "clip_high", fix="use e.g. 0.2 or 0.28")
        check_above(self, 1, "clip_c", fix="use e.g. 3.0, or None to disable dual clip")
        check_one_of(self, AGGREGATIONS, "aggregation")
        check_integer(self, "norm_tokens", "min_valid", "max_staleness")
        check_at_least(self, 1, "norm_tokens", fix="use the maximum response length, or None")
        check_non_negative(self, "kl_coef", fix="use 0 to disable the KL term or a small value like 0.001")
        check_one_of(self, KL_ESTIMATORS, "kl_estimator")
        check_positive(self, "tis_cap", fix="use e.g. 2.0, or None to disable")
        check_at_least(self, 2, "min_valid", fix="a group needs two samples for a baseline")
        check_non_negative(self, "max_staleness", fix="use 0 for on-policy, 1 for one step of overlap, or None")
        check_finite(self, "pass_threshold", fix="use the reward of a solved task, e.g. 1.0")

    def batch_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of `build_batch` this config sets (add `current_version`)."""
        return {
            "min_valid": self.min_valid,
            "filter_zero_std": self.filter_zero_std,
            "max_staleness": self.max_staleness,
            "std_normalize": self.std_normalize,
            "eps": self.eps,
            "pass_threshold": self.pass_threshold,
        }

    def loss_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of `policy_loss` this config sets."""
        return {
            "clip_low": self.clip_low,
            "clip_high": self.clip_high,
            "clip_c": self.clip_c,
            "aggregation": self.aggregation,
            "norm_tokens": self.norm_tokens,
            "kl_coef": self.kl_coef,
            "kl_estimator": self.kl_estimator,
            "tis_cap": self.tis_cap,
        }
