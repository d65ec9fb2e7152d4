"""Searching in sorted lists."""


def binary_search(items, target):
    """Index of `target` in the sorted list `items`, or -1 when it is not there."""
    lo, hi = 0, len(items) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if items[mid] == target:
            return mid
        if items[mid] < target:
            lo = mid + 1
        else:
            hi = mid - 1
    return -1


def lower_bound(items, target):
    """The first index i with items[i] >= target (len(items) when there is none)."""
    lo, hi = 0, len(items) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if items[mid] < target:
            lo = mid + 1
        else:
            hi = mid
    return lo
