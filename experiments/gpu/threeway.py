"""The three-way table: the seed workload on one H200 per mode at 1, 4, 16 and 32 req/s,
measured in-process (experiments/results/h200-tp1: vLLM's default engine, a later lease), through
`vllm serve` launched by prefixstudy (h200-vllm-server) and by `vllm bench serve` against servers
with the same command line plus the tokenizer the peer needs (h200-threeway/bench-summary.json).
Writes h200-threeway/threeway.{csv,md}.

Per way, mode and rate: the repeats' mean of each point's mean, and the repeats' range.  The gap
columns compare prefixstudy's HTTP path (vllm-server) with the peer: E2E in % of the peer's, TTFT
in ms.  A saturated point's latency is a bound (it grows with how long the point ran), so its gap
is not a fidelity measure.

    .venv/bin/python experiments/gpu/threeway.py
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pandas as pd

RESULTS = Path(__file__).resolve().parents[1] / "results"
OUT = RESULTS / "h200-threeway"
RATES = [1.0, 4.0, 16.0, 32.0]
METRICS = {"e2e": ("mean_e2e_ms", "mean_e2el_ms"), "ttft": ("mean_ttft_ms", "mean_ttft_ms"),
           "tpot": ("mean_tpot_ms", "mean_tpot_ms")}


def prefixstudy_points(run: str, way: str) -> pd.DataFrame:
    s = pd.read_csv(RESULTS / run / "summary.csv")
    s = s[s["rate"].isin(RATES) & (s["status"] == "ok")]
    return pd.DataFrame({"way": way, "mode": s["mode"], "rate": s["rate"], "repeat": s["repeat"],
                         "lease": 1, "arrival_rate": s["arrival_rate"], "saturated": s["saturated"].astype(bool),
                         **{m: s[c] for m, (c, _) in METRICS.items()}})


def bench_points() -> pd.DataFrame:
    rows = []
    for name, r in json.loads((OUT / "bench-summary.json").read_text()).items():
        mode, rate, *rep = name.split("-")
        rows.append({"way": "vllm bench serve", "mode": mode, "rate": float(rate),
                     "repeat": int(rep[0][1:]) if rep else 0, "lease": r["lease"],
                     # the peer reports completions over its duration, not the offered schedule; it
                     # fell behind where they came at under 90 % of the rate (25 of 32 req/s OFF)
                     "arrival_rate": r["request_throughput"],
                     "saturated": float(rate) >= 2 and r["request_throughput"] < 0.9 * float(rate),
                     **{m: r[c] for m, (_, c) in METRICS.items()}})
    return pd.DataFrame(rows)


def table(points: pd.DataFrame) -> pd.DataFrame:
    g = points.groupby(["mode", "rate", "way"], sort=False)
    out = g.agg(n=("e2e", "size"), arrival_rate=("arrival_rate", "mean"), saturated=("saturated", "any"),
                **{f"{m}_ms": (m, "mean") for m in METRICS}, e2e_min_ms=("e2e", "min"), e2e_max_ms=("e2e", "max"))
    return out.reset_index()


def gaps(t: pd.DataFrame, way: str, peer: str = "vllm bench serve") -> pd.DataFrame:
    a = t[t["way"] == way].set_index(["mode", "rate"])
    b = t[t["way"] == peer].set_index(["mode", "rate"])
    return pd.DataFrame({"e2e_gap_pct": 100 * (a["e2e_ms"] / b["e2e_ms"] - 1), "ttft_gap_ms": a["ttft_ms"] - b["ttft_ms"],
                         "tpot_gap_ms": a["tpot_ms"] - b["tpot_ms"],
                         "saturated": a["saturated"] | b["saturated"]}
                        ).reset_index().assign(way=way)


def tokenize_ms(n: int = 200) -> float:
    """What the peer's server does and prefixstudy's does not: turn a 1215-token text prompt into
    ids (the mistral_common v3 tokenizer, as the servers load it), median over ``n``, this CPU."""
    import os

    import mistral_common
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    tok = MistralTokenizer.from_file(os.path.join(os.path.dirname(mistral_common.__file__), "data",
                                                  "mistral_instruct_tokenizer_240323.model.v3"))
    raw = tok.instruct_tokenizer.tokenizer
    text = raw.decode(list(range(1000, 2215)))
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        raw.encode(text, bos=True, eos=False)
        times.append((time.perf_counter() - t0) * 1e3)
    return float(pd.Series(times).median())


def main() -> None:
    points = pd.concat([prefixstudy_points("h200-tp1", "in-process"),
                        prefixstudy_points("h200-vllm-server", "vllm-server (HTTP)"), bench_points()], ignore_index=True)
    t = table(points)
    t.to_csv(OUT / "threeway.csv", index=False)
    g = pd.concat([gaps(t, "vllm-server (HTTP)"), gaps(t, "in-process")], ignore_index=True)
    same = bench_points().query("lease == 1").pipe(table)  # the peer's lease-1 repeat: the vllm-server run's machine
    same = pd.concat([same, t[t["way"] == "vllm-server (HTTP)"]], ignore_index=True)
    g1 = gaps(same, "vllm-server (HTTP)").assign(way="vllm-server (HTTP), lease 1 only")
    tok = tokenize_ms()
    lines = ["# Three ways on one H200 per mode: in-process, vllm-server, vllm bench serve", "",
             "Seed workload (1198 shared + 16 unique prompt tokens, 143 output, Mistral-7B-v0.3 dummy bf16), "
             "vLLM 0.26.0, caching ON on GPU 0 and OFF on GPU 1. Means over repeats; E2E range in brackets.", "",
             "Arrival: the actual arrival rate of prefixstudy's schedule; for the peer its request throughput "
             "(what it reports). The two draw their Poisson schedules apart.", "",
             "| mode | rate | way | n | arrival req/s | mean E2E ms [range] | TTFT ms | TPOT ms |",
             "|---|---|---|---|---|---|---|---|"]
    for r in t.sort_values(["mode", "rate"], ascending=[False, True], kind="stable").itertuples():
        mark = " (saturated: a bound)" if r.saturated else ""
        lines.append(f"| {r.mode.upper()} | {r.rate:g} | {r.way} | {r.n} | {r.arrival_rate:.2f} | {r.e2e_ms:.1f} "
                     f"[{r.e2e_min_ms:.1f}, {r.e2e_max_ms:.1f}]{mark} | {r.ttft_ms:.1f} | {r.tpot_ms:.2f} |")
    lines += ["", "## Against the peer", "",
              "| way | mode | rate | E2E gap % | TTFT gap ms | TPOT gap ms | saturated |", "|---|---|---|---|---|---|---|"]
    for r in pd.concat([g, g1]).dropna(subset=["e2e_gap_pct"]).itertuples():
        lines.append(f"| {r.way} | {r.mode.upper()} | {r.rate:g} | {r.e2e_gap_pct:+.1f} | {r.ttft_gap_ms:+.1f} | "
                     f"{r.tpot_gap_ms:+.2f} | {'yes' if r.saturated else ''} |")
    lines += ["", f"Tokenizing one 1215-token text prompt (mistral_common v3, what the peer's server does per "
                  f"request and prefixstudy's token-id requests skip): median {tok:.2f} ms on this CPU.", ""]
    (OUT / "threeway.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
