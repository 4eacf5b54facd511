"""The unbiased pass@k estimator of Chen et al. (2021), "Evaluating Large Language Models Trained on Code"."""

from __future__ import annotations

import math


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of ``k`` samples, drawn without replacement from ``n`` with ``c`` correct, is.

    ``1 - C(n - c, k) / C(n, k)``, computed as ``1 - prod_{i = n - c + 1}^{n} (1 - k / i)``: no huge binomials, so it
    stays exact in floating point for any ``n``. ``pass_at_k(n, c, 1) == c / n``.
    """
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}.")
    if n - c < k:  # every draw of k samples contains a correct one
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))
