"""The clipped policy loss, its aggregations, KL and TIS against plain-Python formulas; gradients."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rl360cli.rl.grpo import (
    aggregate_loss,
    clipped_pg_losses,
    kl_penalty,
    log_importance_ratio,
    loss_stats,
    policy_loss,
    truncated_is_weights,
)

FAST = settings(max_examples=60, deadline=None)
AGGREGATIONS = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]


def reference_token_loss(logprob, old, advantage, clip_low, clip_high, clip_c):
    ratio = math.exp(max(-20.0, min(20.0, logprob - old)))
    unclipped = -advantage * ratio
    clipped = -advantage * min(max(ratio, 1 - clip_low), 1 + clip_high)
    loss = max(unclipped, clipped)
    if clip_c is not None and advantage < 0:
        loss = min(loss, -advantage * clip_c)
    return loss


def reference_aggregate(losses, masks, aggregation, norm_tokens=None):
    """losses and masks as lists of rows; verl's meanings, sequences without loss tokens not counted."""
    rows = [[l for l, m in zip(row, mask) if m] for row, mask in zip(losses, masks)]
    rows_with_tokens = [row for row in rows if row]
    if aggregation == "token-mean":
        count = sum(len(row) for row in rows)
        return sum(sum(row) for row in rows) / max(count, 1)
    if aggregation == "seq-mean-token-mean":
        return sum(sum(row) / len(row) for row in rows_with_tokens) / max(len(rows_with_tokens), 1)
    if aggregation == "seq-mean-token-sum":
        return sum(sum(row) for row in rows_with_tokens) / max(len(rows_with_tokens), 1)
    width = len(masks[0])
    return sum(sum(row) for row in rows) / (norm_tokens if norm_tokens is not None else width)


def one_token(logprob, old, advantage, **kwargs):
    return policy_loss(
        torch.tensor([[logprob]], dtype=torch.float64, requires_grad=True),
        torch.tensor([[old]], dtype=torch.float64),
        torch.tensor([advantage], dtype=torch.float64),
        torch.ones(1, 1),
        **kwargs,
    )


def test_dual_clip_bounds_a_negative_advantage():
    # A = -1, ratio 4, eps 0.2: max(-A * 4, -A * 1.2) = 4; dual clip with c = 3 bounds it at 3.
    loss, stats = one_token(math.log(4.0), 0.0, -1.0, clip_low=0.2, clip_high=0.2, clip_c=3.0)
    assert loss.item() == pytest.approx(3.0, abs=1e-12)
    assert stats.clip_frac_lower == 1.0
    loss, stats = one_token(math.log(4.0), 0.0, -1.0, clip_low=0.2, clip_high=0.2)
    assert loss.item() == pytest.approx(4.0, abs=1e-12)
    assert stats.clip_frac_lower == 0.0 and stats.ratio_mean == pytest.approx(4.0)


@pytest.mark.parametrize(
    ("ratio", "advantage", "clip_low", "clip_high", "expected"),
    [
        (1.5, 1.0, 0.2, 0.28, -1.28),  # above 1 + clip_high with A > 0: clipped
        (0.5, 1.0, 0.2, 0.2, -0.5),  # below 1 - clip_low with A > 0: the pessimistic unclipped term
        (0.5, -1.0, 0.2, 0.2, 0.8),  # below 1 - clip_low with A < 0: clipped
        (0.7, -1.0, 0.2, 0.2, 0.8),
        (0.7, -1.0, 0.4, 0.2, 0.7),  # the lower epsilon alone decides
        (1.1, 2.0, 0.2, 0.2, -2.2),  # inside the trust region
    ],
)
def test_ppo_clip_with_separate_epsilons(ratio, advantage, clip_low, clip_high, expected):
    loss, _ = one_token(math.log(ratio), 0.0, advantage, clip_low=clip_low, clip_high=clip_high)
    assert loss.item() == pytest.approx(expected, abs=1e-12)


def test_ratio_is_clamped_before_exp():
    loss, stats = one_token(100.0, 0.0, -1.0, clip_low=0.2, clip_high=0.2)
    assert loss.item() == pytest.approx(math.exp(20.0), rel=1e-12)
    assert math.isfinite(stats.approx_kl)


def test_log_ratio_is_clamped_on_both_sides_and_zero_off_the_mask():
    logprobs = torch.tensor([[25.0, -30.0, 0.5, float("nan")]], dtype=torch.float64, requires_grad=True)
    base = torch.tensor([[0.0, 0.0, 0.0, 0.0]], dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[True, True, True, False]])
    log_ratio = log_importance_ratio(logprobs, base, mask)
    assert log_ratio.tolist() == [[20.0, -20.0, 0.5, 0.0]]
    log_ratio.sum().backward()
    # Clamped tokens and the masked (NaN) one get no gradient; the base is a constant.
    assert logprobs.grad.tolist() == [[0.0, 0.0, 1.0, 0.0]] and base.grad is None


