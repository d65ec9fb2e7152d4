"""Small statistics helpers."""


def mean(values):
    return sum(values) / len(values)


def median(values):
    ordered = sorted(values)
    middle = len(ordered) // 2
    # Bug: for an even number of values this returns the upper middle value only.
    return ordered[middle]
