"""Stage: results.  An older run folder's records brought to today's shape, in one place.

``migrate`` runs once on what a folder holds, right after it is read (``results.load``, the finish of
a run, a resume, a calibration).  Everything past it sees today's records only.  Each rule names the
runs it serves:

* runs before engine step timing (StatLogger records): iterations without ``prefill_tokens``.  Their
  ``timing`` is ``frontend``, their prefill and decode tokens are the old ``prompt_tokens`` and
  ``generation_tokens``, and a step starts ``step_ms`` before its end ``t_s``;
* runs before repeats: a summary or requests without ``repeat``.  Each point ran once: repeat 0.
  Iterations get theirs from the typed frames' default (``schema.typed_iterations``).

The manifest passes through as it is: readers of its points take a missing repeat as 0
(``schema.point_key``).
"""

from __future__ import annotations

import pandas as pd

Frames = dict[str, pd.DataFrame]  # "requests", "iterations", "summary": whichever the caller read


def migrate(frames: Frames, manifest: dict) -> tuple[Frames, dict]:
    """``frames`` and ``manifest`` of one run folder in today's shape (module doc); a frame the caller
    did not read is left out, and what is already today's is returned unchanged."""
    out = dict(frames)
    if "iterations" in out:
        out["iterations"] = _iterations_before_step_timing(out["iterations"])
    for name in ("summary", "requests"):
        if name in out:
            out[name] = _before_repeats(out[name])
    return out, manifest


def _iterations_before_step_timing(df: pd.DataFrame) -> pd.DataFrame:
    if len(df.columns) == 0 or "prefill_tokens" in df:
        return df
    df = df.copy()
    df["timing"] = df["timing"] if "timing" in df else "frontend"
    df["prefill_tokens"] = df.get("prompt_tokens", 0)
    df["decode_tokens"] = df.get("generation_tokens", 0)
    if "t_s" in df and "step_ms" in df:
        df["step_start_s"] = df["t_s"] - df["step_ms"] / 1e3
    return df


def _before_repeats(df: pd.DataFrame) -> pd.DataFrame:
    if "repeat" in df or len(df.columns) == 0:
        return df
    df = df.copy()
    df.insert(min(2, len(df.columns)), "repeat", 0)
    return df