@pytest.mark.parametrize("clip_c", [None, 3.0])
def test_clip_flags_match_the_hand_formula(clip_c):
    clip_low, clip_high = 0.2, 0.28
    ratios = [0.5, 0.9, 1.0, 1.3, 2.5, 4.0]
    advantages = [-2.0, -0.5, 0.0, 1.0]
    grid = [(r, a) for r in ratios for a in advantages]
    ratio = torch.tensor([[r for r, _ in grid]], dtype=torch.float64)
    adv = torch.tensor([[a for _, a in grid]], dtype=torch.float64)
    pg = clipped_pg_losses(ratio, adv, clip_low=clip_low, clip_high=clip_high, clip_c=clip_c)
    expected = [reference_token_loss(math.log(r), 0.0, a, clip_low, clip_high, clip_c) for r, a in grid]
    assert pg.losses[0].tolist() == pytest.approx(expected, abs=1e-12)
    # PPO clipping acts above 1 + clip_high with A > 0 and below 1 - clip_low with A < 0; the dual
    # clip bounds -A * max(ratio, 1 - clip_low) at -A * c, that is acts where A < 0 and ratio > c.
    assert pg.clipped[0].tolist() == [(a > 0 and r > 1 + clip_high) or (a < 0 and r < 1 - clip_low) for r, a in grid]
    assert pg.dual_clipped[0].tolist() == [clip_c is not None and a < 0 and r > clip_c for r, a in grid]


def test_truncated_importance_weights_by_hand():
    old = torch.tensor([[math.log(3.0), math.log(1.5), -30.0, 25.0, float("inf")]], dtype=torch.float64)
    old.requires_grad_(True)
    rollout = torch.zeros(1, 5, dtype=torch.float64)
    mask = torch.tensor([[True, True, True, True, False]])
    tis = truncated_is_weights(old, rollout, mask, tis_cap=2.0)
    # min(exp(clamp(old - rollout, -20, 20)), 2); 1 off the mask.
    assert tis.weights[0].tolist() == pytest.approx([2.0, 1.5, math.exp(-20.0), 2.0, 1.0], rel=1e-12)
    assert tis.capped[0].tolist() == [True, False, False, True, False]
    assert not tis.weights.requires_grad


def test_the_composition_in_the_module_doc_is_policy_loss():
    g = torch.Generator().manual_seed(0)
    logprobs = (-torch.rand(3, 5, generator=g, dtype=torch.float64)).requires_grad_(True)
    old, ref, rollout = (-torch.rand(3, 5, generator=g, dtype=torch.float64) for _ in range(3))
    advantages = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    mask = torch.rand(3, 5, generator=g) < 0.7
    clips = dict(clip_low=0.2, clip_high=0.28, clip_c=1.5)
    loss, stats = policy_loss(
        logprobs, old, advantages, mask, aggregation="seq-mean-token-mean", ref_logprobs=ref, kl_coef=0.1,
        rollout_logprobs=rollout, tis_cap=1.2, **clips,
    )  # fmt: skip
    log_ratio = log_importance_ratio(logprobs, old, mask)
    ratio = log_ratio.exp()
    pg = clipped_pg_losses(ratio, torch.where(mask, advantages[:, None], 0.0), **clips)
    tis = truncated_is_weights(old, rollout, mask, tis_cap=1.2)
    pg_loss = aggregate_loss(pg.losses * tis.weights, mask, "seq-mean-token-mean")
    kl_loss = aggregate_loss(kl_penalty(logprobs, ref, mask=mask), mask, "seq-mean-token-mean")
    composed = pg_loss + 0.1 * kl_loss
    assert torch.equal(composed, loss)
    assert loss_stats(
        mask, loss=composed, pg_loss=pg_loss, kl_loss=kl_loss, ratio=ratio, log_ratio=log_ratio, pg=pg, tis=tis
    ) == stats
    assert 0 < stats.tis_clip_frac < 1 and stats.num_tokens == int(mask.sum())


def test_gradient_of_unclipped_and_clipped_tokens():
    # token-mean over two tokens; token 0 inside the region: d/dlogp (-A * exp(logp - old)) / 2;
    # token 1 clipped (ratio 2 > 1.2 with A > 0): no gradient.
    logprobs = torch.tensor([[math.log(1.1), math.log(2.0)]], dtype=torch.float64, requires_grad=True)
    loss, stats = policy_loss(logprobs, torch.zeros(1, 2, dtype=torch.float64), torch.tensor([3.0]), torch.ones(1, 2))
    loss.backward()
    assert logprobs.grad[0].tolist() == pytest.approx([-3.0 * 1.1 / 2, 0.0], abs=1e-12)
    assert stats.clip_frac == 0.5


