"""Stage: sim.  The step-cost model the simulator prices its steps with: the study's one step-cost
fit (``metrics.engine_fit``: non-negative least squares over busy steps, the same idle-step rule and
terms as the report's), stored as JSON with its R² and residuals::

    step_ms = c0 + c_prefill·prefill_tokens + c_prefill_req·num_prefill_reqs + c_decode·decode_tokens
              (+ c_context·context_tokens where the data support it)

A term the fit leaves at 0 is left out of ``coef_ms``; without a context term the decode coefficient
carries the average KV read (``sim.hardware.transfer`` relies on that).
It reads iterations.parquet in both layouts: the engine-timed one (``timing`` "engine": step_ms is
busy time measured in the engine core) and the old one (``timing`` "frontend" or no such column:
step_ms is the gap between StatLogger records, so a step after an idle stretch carries the idle
gap; those are filtered, see ``metrics.engine_fit.busy_steps``).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from prefixstudy.errors import UserError
from prefixstudy.metrics import engine_fit

TERMS = engine_fit.TERMS
OLD_NAMES = {"prompt_tokens": "prefill_tokens", "generation_tokens": "decode_tokens"}


@dataclass
class CostModel:
    """Coefficients in ms (``c0_ms`` a step, ``coef_ms[term]`` per unit of that term), and how the
    fit went.  ``__call__`` prices a ``StepFeatures``."""

    c0_ms: float
    coef_ms: dict[str, float]
    r2: float = math.nan
    n_steps: int = 0
    residual_ms: dict[str, float] = field(default_factory=dict)  # mean, std, p50/p90/p99 of |residual|
    source: str = ""
    timing: str = ""
    note: str = ""
    # What it prices and how it got there (``sim.run``): the calibration's model and hardware
    # (``source``), the simulated ones (``target``), each term's scale factor (``scale``, 1 where
    # nothing changed) and what the transfer extrapolates (``extrapolations``).
    transfer: dict = field(default_factory=dict)
    # A fit to request timestamps (``sim.fit_requests``): its error on the points it was fitted to.
    fit_error: dict = field(default_factory=dict)

    def __call__(self, f) -> float:
        return self.c0_ms + sum(c * getattr(f, t) for t, c in self.coef_ms.items())

    def predict(self, df: pd.DataFrame) -> np.ndarray:
        out = np.full(len(df), self.c0_ms)
        for t, c in self.coef_ms.items():
            out = out + c * df[t].to_numpy(dtype=float)
        return out

    def save(self, path: Path) -> None:
        Path(path).write_text(json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def load(cls, path: Path) -> "CostModel":
        try:
            return cls(**json.loads(Path(path).read_text()))
        except (OSError, ValueError, TypeError) as e:
            raise UserError(f"{path}: not a step-cost model JSON ({e})") from None


def load_steps(study_dir: Path) -> pd.DataFrame:
    """A study's iterations in the engine-timed column names, whichever layout it was written in."""
    path = Path(study_dir) / "iterations.parquet"
    if not path.exists():
        raise UserError(f"--calibration {study_dir}: no iterations.parquet there")
    df = pd.read_parquet(path)
    if "timing" not in df:
        df["timing"] = "frontend"  # written before engine step timing existed
    for old, new in OLD_NAMES.items():
        if new not in df and old in df:
            df[new] = df[old]
    if "repeat" not in df:
        df["repeat"] = 0
    return df


busy_steps = engine_fit.busy_steps


def fit(df: pd.DataFrame, source: str = "") -> CostModel:
    """The study's step-cost fit (``metrics.engine_fit``) as a ``CostModel``.  No outlier is
    dropped: with frontend timing a late record's long gap is paid back by the next one's short
    gap, and dropping the long ones alone would bias the sum."""
    steps = busy_steps(df)
    X, y = engine_fit.design(steps), steps["step_ms"].to_numpy(dtype=float)
    cols = engine_fit.identified(X) if len(steps) else []
    if len(steps) < len(cols) + 2 or not len(steps):
        raise UserError(f"--calibration {source}: only {len(steps)} busy steps, too few to fit a step cost")
    f = engine_fit.fit_arrays(X, y)
    timing = ",".join(sorted(set(steps["timing"])))
    coef = {t: float(c) for t, c in zip(TERMS, f.coef[1:], strict=True) if c > 0}
    return CostModel(float(f.coef[0]), coef, f.r2, f.n, f.residual_ms, source, timing)


def fit_study(study_dir: Path) -> CostModel:
    return fit(load_steps(study_dir), source=str(study_dir))


def step_error(model: CostModel, df: pd.DataFrame) -> dict[str, float]:
    """How well ``model`` prices another study's busy steps: mean signed and mean absolute error
    relative to the summed step time, the transfer error of the cost model alone."""
    steps = busy_steps(df)
    y = steps["step_ms"].to_numpy(dtype=float)
    p = model.predict(steps)
    return {"n_steps": int(len(y)), "total_rel_err": float(p.sum() / y.sum() - 1),
            "mape": float(np.mean(np.abs(p - y) / y))}
