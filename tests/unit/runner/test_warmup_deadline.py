"""Primes and warm-ups have a deadline of their own, as long as the point's: against an engine that
stalls, five warm-ups of request_timeout_s 2.5 s each take at most max_point_duration_s (4 s), not
12.5 s; the ones the deadline stopped are rows that say so."""

from __future__ import annotations

import pytest

from prefixstudy.config import load_config
from prefixstudy.results import load
from prefixstudy.study.orchestrate import run_study


@pytest.mark.slow
def test_warmups_stop_at_the_point_deadline(tmp_path):
    # Every request takes 3 s (four tokens, 1 s apart), longer than request_timeout_s.
    cfg = load_config(None, {"engine": {"kind": "echo", "decode_ms_per_token": 1000}, "executor": "local",
                             "out": str(tmp_path), "dataset.prefix_len": 32, "dataset.suffix_len": 4,
                             "dataset.output_len": 4, "sweep.rates": [100], "sweep.modes": ["on"],
                             "sweep.num_requests": 2, "sweep.warmup_requests": 5, "sweep.request_timeout_s": 2.5,
                             "sweep.max_point_duration_s": 4})
    res = load(run_study(cfg, progress=False))
    warm = res.requests[res.requests["warmup"]].sort_values("request_index")
    assert warm["error"].tolist() == [
        "unfinished: request_timeout_s (2.5 s) passed",
        "unfinished: the primes and warm-ups passed max_point_duration_s",
        *["unfinished: not sent, the primes and warm-ups passed max_point_duration_s"] * 3]
    (point,) = res.manifest["points"]
    # The deadline, not 5 x 2.5 s.  It counts from before the prime, and warmup_s from after it:
    # the prime (one token, no decode cost) takes milliseconds, so warmup_s ends a little short of
    # 4 s (3.998 s measured in a fresh-clone run); 0.5 s leaves room for a prime on a loaded machine.
    assert 3.5 <= point["warmup_s"] < 6.0