seq_batches = st.integers(1, 4).flatmap(
    lambda b: st.integers(1, 6).flatmap(
        lambda t: st.tuples(
            st.lists(st.lists(st.floats(-3, 0, allow_nan=False), min_size=t, max_size=t), min_size=b, max_size=b),
            st.lists(st.lists(st.floats(-3, 0, allow_nan=False), min_size=t, max_size=t), min_size=b, max_size=b),
            st.lists(st.lists(st.booleans(), min_size=t, max_size=t), min_size=b, max_size=b),
            st.lists(st.floats(-2, 2, allow_nan=False), min_size=b, max_size=b),
        )
    )
)


@FAST
@given(
    seq_batches,
    st.sampled_from(AGGREGATIONS),
    st.sampled_from([0.0, 0.2, 0.3]),
    st.sampled_from([0.2, 0.28]),
    st.sampled_from([None, 3.0]),
)
def test_loss_matches_the_reference_for_every_aggregation(batch, aggregation, clip_low, clip_high, clip_c):
    logprobs, old, masks, advantages = batch
    loss, stats = policy_loss(
        torch.tensor(logprobs, dtype=torch.float64),
        torch.tensor(old, dtype=torch.float64),
        torch.tensor(advantages, dtype=torch.float64),
        torch.tensor(masks),
        clip_low=clip_low,
        clip_high=clip_high,
        clip_c=clip_c,
        aggregation=aggregation,
    )
    token_losses = [
        [reference_token_loss(lp, o, a, clip_low, clip_high, clip_c) for lp, o in zip(row_lp, row_old)]
        for row_lp, row_old, a in zip(logprobs, old, advantages)
    ]
    assert loss.item() == pytest.approx(reference_aggregate(token_losses, masks, aggregation), rel=1e-9, abs=1e-12)
    assert stats.num_tokens == sum(sum(row) for row in masks)


