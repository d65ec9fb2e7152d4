import random
import sys

import pytest

sys.path.insert(0, "/app")

from window import window_max  # noqa: E402


def test_example():
    assert window_max([1, 3, -1, -3, 5, 3, 6, 7], 3) == [3, 3, 5, 5, 6, 7]


def test_k_one_and_k_all():
    nums = [4, -2, 9, 9, 0]
    assert window_max(nums, 1) == nums
    assert window_max(nums, 5) == [9]


def test_decreasing():
    assert window_max([9, 8, 7, 6, 5], 2) == [9, 8, 7, 6]


def test_duplicates():
    assert window_max([2, 2, 2, 1, 2], 3) == [2, 2, 2]


def test_invalid_k():
    for nums, k in (([1, 2], 0), ([1, 2], 3), ([], 1), ([1], -1)):
        with pytest.raises(ValueError):
            window_max(nums, k)


def test_matches_brute_force():
    rng = random.Random(3)
    for _ in range(200):
        nums = [rng.randint(-20, 20) for _ in range(rng.randint(1, 40))]
        k = rng.randint(1, len(nums))
        assert window_max(nums, k) == [max(nums[i:i + k]) for i in range(len(nums) - k + 1)]
