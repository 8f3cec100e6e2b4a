"""Token lengths given as a fixed number or a distribution, drawn for the generated workloads
(their schema, ``Length``, is the config's: ``prefixstudy.config.workload_specs``)."""

from __future__ import annotations

import math

import numpy as np

from prefixstudy.config.workload_specs import Length, LengthDist  # noqa: F401 - the workloads' view of them


def draw(spec: Length, rng: np.random.Generator, n: int) -> np.ndarray:
    """n lengths (int64) from ``spec``."""
    if isinstance(spec, int):
        return np.full(n, spec, dtype=np.int64)
    d = spec
    if d.dist == "uniform":
        out = rng.integers(d.low, d.high + 1, size=n)
    elif d.dist == "normal":
        out = np.rint(rng.normal(d.mean, d.std, size=n))
    elif d.dist == "lognormal":
        # The underlying normal's parameters that give lengths of this mean and std.
        sigma2 = math.log(1 + (d.std / d.mean) ** 2)
        out = np.rint(rng.lognormal(math.log(d.mean) - sigma2 / 2, math.sqrt(sigma2), size=n))
    else:
        p = None if d.weights is None else np.asarray(d.weights) / sum(d.weights)
        out = rng.choice(np.asarray(d.values), size=n, p=p)
    return np.clip(out, d.low, d.high if d.high is not None else None).astype(np.int64)


def lowest(spec: Length) -> int:
    """The smallest length ``spec`` can give."""
    if isinstance(spec, int):
        return spec
    return min(spec.values) if spec.dist == "choice" else spec.low
