"""GRPO group advantages against hand-computed values and a plain-Python reference."""

import math
import statistics

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rl360cli.rl.grpo import group_advantages

FAST = settings(max_examples=60, deadline=None)


def reference_advantages(rewards, group_ids, std_normalize=True, eps=1e-6):
    """The formula, one sample at a time, with the standard library's unbiased std."""
    out = []
    for reward, group in zip(rewards, group_ids):
        members = [r for r, g in zip(rewards, group_ids) if g == group]
        if len(members) < 2 or len(set(members)) == 1:
            out.append(0.0)
            continue
        mean = sum(members) / len(members)
        out.append((reward - mean) / (statistics.stdev(members) + eps) if std_normalize else reward - mean)
    return out


def test_two_right_two_wrong_gives_plus_minus_0_866024():
    advantages = group_advantages([1.0, 0.0, 0.0, 1.0], ["a"] * 4)
    # mean 0.5, unbiased std sqrt(1/3): 0.5 / (0.5773503 + 1e-6) = 0.8660239
    assert advantages.tolist() == pytest.approx([0.866024, -0.866024, -0.866024, 0.866024], abs=1e-6)


def test_one_right_of_four():
    advantages = group_advantages([1.0, 0.0, 0.0, 0.0], ["a"] * 4)
    # mean 0.25, unbiased std sqrt(0.75 / 3) = 0.5
    assert advantages.tolist() == pytest.approx([1.499997, -0.499999, -0.499999, -0.499999], abs=1e-6)


def test_dr_grpo_subtracts_the_mean_only():
    advantages = group_advantages([1.0, 0.0, 0.0, 0.0], ["a"] * 4, std_normalize=False)
    assert advantages.tolist() == [0.75, -0.25, -0.25, -0.25]


@pytest.mark.parametrize("value", [0.0, 1.0, 0.1, -3.7, 1e9])
def test_all_equal_rewards_give_exact_zeros(value):
    # 0.1 * 3 / 3 != 0.1 in floating point: the zero must not depend on rounding.
    assert group_advantages([value] * 3, ["a"] * 3).tolist() == [0.0, 0.0, 0.0]
    assert group_advantages([value] * 3, ["a"] * 3, std_normalize=False).tolist() == [0.0, 0.0, 0.0]


def test_group_of_one_gets_zero():
    advantages = group_advantages([1.0, 0.0, 1.0, 5.0], ["a", "a", "b", "c"])
    assert advantages[2].item() == 0.0 and advantages[3].item() == 0.0
    # [1, 0]: mean 0.5, unbiased std sqrt(0.5)
    assert advantages[0].item() == pytest.approx(0.5 / (math.sqrt(0.5) + 1e-6), abs=1e-6)


def test_groups_are_independent_and_interleaved():
    rewards = [1.0, 5.0, 0.0, 3.0, 0.0, 4.0]
    groups = ["x", "y", "x", "y", "x", "y"]
    expected = reference_advantages(rewards, groups)
    assert group_advantages(rewards, groups).tolist() == pytest.approx(expected, abs=1e-6)


def test_group_ids_as_tensor_numpy_or_list_agree():
    rewards = torch.tensor([1.0, 0.0, 2.0, 0.5, 0.5, 9.0], dtype=torch.float64)
    ids = [3, 3, 7, 7, 7, 1]
    from_list = group_advantages(rewards, ids)
    from_tensor = group_advantages(rewards, torch.tensor(ids))
    from_numpy = group_advantages(rewards, np.array(ids))
    assert from_list.dtype == torch.float64
    assert torch.equal(from_list, from_tensor) and torch.equal(from_list, from_numpy)


def test_output_dtype():
    assert group_advantages([1.0, 0.0], ["a", "a"]).dtype == torch.float32
    assert group_advantages(torch.tensor([1.0, 0.0], dtype=torch.bfloat16), ["a", "a"]).dtype == torch.bfloat16


def test_rejects_non_finite_rewards_and_mismatched_ids():
    with pytest.raises(ValueError, match="finite"):
        group_advantages([1.0, float("nan")], ["a", "a"])
    with pytest.raises(ValueError, match="one id per reward"):
        group_advantages([1.0, 0.0], ["a"])


rewards_and_groups = st.lists(
    st.tuples(st.floats(-10, 10, allow_nan=False, width=32), st.integers(0, 4)), min_size=1, max_size=40
)


@FAST
@given(rewards_and_groups, st.booleans())
def test_matches_the_reference_formula(samples, std_normalize):
    rewards = [r for r, _ in samples]
    groups = [g for _, g in samples]
    got = group_advantages(torch.tensor(rewards, dtype=torch.float64), groups, std_normalize=std_normalize)
    expected = reference_advantages(rewards, groups, std_normalize)
    assert got.tolist() == pytest.approx(expected, rel=1e-9, abs=1e-6)


@FAST
@given(rewards_and_groups)
def test_groups_with_two_distinct_rewards_have_zero_mean(samples):
    rewards = [r for r, _ in samples]
    groups = [g for _, g in samples]
    advantages = group_advantages(torch.tensor(rewards, dtype=torch.float64), groups)
    for group in set(groups):
        members = [i for i, g in enumerate(groups) if g == group]
        if len({rewards[i] for i in members}) >= 2:
            # Rounding of the float64 mean, divided by a std as small as eps, stays far below 1e-6.
            assert abs(sum(advantages[i].item() for i in members)) < 1e-6
        else:
            assert all(advantages[i].item() == 0.0 for i in members)


@FAST
@given(rewards_and_groups, st.data())
def test_removing_a_sample_never_changes_another_group(samples, data):
    rewards = [r for r, _ in samples]
    groups = [g for _, g in samples]
    drop = data.draw(st.integers(0, len(samples) - 1))
    before = group_advantages(torch.tensor(rewards, dtype=torch.float64), groups)
    kept = [i for i in range(len(samples)) if i != drop]
    after = group_advantages(torch.tensor([rewards[i] for i in kept], dtype=torch.float64), [groups[i] for i in kept])
    for position, i in enumerate(kept):
        if groups[i] != groups[drop]:
            assert after[position].item() == before[i].item()
