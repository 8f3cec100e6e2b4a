"""Stage: sim.  The step-cost model the simulator prices its steps with, stored as JSON with its R²
and residuals.  A calibration run one step at a time gets the study's one step-cost fit
(``costmodel.engine_fit``: non-negative least squares over busy steps, the same idle-step rule and terms
as the report's)::

    step_ms = c0 + c_prefill·prefill_tokens + c_prefill_req·num_prefill_reqs + c_decode·decode_tokens
              (+ c_context·context_tokens where the data support it)

A term the fit leaves at 0 is left out of ``coef_ms``; without a context term the decode coefficient
carries the average KV read (``costmodel.transfer.transfer`` relies on that).

A calibration that ran vLLM's async scheduling (its default engine: the host schedules and launches
step K while step K-1 runs on the GPU) has two parts, both fitted by ``fit``:

* the GPU part, on the steps' GPU spans (``timing`` "gpu-span"), over ``ASYNC_GPU_TERMS``: piecewise
  linear in the step's GEMM rows (prompt plus decode tokens), decode tokens, prompt requests, a
  prompt-step indicator and the KV the step's requests hold (``kv_tokens``, each block once);
* the host part, the host's work to schedule and launch a step, h0 + h·decode_tokens +
  h''·prefix_queries (the prompt tokens the prefix cache hashes): step K starts once K-1 has ended and
  K is launched (``fit_host_paired``; the simulator holds the step, ``CostModel.launch_ms``).  It is
  fitted on the host stamps the same records keep (``host_step_ms``: a record runs from the previous
  one's output to this one's).  One record alone is shifted: a prompt step's ends before its GPU
  work does, and the records after it carry the wait.  Over ``HOST_WINDOW_STEPS`` consecutive steps
  the shifts cancel, so the fit matches each window's summed host records.

``fit_linear`` is the simpler form the accuracy tables compare it with: the linear GPU part below and a
host floor under each step's price, max(GPU part, host part) (``fit_host``).  Which model a
calibration gets is read from what it recorded (``async_recorded``), never assumed.

It reads iterations.parquet in both layouts: the engine-timed one (``timing`` "engine": step_ms is
busy time measured in the engine core) and the old one (``timing`` "frontend" or no such column:
step_ms is the gap between StatLogger records, so a step after an idle stretch carries the idle
gap; those are filtered, see ``costmodel.engine_fit.busy_steps``).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from prefixstudy.errors import UserError
from prefixstudy.costmodel import engine_fit
from prefixstudy.costmodel.step import ROW_TERMS, RowSegment, prompt_step, term_getter

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
    # What it prices and how it got there (``study.simulate``): the calibration's model and hardware
    # (``source``), the simulated ones (``target``), each term's scale factor (``scale``, 1 where
    # nothing changed) and what the transfer extrapolates (``extrapolations``).
    transfer: dict = field(default_factory=dict)
    # The host part of an async-scheduling calibration (``c0_ms``, ``coef_ms``, ``overlap`` where it is
    # the host's launch of each step, and from the fit the R² of its window sums, ``n_steps``,
    # ``n_windows``, ``binding_steps``); empty for one that ran one step at a time.  How the roofline
    # transfer carries it: ``costmodel.transfer.transfer``.
    host: dict = field(default_factory=dict)
    # A fit to request timestamps (``costmodel.timestamp_fit``): its error on the points it was fitted to.
    fit_error: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Each term's reader, once: the simulator prices every step it takes.  The segments of a
        # step's GEMM rows (``rows_A_B``) are priced together, in order of A, up to the step's rows.
        rows = {t: c for t, c in self.coef_ms.items() if isinstance(term_getter(t), RowSegment)}
        self._row_segments = tuple(sorted((term_getter(t).lo, term_getter(t).hi, c) for t, c in rows.items()))
        self._gpu_terms = tuple((c, term_getter(t)) for t, c in self.coef_ms.items() if t not in rows)
        self._host_terms = tuple((c, term_getter(t)) for t, c in self.host.get("coef_ms", {}).items())

    @property
    def pipelined(self) -> bool:
        """Whether the engine priced schedules step N+1 while step N runs (vLLM's async scheduling)."""
        return bool(self.host)

    @property
    def host_overlaps(self) -> bool:
        """Whether the host part is the host's work to schedule and launch a step, done while the
        step before runs on the GPU (``fit_host_paired``); otherwise it is a floor under the step's
        own price (``fit_host``)."""
        return self.host.get("overlap") == HOST_OVERLAP

    def gpu_ms(self, f) -> float:
        out = self.c0_ms + sum(c * get(f) for c, get in self._gpu_terms)
        if self._row_segments:
            rows = f.prefill_tokens + f.decode_tokens
            for lo, hi, c in self._row_segments:
                if rows <= lo:
                    break
                out += c * (min(rows, hi) - lo)
        return out

    def host_ms(self, f) -> float:
        return self.host["c0_ms"] + sum(c * get(f) for c, get in self._host_terms)

    def __call__(self, f) -> float:
        """The step's own time: its GPU part, or max(GPU part, host part) where the host part is a floor."""
        if self.host and not self.host_overlaps:
            return max(self.gpu_ms(f), self.host_ms(f))
        return self.gpu_ms(f)

    def launch_ms(self, f) -> float:
        """The host's time from scheduling the step to launching it, which the GPU waits for where it
        outlasts the step before (``costmodel.step.launch_ms``); 0 where the host part is priced in the step."""
        return self.host_ms(f) if self.host_overlaps else 0.0

    def predict(self, df: pd.DataFrame) -> np.ndarray:
        out = np.full(len(df), self.c0_ms)
        for t, c in self.coef_ms.items():
            out = out + c * term_column(df, t)
        return out

    def save(self, path: Path) -> None:
        d = asdict(self)
        for key in ("host", "fit_error"):  # fitted one step at a time on step records: the file as it always was
            if not d[key]:
                del d[key]
        Path(path).write_text(json.dumps(d, indent=2) + "\n")

    @classmethod
    def load(cls, path: Path) -> "CostModel":
        try:
            return cls(**json.loads(Path(path).read_text()))
        except (OSError, ValueError, TypeError) as e:
            raise UserError(f"{path}: not a step-cost model JSON ({e})") from None


def term_column(df: pd.DataFrame, name: str) -> np.ndarray:
    """Cost term ``name`` (``costmodel.step.term_getter``) of every step record in ``df``, column-wise."""
    get = term_getter(name)
    if isinstance(get, RowSegment):
        rows = df["prefill_tokens"].to_numpy(dtype=float) + df["decode_tokens"].to_numpy(dtype=float)
        return np.clip(rows - get.lo, 0, get.hi - get.lo)
    if get is prompt_step:
        return (df["prefill_tokens"].to_numpy(dtype=float) > 0).astype(float)
    return df[name].to_numpy(dtype=float)


def load_steps(study_dir: Path) -> pd.DataFrame:
    """A study's iterations in the engine-timed column names, whichever layout it was written in, with
    ``kv_tokens`` where the study recorded the KV cache's usage and block count (``with_kv_tokens``)."""
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
    return with_kv_tokens(study_dir, df)


def with_kv_tokens(study_dir: Path, steps: pd.DataFrame) -> pd.DataFrame:
    """``steps`` with ``kv_tokens`` (``costmodel.step.StepFeatures``): each step's ``kv_cache_usage`` (the share
    of the blocks, all but vLLM's null block, in use after its schedule) times its point's blocks less
    one and block size (manifest.json), to the whole block.  Unchanged where either is not recorded."""
    manifest = Path(study_dir) / "manifest.json"
    if "kv_cache_usage" not in steps or not manifest.exists():
        return steps
    pts = pd.DataFrame(json.loads(manifest.read_text()).get("points") or [])
    keys = ["mode", "rate", "repeat"]
    if not {"num_blocks", "block_size", *keys} <= set(pts) or not set(keys) <= set(steps):
        return steps
    pts = pts.drop_duplicates(keys).set_index(keys)
    at = pd.MultiIndex.from_frame(steps[keys])
    blocks, size = (pd.to_numeric(pts[c], errors="coerce").reindex(at).to_numpy(dtype=float)
                    for c in ("num_blocks", "block_size"))
    out = steps.copy()
    out["kv_tokens"] = np.round(steps["kv_cache_usage"].to_numpy(dtype=float) * (blocks - 1)) * size
    return out


busy_steps = engine_fit.busy_steps


def async_recorded(study_dir: Path, df: pd.DataFrame) -> bool:
    """Whether a calibration study ran vLLM's async scheduling, from what it recorded: its config's
    ``engine.async_scheduling`` where set, else its step records' timing: "engine-async" and
    "gpu-span" (recorded only by an in-process GPU engine, where vLLM's default is async scheduling
    on) say async, "engine" says one step at a time."""
    from prefixstudy.config import load_config

    setting = getattr(load_config(Path(study_dir) / "config.yaml").engine, "async_scheduling", None)
    if setting is not None:
        return bool(setting)
    return bool(df["timing"].isin(("engine-async", "gpu-span")).any())


def _fit_part(X: np.ndarray, y: np.ndarray) -> tuple[float, dict[str, float], engine_fit.StepFit]:
    f = engine_fit.fit_arrays(X, y)
    return float(f.coef[0]), {t: float(c) for t, c in zip(TERMS, f.coef[1:], strict=True) if c > 0}, f


def check_async_records(df: pd.DataFrame, source: str) -> None:
    """Refuse, in one line, a default-engine calibration whose steps are not all GPU-timed with host stamps."""
    if set(df["timing"]) != {"gpu-span"} or "host_step_ms" not in df or df["host_step_ms"].isna().any():
        raise UserError(f"--calibration {source}: it ran vLLM's async scheduling, but its steps are not all timed "
                        f"on the GPU with host stamps beside them (timing {','.join(sorted(set(df['timing'])))}); "
                        f"no per-step cost to fit")


def _enough(steps: pd.DataFrame, n_cols: int, source: str) -> None:
    if not len(steps) or len(steps) < n_cols + 2:
        raise UserError(f"--calibration {source}: only {len(steps)} busy steps, too few to fit a step cost")


def fit(df: pd.DataFrame, source: str = "", async_scheduling: bool = False) -> CostModel:
    """The calibration's step cost as the simulator prices it: for a study run one step at a time the
    linear fit (``fit_linear``); for vLLM's default engine (``async_scheduling``) the GPU part over
    ``ASYNC_GPU_TERMS`` and the host's launch of each step (``fit_terms``, ``fit_host_paired``)."""
    if async_scheduling:
        return fit_terms(df, source, ASYNC_GPU_TERMS, launch=True)
    return fit_linear(df, source)


def fit_linear(df: pd.DataFrame, source: str = "", async_scheduling: bool = False) -> CostModel:
    """The study's step-cost fit (``costmodel.engine_fit``) as a ``CostModel``.  No outlier is
    dropped: with frontend timing a late record's long gap is paid back by the next one's short
    gap, and dropping the long ones alone would bias the sum.  ``async_scheduling``: the study ran
    vLLM's async scheduling; the GPU part is fitted on the GPU spans, and a host part as a floor under
    each step on the host stamps of the same steps (``fit_host``).  The default engine's priced form is
    ``fit``'s; this one is the form the other forms are compared with."""
    if async_scheduling:
        check_async_records(df, source)
    steps = busy_steps(df)
    X, y = engine_fit.design(steps), steps["step_ms"].to_numpy(dtype=float)
    _enough(steps, len(engine_fit.identified(X)) if len(steps) else 0, source)
    c0, coef, f = _fit_part(X, y)
    timing = ",".join(sorted(set(steps["timing"])))
    host = fit_host(steps) if async_scheduling else {}
    return CostModel(c0, coef, f.r2, f.n, f.residual_ms, source, timing, host=host)


# The GPU part of a default-engine step (``fit``): piecewise linear and non-decreasing in the step's
# GEMM rows (prompt plus decode tokens, ``costmodel.step.ROW_TERMS``), so that a lone prompt step does not pay
# a decode step's fixed cost on top; decode tokens and prompt requests; 1 where the step computes
# prompt tokens; and the KV the cache holds for the step's requests, each block once (a cached prefix
# many requests share is read about once).  Each a non-negative least-squares coefficient.
ASYNC_GPU_TERMS = ROW_TERMS + ("decode_tokens", "num_prefill_reqs", "prompt_step", "kv_tokens")


def design(steps: pd.DataFrame, terms: tuple[str, ...]) -> np.ndarray:
    """One row per step: 1, then each of ``terms`` (``term_column``)."""
    return np.column_stack([np.ones(len(steps))] + [term_column(steps, t) for t in terms])


def fit_terms(df: pd.DataFrame, source: str, terms: tuple[str, ...], launch: bool = False) -> CostModel:
    """A default-engine ``CostModel`` whose GPU part is the non-negative least squares over ``terms``
    (any term ``costmodel.step.term_getter`` reads) on the GPU spans, with the host's launch of each step
    while the one before runs (``launch``: ``fit_host_paired``) or a host floor under each step
    (``fit_host``)."""
    check_async_records(df, source)
    if "kv_tokens" in terms and ("kv_tokens" not in df or df["kv_tokens"].isna().any()):
        raise UserError(f"--calibration {source}: its steps do not record the KV cache's usage with its block "
                        f"count (kv_cache_usage, manifest num_blocks); no KV term to fit")
    steps = busy_steps(df)
    _enough(steps, len(terms) + 1, source)
    X, y = design(steps, terms), steps["step_ms"].to_numpy(dtype=float)
    coef = engine_fit.nnls(X, y)
    resid = y - X @ coef
    r2 = 1.0 - float((resid ** 2).sum()) / float(((y - y.mean()) ** 2).sum())
    host = fit_host_paired(steps) if launch else fit_host(steps)
    return CostModel(float(coef[0]), {t: float(c) for t, c in zip(terms, coef[1:], strict=True) if c > 0}, r2,
                     len(steps), engine_fit.residual_stats(resid), source,
                     ",".join(sorted(set(steps["timing"]))), host=host)


HOST_TERMS = ("decode_tokens", "num_prefill_reqs")
PAIRED_HOST_TERMS = ("decode_tokens", "prefix_queries")
HOST_OVERLAP = "previous step"  # CostModel.host["overlap"] of a host part fitted by fit_host_paired
HOST_WINDOW_STEPS = 16  # consecutive busy steps of one point: long enough that a record's shift stays inside


def host_windows(steps: pd.DataFrame) -> np.ndarray:
    """Each busy step's window (``busy_steps`` order): ``HOST_WINDOW_STEPS`` consecutive steps of one engine
    series (point, replica)."""
    series = steps.groupby(engine_fit.engine_keys(steps), sort=False).ngroup().to_numpy()
    pos = steps.groupby(series).cumcount().to_numpy()
    return steps.groupby([series, pos // HOST_WINDOW_STEPS], sort=False).ngroup().to_numpy()


def fit_host(steps: pd.DataFrame) -> dict:
    """The host part of an async-scheduling calibration from its busy steps (``busy_steps``) as a floor
    under each step's price: the non-negative (h0, h, h') minimising, over the windows, the squared
    error of the summed max(GPU span, host part) against the summed host records.  The search
    (``_fit_windows``) starts at the median host record with no slopes, a host part above some GPU spans,
    so that the error moves with every coefficient from the start.  Where the host is never the
    slower pipeline the error cannot tell one host part from another below the GPU spans, and the
    search ends at one of them: ``binding_steps`` says at how many steps the part is the larger."""
    gpu = steps["step_ms"].to_numpy(dtype=float)
    return _fit_windows(steps, HOST_TERMS, lambda host: np.maximum(gpu, host), gpu)


def previous_gpu_ms(steps: pd.DataFrame) -> np.ndarray:
    """Each busy step's predecessor's GPU span in its engine series (``busy_steps`` order); 0 for a
    series' first step, which nothing ran before."""
    gpu = steps["step_ms"].to_numpy(dtype=float)
    series = steps.groupby(engine_fit.engine_keys(steps), sort=False).ngroup().to_numpy()
    prev = np.r_[0.0, gpu[:-1]]
    prev[np.r_[True, series[1:] != series[:-1]]] = 0.0
    return prev


def fit_host_paired(steps: pd.DataFrame) -> dict:
    """The host part as vLLM's async loop spends it: the host schedules and launches step K while
    step K-1 runs on the GPU, so K starts max(K-1's GPU span, K's host part) after K-1 did, and the
    GPU waits where the host part is the longer.  (h0, h, h'') over ``PAIRED_HOST_TERMS``: a step's
    decode tokens, and the prompt tokens the prefix cache looks up, which the host hashes.  A host
    record ends at its step's output, so K's record spans end to end: max(K-1's GPU span, K's host
    part) + K's span - K-1's.  Fitted as ``fit_host`` is, on each window's sum of those against its
    summed host records; ``binding_steps`` counts the steps whose launch the GPU waited for."""
    prev, gpu = previous_gpu_ms(steps), steps["step_ms"].to_numpy(dtype=float)
    out = _fit_windows(steps, PAIRED_HOST_TERMS, lambda host: np.maximum(prev, host) + gpu - prev, prev)
    return {**out, "overlap": HOST_OVERLAP}


def _fit_windows(steps: pd.DataFrame, terms: tuple[str, ...], period, floor: np.ndarray) -> dict:
    """The non-negative host coefficients over ``terms`` whose ``period(host part)``, summed over each
    window, best matches the window's summed host records.  Coordinate search: each coefficient moved
    up or down by its step, the first move that lowers the error taken, every step halved when none
    does."""
    records = steps["host_step_ms"].to_numpy(dtype=float)
    X = np.column_stack([np.ones(len(steps))] + [steps[t].to_numpy(dtype=float) for t in terms])
    win = host_windows(steps)
    n = int(win.max()) + 1
    target = np.bincount(win, records, n)

    def loss(h: np.ndarray) -> float:
        return float(((np.bincount(win, period(X @ h), n) - target) ** 2).sum())

    h = np.zeros(X.shape[1])
    h[0] = float(np.median(records))
    step = np.array([h[0] / 4] + [0.05] * len(terms))
    best = loss(h)
    while step.max() > 1e-5:
        for j, sign in ((j, sign) for j in range(len(h)) for sign in (1, -1)):
            cand = h.copy()
            cand[j] = max(0.0, cand[j] + sign * step[j])
            if (c := loss(cand)) < best:
                best, h = c, cand
                break
        else:
            step = step / 2
    ss = float(((target - target.mean()) ** 2).sum())
    return {"c0_ms": float(h[0]), "coef_ms": {t: float(c) for t, c in zip(terms, h[1:], strict=True) if c > 0},
            "r2": 1.0 - best / ss if ss > 0 else math.nan, "n_steps": len(steps), "n_windows": n,
            "binding_steps": int((X @ h > floor).sum())}


def fit_study(study_dir: Path) -> CostModel:
    df = load_steps(study_dir)
    return fit(df, source=str(study_dir), async_scheduling=async_recorded(study_dir, df))


def step_error(model: CostModel, df: pd.DataFrame) -> dict[str, float]:
    """How well ``model`` prices another study's busy steps: mean signed and mean absolute error
    relative to the summed step time, the transfer error of the cost model alone."""
    steps = busy_steps(df)
    y = steps["step_ms"].to_numpy(dtype=float)
    p = model.predict(steps)
    return {"n_steps": int(len(y)), "total_rel_err": float(p.sum() / y.sum() - 1),
            "mape": float(np.mean(np.abs(p - y) / y))}
