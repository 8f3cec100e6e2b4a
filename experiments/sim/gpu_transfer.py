"""The roofline transfer to another GPU kind, on vLLM's default engine.

    PYTHONPATH=. python experiments/sim/gpu_transfer.py [--out experiments/results/sim-accuracy]

h200-tp1 (one H200) and h100-tp1-spans (one H100) ran the same config on vLLM's default engine, every
step timed on the GPU.  Each is fitted as ``prefixstudy simulate --calibration`` fits it
(``costmodel.step_cost.fit``), carried to the other's GPU by the datasheet roofline (``costmodel.transfer.transfer``:
each term by its roofline ratio, each part's fixed cost beyond the source's roofline kept), and every
point of the other study is simulated, each repeat on its own arrival schedule:

* **transfer from SRC**: what ``prefixstudy simulate --calibration SRC --gpu DST`` predicts;
* **transfer from SRC, the host unchanged**: the same GPU part, the source's host launch as it was
  fitted (the rule had the launch been the host's CPU work alone);
* **transfer from SRC, the target's host**: the same GPU part with the target's own host launch (its
  fit on the target's host stamps), which a user without a run on the target does not have.  What is
  left is what the GPU roofline misses.

Writes gpu-transfer.csv (one row per point, repeat and check) and gpu-transfer.md (per check: the
counts of ``accuracy_async.summary``, and each side's fitted host launch).  It measures a transfer
between two GPU kinds at TP 1, on two machines; the TP degree and any other GPU kind are not checked.
"""

from __future__ import annotations

import argparse
import functools
import sys
from dataclasses import replace
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).parent))
import accuracy_async  # noqa: E402

from prefixstudy.config import load_config  # noqa: E402
from prefixstudy.costmodel.arch import load_arch  # noqa: E402
from prefixstudy.costmodel.roofline import Deployment  # noqa: E402
from prefixstudy.costmodel.step_cost import fit, load_steps  # noqa: E402
from prefixstudy.costmodel.transfer import transfer  # noqa: E402
from prefixstudy.study.simulate import calibration_hardware, mean_context_tokens  # noqa: E402
from prefixstudy.workloads import load_rows  # noqa: E402

RESULTS = Path("experiments/results")
PAIRS = (("h200-tp1", "h100-tp1-spans"), ("h100-tp1-spans", "h200-tp1"))
UNCHANGED, OWN_HOST = ", the host unchanged", ", the target's host"


@functools.cache
def fitted(name: str, results: Path = RESULTS):
    """A study's fit as ``prefixstudy simulate --calibration`` makes it, once per study."""
    return fit(load_steps(results / name), str(results / name), async_scheduling=True)


def carried(src: str, dst: str, results: Path = RESULTS):
    """``src``'s fit, the same carried to ``dst``'s GPU and TP degree, and ``dst``'s own fit (for its host)."""
    cfg = load_config(results / dst / "config.yaml")
    arch = load_arch(cfg.model)
    model = transfer(fitted(src, results), Deployment(arch, *calibration_hardware(results / src)[:2]),
                     Deployment(arch, *calibration_hardware(results / dst)[:2]), mean_context_tokens(load_rows(cfg)))
    return fitted(src, results), model, fitted(dst, results)


def rows(results: Path = RESULTS) -> list[dict]:
    """Every point of each pair's target simulated with each check's model, with the model's period
    error on the target's real steps at that point (``accuracy_async.period_error``)."""
    out = []
    for src, dst in PAIRS:
        source_fit, model, own = carried(src, dst, results)
        steps = load_steps(results / dst)
        checks = ((f"transfer from {src}", model), (f"transfer from {src}{UNCHANGED}", replace(model, host=source_fit.host)),
                  (f"transfer from {src}{OWN_HOST}", replace(model, host=own.host)))
        for check, m in checks:
            for r in accuracy_async.simulate_points(results / dst, lambda mode, rate, m=m: m, check):
                at = steps[(steps["mode"] == r["mode"]) & (steps["rate"] == r["rate"]) & (steps["repeat"] == r["repeat"])]
                out.append({**r, "study": dst, "calibration": src, "cost_busy_err": accuracy_async.period_error(m, at)})
    return out


def hosts(results: Path = RESULTS) -> str:
    lines = ["| study | GPU | host's launch, fitted on its host stamps (ms) |", "|---|---|---|"]
    for name in dict.fromkeys(s for pair in PAIRS for s in pair):
        h = fitted(name, results).host
        terms = " + ".join(f"{c:.4g}·{t}" for t, c in h["coef_ms"].items())
        lines.append(f"| {name} | {calibration_hardware(results / name)[0].name} | {h['c0_ms']:.3f} + {terms} |")
    return "\n".join(lines) + "\n"


def write(df: pd.DataFrame, out: Path, results: Path = RESULTS) -> None:
    df.to_csv(out / "gpu-transfer.csv", index=False)
    text = accuracy_async.summary(accuracy_async.per_point(df)) + "\n" + hosts(results)
    (out / "gpu-transfer.md").write_text(text)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=RESULTS / "sim-accuracy")
    ap.add_argument("--tables-only", action="store_true", help="Only rewrite gpu-transfer.md from gpu-transfer.csv.")
    a = ap.parse_args()
    df = pd.read_csv(a.out / "gpu-transfer.csv") if a.tables_only else pd.DataFrame(rows())
    write(df, a.out)
    print(f"wrote {a.out}/gpu-transfer.csv, gpu-transfer.md", file=sys.stderr)


if __name__ == "__main__":
    main()
