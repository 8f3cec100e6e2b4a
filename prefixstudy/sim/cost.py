"""Stage: sim.  The step-cost model: what one engine step costs, fitted to an engine's own steps.

    step_ms = c0 + c_prefill·prefill_tokens + c_decode·decode_tokens + c_context·context_tokens
              + c_prefill_req·num_prefill_reqs  (+ c_batch·num_reqs)

fitted by least squares on a study's busy steps and stored as JSON with its R² and residuals.
No term may cost less than nothing: the most negative one is dropped and the rest refitted until
none is (with one prompt length, context tokens are decode tokens × ~1300 and the pair split into
−4.3 and +0.0034 ms on h200-tp2: fine in-sample, 350 % wrong once the roofline scales the two
terms differently).  The prefill-request term is the one the report's engine fit has
(``metrics.engine_fit``): a step that computes any prompt tokens costs more than its tokens
(vLLM runs mixed batches outside its full CUDA graphs).
It reads iterations.parquet in both layouts: the engine-timed one (``timing`` "engine": step_ms is
busy time measured in the engine core) and the old one (``timing`` "frontend" or no such column:
step_ms is the gap between StatLogger records, so a step after an idle stretch carries the idle
gap; those are filtered, see ``busy_steps``).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from prefixstudy.errors import UserError

# The batch term (num_reqs) is left out by default: with one output token per decoding request it
# is nearly collinear with decode_tokens, and on h200-tp1 it turned the pair into -2.0 / +2.1 ms.
TERMS = ("prefill_tokens", "decode_tokens", "context_tokens", "num_prefill_reqs")
ALL_TERMS = TERMS + ("num_reqs",)
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
    if "num_reqs" not in df:
        if {"num_prefill_reqs", "num_decode_reqs"} <= set(df):
            df["num_reqs"] = df["num_prefill_reqs"] + df["num_decode_reqs"]
        elif "num_running" in df:
            df["num_reqs"] = df["num_running"]  # after the step: a finished request is not counted
        else:
            df["num_reqs"] = df["decode_tokens"] + (df["prefill_tokens"] > 0)
    if "repeat" not in df:
        df["repeat"] = 0
    return df


def busy_steps(df: pd.DataFrame) -> pd.DataFrame:
    """Steps that did work and whose step_ms is that work only.  With frontend timing a record's
    step_ms is the gap since the previous record, so the first record of a point, any record after
    one without work (the engine was idle in between) and records without work are dropped."""
    work = (df["prefill_tokens"] + df["decode_tokens"]) > 0
    keep = work & df["step_ms"].notna() & (df["step_ms"] > 0)
    frontend = df["timing"].eq("frontend")
    if frontend.any():
        keys = [df["mode"], df["rate"], df["repeat"]]
        prev_work = work.groupby(keys).shift(1, fill_value=False).astype(bool)
        keep &= ~frontend | prev_work
    return df[keep]


def fit(df: pd.DataFrame, terms: tuple[str, ...] = TERMS, source: str = "") -> CostModel:
    """Least squares on busy steps; a term whose column is missing, empty or constant is left out
    (coefficient 0), and so is a term that comes out negative (see the module doc).  No outlier is
    dropped: with frontend timing a late record's long gap is paid back by the next one's short
    gap, and dropping the long ones alone would bias the sum."""
    steps = busy_steps(df)
    use = [t for t in terms if t in steps and steps[t].notna().all() and steps[t].nunique() > 1]
    if len(steps) < len(use) + 2:
        raise UserError(f"--calibration {source}: only {len(steps)} busy steps, too few to fit a step cost")
    y = steps["step_ms"].to_numpy(dtype=float)
    while True:
        x = np.column_stack([np.ones(len(steps))] + [steps[t].to_numpy(dtype=float) for t in use])
        beta = np.linalg.lstsq(x, y, rcond=None)[0]
        if not use or beta[1:].min() >= 0:
            break
        del use[int(np.argmin(beta[1:]))]
    resid = y - x @ beta
    r2 = 1.0 - float(np.sum(resid ** 2)) / float(np.sum((y - y.mean()) ** 2))
    a = np.abs(resid)
    stats = {"mean": float(resid.mean()), "std": float(resid.std()), "p50_abs": float(np.percentile(a, 50)),
             "p90_abs": float(np.percentile(a, 90)), "p99_abs": float(np.percentile(a, 99))}
    timing = ",".join(sorted(set(steps["timing"])))
    return CostModel(float(beta[0]), {t: float(b) for t, b in zip(use, beta[1:])}, r2, len(y), stats,
                     source, timing)


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
