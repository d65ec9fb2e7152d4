"""The unbiased pass@k estimator (Chen et al. 2021, "Evaluating Large Language Models Trained on Code").

With n samples of a task of which c passed, the chance that k of them drawn without replacement hold
at least one pass is

    pass@k = 1 - C(n - c, k) / C(n, k)

which is unbiased for the pass@k of the policy as long as k <= n (the naive "any of the first k
passed" throws away the other n - k samples). A set's pass@k is the mean over its tasks. Pure: the
evaluation (rl360cli/loop/eval.py) counts n and c, infra-failed samples left out of n.
"""

from __future__ import annotations

import math
from collections.abc import Iterable


def pass_at_k(num_samples: int, num_passed: int, k: int) -> float:
    """pass@k of one task from `num_samples` valid samples, `num_passed` of them passing (k <= n)."""
    if not 0 <= num_passed <= num_samples:
        raise ValueError(f"num_passed must be between 0 and num_samples (got {num_passed} of {num_samples})")
    if not 1 <= k <= num_samples:
        raise ValueError(f"k must be between 1 and num_samples (got k={k}, n={num_samples})")
    if num_samples - num_passed < k:  # every draw of k holds a pass
        return 1.0
    # Exact in integers (math.comb), one division at the end: no float products to drift.
    return 1.0 - math.comb(num_samples - num_passed, k) / math.comb(num_samples, k)


def mean_pass_at_k(counts: Iterable[tuple[int, int]], k: int) -> float | None:
    """The mean pass@k over the tasks of `counts` ((n, c) per task) that have at least k samples;
    None when none has (tasks with fewer cannot be estimated without bias, so they are left out)."""
    values = [pass_at_k(n, c, k) for n, c in counts if n >= k]
    return sum(values) / len(values) if values else None
