"""Chen et al.'s unbiased Pass@k (arXiv 2107.03374): from n samples of which c are correct, the probability that at
least one of k samples drawn without replacement is correct. The coverage metrics report it (`evaluation.metrics`),
and ES can climb it (`fitness.pass_at_k_rewards`)."""

from __future__ import annotations

import math


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased Pass@k from `n` samples of which `c` are correct: 1 - C(n-c, k) / C(n, k)."""
    if not 0 <= c <= n:
        raise ValueError(f"c={c} correct out of n={n} samples: c must be between 0 and n.")
    if not 1 <= k <= n:
        raise ValueError(f"k={k} with n={n} samples: Pass@k needs 1 <= k <= n. Draw at least k samples per prompt.")
    if n - c < k:
        return 1.0
    # The product form of C(n-c, k) / C(n, k), stable for large n.
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))