def test_seq_mean_token_sum_norm_uses_the_constant():
    losses = torch.tensor([[1.0, 2.0, 0.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert aggregate_loss(losses, mask, "seq-mean-token-sum-norm").item() == pytest.approx(7.0 / 3)
    assert aggregate_loss(losses, mask, "seq-mean-token-sum-norm", norm_tokens=10).item() == pytest.approx(0.7)
    assert aggregate_loss(losses, mask, "seq-mean-token-mean").item() == pytest.approx((1.5 + 4.0) / 2)
    assert aggregate_loss(losses, mask, "seq-mean-token-sum").item() == pytest.approx((3.0 + 4.0) / 2)
    assert aggregate_loss(losses, mask, "token-mean").item() == pytest.approx(7.0 / 3)
    assert aggregate_loss(losses, mask, "token-mean", denominator=7.0).item() == pytest.approx(1.0)
    assert aggregate_loss(losses, torch.zeros_like(mask), "token-mean").item() == 0.0


@pytest.mark.parametrize(
    ("estimator", "log_ratio", "expected"),
    [
        ("k1", 0.5, 0.5),
        ("k1", -0.3, -0.3),
        ("k2", 0.5, 0.125),
        ("k2", -2.0, 2.0),
        ("k3", 0.5, math.exp(-0.5) + 0.5 - 1),
        ("low_var_kl", -0.3, math.exp(0.3) - 0.3 - 1),
        ("k3", -15.0, 10.0),  # exp(15) - 16 is clamped to 10
        ("k3", 30.0, 10.0),  # d clamped to -20 first: exp(-20) + 19, then clamped to 10
        ("k3", 0.0, 0.0),
    ],
)
def test_kl_estimators(estimator, log_ratio, expected):
    logprobs = torch.tensor([log_ratio - 1.0], dtype=torch.float64)
    ref = torch.tensor([-1.0], dtype=torch.float64)
    assert kl_penalty(logprobs, ref, estimator).item() == pytest.approx(expected, rel=1e-12, abs=1e-12)


def test_kl_term_is_added_with_its_coefficient():
    logprobs = torch.tensor([[-1.0, -2.0]], dtype=torch.float64)
    ref = torch.tensor([[-1.5, -1.0]], dtype=torch.float64)
    base, _ = policy_loss(logprobs, logprobs, torch.tensor([1.0]), torch.ones(1, 2))
    loss, stats = policy_loss(
        logprobs, logprobs, torch.tensor([1.0]), torch.ones(1, 2), ref_logprobs=ref, kl_coef=0.1, kl_estimator="k2"
    )
    kl = (0.5 * 0.5**2 + 0.5 * 1.0**2) / 2
    assert stats.kl_loss == pytest.approx(kl)
    assert loss.item() == pytest.approx(base.item() + 0.1 * kl)


def test_truncated_importance_weights():
    # ratio 1 (logprobs == old), A = 1: token loss -1, weighted by min(exp(old - rollout), cap).
    old = torch.tensor([[-1.0, -1.0]], dtype=torch.float64)
    rollout = torch.tensor([[-1.0 - math.log(3.0), -1.0 - math.log(1.5)]], dtype=torch.float64)
    loss, stats = policy_loss(old.clone(), old, torch.tensor([1.0]), torch.ones(1, 2), rollout_logprobs=rollout, tis_cap=2.0)
    assert loss.item() == pytest.approx((-2.0 - 1.5) / 2)
    assert stats.tis_clip_frac == 0.5 and stats.tis_weight_mean == pytest.approx(1.75)


def test_arguments_are_checked():
    lp = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="ref_logprobs"):
        policy_loss(lp, lp, torch.zeros(2), torch.ones(2, 3), kl_coef=0.1)
    with pytest.raises(ValueError, match="rollout_logprobs and tis_cap"):
        policy_loss(lp, lp, torch.zeros(2), torch.ones(2, 3), tis_cap=2.0)
    with pytest.raises(ValueError, match="advantages"):
        policy_loss(lp, lp, torch.zeros(3), torch.ones(2, 3))
    with pytest.raises(ValueError, match="old_logprobs"):
        policy_loss(lp, torch.zeros(2, 4), torch.zeros(2), torch.ones(2, 3))
    # Bad settings (aggregation="sum", clip_c=0.5, ...) are GRPOConfig's to refuse: test_rl_config.py.


def test_an_unknown_mode_is_a_key_error_never_another_mode():
    # Settings are validated once, by GRPOConfig; past it, a mode outside the valid ones must not
    # fall through to some other mode's arithmetic.
    losses, mask = torch.ones(2, 3), torch.ones(2, 3)
    with pytest.raises(KeyError):
        aggregate_loss(losses, mask, "sum")
    with pytest.raises(KeyError):
        aggregate_loss(losses, mask, "sum", denominator=6.0)
    with pytest.raises(KeyError):
        kl_penalty(losses, losses, "k4")


garbage = st.sampled_from([float("nan"), float("inf"), -float("inf"), 1e30, -1e30, 50.0])


@FAST
@given(seq_batches, st.sampled_from(AGGREGATIONS), garbage, st.booleans(), st.data())
def test_masked_tokens_get_exactly_zero_gradient(batch, aggregation, junk, everything_on, data):
    logprobs, old, masks, advantages = batch
    mask = torch.tensor(masks)
    junk_filled = torch.full(mask.shape, junk, dtype=torch.float64)

    def fill(values):
        return torch.where(mask, torch.tensor(values, dtype=torch.float64), junk_filled)

    leaf = fill(logprobs).requires_grad_(True)
    token_advantages = torch.where(mask, torch.tensor(advantages, dtype=torch.float64)[:, None], torch.tensor(junk))
    options = {}
    if everything_on:
        ref = fill([[v - 0.1 for v in row] for row in old])
        rollout = fill([[v + 0.05 for v in row] for row in old])
        options = dict(ref_logprobs=ref, kl_coef=0.1, rollout_logprobs=rollout, tis_cap=2.0, clip_c=3.0)
    loss, _ = policy_loss(leaf, fill(old), token_advantages, mask, aggregation=aggregation, **options)
    loss.backward()
    assert torch.isfinite(loss)
    assert torch.isfinite(leaf.grad).all()
    assert (leaf.grad[~mask] == 0).all()


@FAST
@given(seq_batches, st.sampled_from(AGGREGATIONS), st.integers(0, 3), st.integers(0, 3), garbage)
def test_padding_does_not_change_the_loss(batch, aggregation, extra_rows, extra_cols, junk):
    logprobs, old, masks, advantages = batch
    b, t = len(masks), len(masks[0])
    norm = 16  # seq-mean-token-sum-norm divides by the width unless given a constant
    loss, _ = policy_loss(
        torch.tensor(logprobs, dtype=torch.float64), torch.tensor(old, dtype=torch.float64),
        torch.tensor(advantages, dtype=torch.float64), torch.tensor(masks), aggregation=aggregation, norm_tokens=norm,
    )  # fmt: skip
    def padded(rows, value):
        return torch.nn.functional.pad(torch.tensor(rows, dtype=torch.float64), (0, extra_cols, 0, extra_rows), value=value)

    mask = torch.zeros(b + extra_rows, t + extra_cols, dtype=torch.bool)
    mask[:b, :t] = torch.tensor(masks)
    padded_advantages = torch.cat([torch.tensor(advantages, dtype=torch.float64), torch.full((extra_rows,), junk)])
    padded_loss, _ = policy_loss(
        padded(logprobs, junk), padded(old, junk), padded_advantages, mask, aggregation=aggregation, norm_tokens=norm
    )
    assert padded_loss.item() == pytest.approx(loss.item(), rel=1e-12, abs=1e-15)
