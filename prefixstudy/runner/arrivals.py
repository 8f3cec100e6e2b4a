"""Stage: arrivals.  When each request is sent: a seeded schedule of offsets in seconds.

The schedule depends on (process, rate, burstiness, seed) only, never on the mode, so
ON and OFF replay the identical arrival times and their requests pair up by index.
"""

from __future__ import annotations

import numpy as np

from prefixstudy.errors import UserError


def schedule(n: int, rate: float, process: str = "poisson", burstiness: float = 1.0, seed: int = 0) -> np.ndarray:
    """Send offsets (s) of n requests; the first is sent at 0.

    poisson: exponential gaps with mean 1/rate; gamma: gaps with shape ``burstiness`` and the
    same mean (as ``vllm bench serve --burstiness``; < 1 is burstier); constant: exactly 1/rate.
    """
    if n <= 0:
        return np.zeros(0)
    if not rate > 0:
        raise UserError(f"rate must be > 0 req/s, got {rate}")
    if np.isinf(rate):  # --request-rate inf: everything at once, as vllm bench serve
        return np.zeros(n)
    if process == "constant":
        return np.arange(n) / rate
    # The rate enters the seed so points differ from each other but not between modes.
    rng = np.random.default_rng([seed, int(round(rate * 1e6))])
    if process == "poisson":
        gaps = rng.exponential(1.0 / rate, size=n - 1)
    elif process == "gamma":
        gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n - 1)
    else:
        raise UserError(f"field 'arrivals.process': unknown arrival process {process!r}")
    return np.concatenate([[0.0], np.cumsum(gaps)])
