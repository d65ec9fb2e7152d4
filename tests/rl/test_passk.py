"""The unbiased pass@k estimator against brute force: over every way of drawing k of n samples
(c of them passing), the share of draws that hold a pass."""

from __future__ import annotations

import itertools

import pytest

from rl360cli.rl.passk import mean_pass_at_k, pass_at_k


def brute_force(n: int, c: int, k: int) -> float:
    samples = [True] * c + [False] * (n - c)
    draws = list(itertools.combinations(range(n), k))
    return sum(any(samples[i] for i in draw) for draw in draws) / len(draws)


@pytest.mark.parametrize("n", range(1, 9))
def test_every_small_case_matches_brute_force(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(brute_force(n, c, k), abs=1e-12), (n, c, k)


def test_pass_at_1_is_the_pass_fraction_and_the_ends_are_exact():
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert pass_at_k(5, 0, 5) == 0.0
    assert pass_at_k(5, 1, 5) == 1.0
    # Large n, against the product form of Chen et al.'s reference code: 1 - prod(1 - k / i), i = n-c+1..n.
    for n, c, k in ((200, 10, 10), (1000, 3, 100), (64, 60, 8)):
        product = 1.0
        for i in range(n - c + 1, n + 1):
            product *= 1.0 - k / i
        assert pass_at_k(n, c, k) == pytest.approx(1.0 - product, rel=1e-9)


def test_the_set_mean_leaves_out_tasks_with_fewer_than_k_samples():
    # Task b has only 2 valid samples (infra failures took the rest): out of pass@4, in pass@1.
    counts = [(4, 1), (2, 2), (4, 0)]
    assert mean_pass_at_k(counts, 4) == pytest.approx((1.0 + 0.0) / 2)
    assert mean_pass_at_k(counts, 1) == pytest.approx((0.25 + 1.0 + 0.0) / 3)
    assert mean_pass_at_k([(0, 0)], 1) is None
    assert mean_pass_at_k([], 4) is None


@pytest.mark.parametrize("n, c, k", [(4, 5, 1), (4, -1, 1), (4, 1, 0), (4, 1, 5)])
def test_impossible_counts_are_refused(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)
