"""The numbers README.md quotes, regenerated from the committed study files.

The headline block at the top of README.md (between ``<!-- readme_numbers: headline -->`` and
``<!-- /readme_numbers -->``), and the per-rate tables of experiments/results/README.md (between
``<!-- readme_numbers: table STUDY -->`` and the same end marker), are rendered here from experiments/results/h200-tp1
(headline.csv, summary.csv, manifest.json's step fit) and h200-tp2 (headline.csv), with the same definitions the
report uses (``metrics.headline``: knee, rate at a threshold; the threshold is twice OFF's p90 E2E
at the lowest rate, the repeats' mean, as the report's default).

    python experiments/readme_numbers.py            # print the blocks
    python experiments/readme_numbers.py --write    # replace them in the READMEs
    python experiments/readme_numbers.py --check    # exit 1 if a README differs

tests/unit/report/test_readme_numbers.py fails when README.md and the files disagree.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import sys
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "experiments/results"
README = REPO / "README.md"
BEGIN, END = "<!-- readme_numbers: headline -->", "<!-- /readme_numbers -->"
STEADY_SPREAD_PCT = 10.0  # OFF's (max - min) / mean of its repeats' mean E2E at the headline's mid rate


def _ci(v: float, lo: float, hi: float, spec: str = ".0f", scale: float = 1.0) -> str:
    return f"{v * scale:{spec}} [{lo * scale:{spec}}, {hi * scale:{spec}}]"


def _signed(v: float, spec: str) -> str:
    return format(v, spec).replace("-", "−")


def _gain(h: pd.Series) -> str:
    lo, hi = (_signed(100 * h[f"gain_mean_e2e_{e}"], ".1f") for e in ("lo", "hi"))
    return f"{_signed(100 * h['gain_mean_e2e'], '.1f')} % [{lo}, {hi}]"


def async_lower(sync_dir: Path, async_dir: Path) -> pd.Series:
    """Per (mode, rate) both studies ran and kept up at in every repeat: how much lower the async
    study's mean E2E is than the sync one's, (sync - async) / sync in %, from
    experiments/gpu/async_effect.py's table (means over the repeats' means; its ``change_pct`` is the
    sync engine's excess, sync / async - 1).  A saturated point's mean is a bound, not compared."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("async_effect", REPO / "experiments/gpu/async_effect.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    sync, async_ = pd.read_csv(sync_dir / "summary.csv"), pd.read_csv(async_dir / "summary.csv")
    table, _ = mod.async_effect(sync, async_)
    excess = table[("change_pct", "mean_e2e_ms")].dropna()
    saturated = set()
    for s in (sync, async_):
        saturated |= set(s.loc[s["saturated"].astype(bool), ["mode", "rate"]].itertuples(index=False, name=None))
    excess = excess[[k not in saturated for k in excess.index]]
    return (100 * (1 - 1 / (1 + excess / 100))).sort_index()


def headline_block(results: Path = RESULTS) -> str:
    """The README's headline block, every number from the committed files (see the module doc)."""
    import yaml

    from prefixstudy.metrics.headline import knee_bracket, rate_at_threshold
    from prefixstudy.metrics.saturation import FULL_LEVEL, FULL_SHARE

    d = results / "h200-tp1"
    head = pd.read_csv(d / "headline.csv").sort_values("arrival_rate").reset_index(drop=True)
    summ = pd.read_csv(d / "summary.csv")
    manifest = json.loads((d / "manifest.json").read_text())
    fit, checks = manifest["step_fit"], manifest.get("step_checks") or {}
    repeats = int(head["n_repeats"].max())
    low = head.iloc[0]
    calm = head[(head["on_saturated_share"] == 0) & (head["off_saturated_share"] == 0)]
    # Nearer the knee a point can keep up and still be filling at its end: its repeats then differ
    # and its interval informs nothing.  The mid rate is the highest one whose OFF repeats agree.
    steady = calm[calm["off_spread_pct"] < STEADY_SPREAD_PCT]
    mid = steady.iloc[-1]
    all_sat = head[head["off_saturated_share"] == 1.0]
    off = summ[(summ["mode"] == "off") & (summ["status"] == "ok")]
    p90_low = float(off[off["rate"] == off["rate"].min()]["p90_e2e_ms"].mean())
    y = 2 * p90_low
    on_r, off_r = rate_at_threshold(head, "on", y), rate_at_threshold(head, "off", y)
    lines = [
        f"* at **{low['arrival_rate']:.2f} req/s** caching cut mean E2E from "
        f"{_ci(low['off_mean_e2e_ms'], low['off_mean_e2e_lo'], low['off_mean_e2e_hi'])} to "
        f"{_ci(low['on_mean_e2e_ms'], low['on_mean_e2e_lo'], low['on_mean_e2e_hi'])} ms, **{_gain(low)}**: "
        f"about one prefill, since prompts took {100 * low['off_engine_prefill_share']:.0f} % of OFF's busy "
        f"engine time;",
        f"* at **{mid['arrival_rate']:.1f} req/s**, the highest rate where neither mode saturated in any repeat "
        f"and OFF's repeats agreed within {STEADY_SPREAD_PCT:g} %, "
        f"from {_ci(mid['off_mean_e2e_ms'], mid['off_mean_e2e_lo'], mid['off_mean_e2e_hi'])} to "
        f"{_ci(mid['on_mean_e2e_ms'], mid['on_mean_e2e_lo'], mid['on_mean_e2e_hi'])} ms, **{_gain(mid)}**: "
        f"prompts took {100 * mid['off_engine_prefill_share']:.0f} % [{100 * mid['off_engine_prefill_share_lo']:.0f}, "
        f"{100 * mid['off_engine_prefill_share_hi']:.0f}] of OFF's engine time. " + _split_words(d, mid["rate"]),
    ]
    point_s = float(yaml.safe_load((d / "config.yaml").read_text())["sweep"]["min_duration_s"])
    for _, f in calm[calm["arrival_rate"] > mid["arrival_rate"]].iterrows():
        reps = summ[(summ["mode"] == "off") & (summ["rate"] == f["rate"])].sort_values("repeat")
        rises = ", ".join(f"{a:.0f}→{b:.0f}" for a, b in zip(reps["in_system_first"], reps["in_system_last"],
                                                             strict=True))
        lines.append(
            f"* at **{f['arrival_rate']:.1f} req/s** OFF kept up in every repeat, but its repeats' mean E2E differed "
            f"by {f['off_spread_pct']:.0f} % and the requests in its engine rose from the arrival window's first "
            f"third to its last ({rises}): a {point_s:g}-second point there ends before the engine settles, so the "
            f"{_gain(f)} gain informs little;")
    if len(all_sat):
        s = all_sat.iloc[0]
        rows = summ[(summ["mode"] == "off") & (summ["rate"] == s["rate"])].sort_values("repeat")
        limit = int(manifest["points"][0]["admission_limit"]) if manifest["points"][0].get("admission_limit") \
            else int(yaml.safe_load((d / "config.yaml").read_text())["engine"]["max_num_seqs"])
        share = rows["full_share"].min()
        why = (f"the engine ran full, at {100 * FULL_LEVEL:.0f} % or more of its {limit}-request limit through "
               + ("all" if share == 1 else f"at least {100 * share:.0f} %") + " of the arrival window's last half"
               if rows["full_share"].min() >= FULL_SHARE else "; ".join(rows["saturation_reason"]))
        lines.append(
            f"* at **{s['arrival_rate']:.1f} req/s** OFF saturated in all {len(rows)} repeats ({why}), so the "
            f"{100 * s['gain_mean_e2e']:.0f} % [{100 * s['gain_mean_e2e_lo']:.0f}, {100 * s['gain_mean_e2e_hi']:.0f}] "
            f"gain there is a lower bound. {knee_bracket(head, 'off')['text']}; "
            f"{knee_bracket(head, 'on')['text']}.")
    lines.append(
        f"* at a p90 E2E threshold of {y:.0f} ms (twice OFF's p90 at the lowest rate), caching ON sustains "
        f"**{on_r[0]:.1f} req/s [{on_r[1]:.1f}, {on_r[2]:.1f}]** and OFF **{off_r[0]:.1f} req/s "
        f"[{off_r[1]:.1f}, {off_r[2]:.1f}]**, interpolated where p90 crosses it: caching buys about "
        f"{on_r[0] / off_r[0]:.1f}× the throughput at that latency.")
    lines.append("* " + _closure_words(d, head))
    tp2 = pd.read_csv(results / "h200-tp2" / "headline.csv").sort_values("arrival_rate")
    tp2_calm = tp2[~tp2["on_saturated"].astype(bool) & ~tp2["off_saturated"].astype(bool)
                   & tp2["gain_mean_e2e"].notna()]  # both modes ran there
    t_lo, t_hi = tp2.iloc[0], tp2_calm.iloc[-1]
    lower = async_lower(results / "h200-tp1-sync", d)
    intro = (f"With async scheduling, vLLM's default, mean E2E was {lower.min():.0f}–{lower.max():.0f} % lower than "
             f"with it off (h200-tp1-sync: an earlier lease of another H200, at the {len(lower)} mode and rate pairs "
             f"where both engines kept up in every repeat). Means with 95 % intervals, Student's t over the "
             f"{repeats} repeats' means, at the actual arrival rates. " + _loo_words() + " An interval holds for "
             "the machine it ran on.")
    timed = "on the GPU (CUDA events around each step)" if manifest.get("step_timing") == ["gpu-span"] else \
        "inside vLLM's engine core"
    verdict = {True: ", and the records pass the step-timing checks (`prefixstudy check`)",
               False: ""}.get(checks.get("ok"), "")
    fit_text = (f"Every engine step is timed {timed}{verdict}; one non-negative least-squares step-cost "
                f"fit over {fit['n']:,} busy steps (R² {fit['r2']:.3f}) gives {fit['b_ms_per_prefill_token']:.3f} ms "
                f"per prompt token, {fit['e_ms_per_prefill_req']:.2f} ms per prefill request and "
                f"{fit['c_ms_per_decode_token']:.3f} ms per decode token"
                + (f" and {fit['k_ms_per_context_token']:.5f} ms per context token"
                   if fit.get("k_ms_per_context_token", 0) > 0 else "")
                + "." + _fit_kind_words(fit))
    fit_text += " " + _physics_words(d, results / "h200-tp1-sync")
    if checks.get("ok") is False:
        fit_text += (" These step records fail the step-timing checks (`metrics.step_checks`: time is misattributed "
                     "between neighbouring steps, likely by async scheduling in the in-process engine), so "
                     "read the prefill shares, the slowdown and these coefficients as provisional.")
    tp2_ok = (json.loads((results / "h200-tp2" / "manifest.json").read_text()).get("step_checks") or {}).get("ok")
    passes = {True: "; its steps pass the checks", False: "; its steps fail the checks"}.get(tp2_ok, "")
    fit_text += (f" At TP 2 through the Ray executor (one repeat{passes}): {_gain(t_lo)} at "
                 f"{t_lo['arrival_rate']:.2f} req/s and {_gain(t_hi)} at {t_hi['arrival_rate']:.1f} req/s.")
    return "\n".join([BEGIN, intro, "", *lines, "", fit_text, "", bench_sentence(results), END])


@functools.lru_cache(maxsize=4)
def _study(d: Path):
    """The study (read once for every sentence that needs its records) and its fit's coefficients."""
    from prefixstudy.metrics.engine_fit import COEF_NAMES
    from prefixstudy.results import load

    st = load(d)
    coef = [st.manifest["step_fit"].get(k, 0.0) for k in COEF_NAMES]
    return st, coef


def _fit_kind_words(fit: dict) -> str:
    """The pooled R² is carried by OFF's long prefill steps: say how well the fit does on ON's mixed steps."""
    on = next((k for k in fit.get("by_kind") or [] if k["mode"] == "on" and k["kind"] == "mixed"), None)
    if on is None:
        return ""
    return (f" That R² is carried by the spread between OFF's long prefill steps and the rest: on ON's {on['n']:,} "
            f"steps that carry prompt tokens it is {on['r2']:.2f} (RMSE {on['rmse_ms']:.1f} ms on a mean step of "
            f"{on['mean_ms']:.1f} ms).")


def _split_words(d: Path, rate: float) -> str:
    """metrics.gain_split at ``rate`` (configured), in words."""
    from prefixstudy.metrics.gain_split import gain_split, request_parts

    st, coef = _study(d)
    r = gain_split(request_parts(st.requests, st.iterations, coef)).set_index("rate").loc[rate]
    return (f"Split request by request (`metrics.gain_split`), {_signed(100 * r['prefill_stalls_points'], '.1f')} "
            f"of the gain's points are other requests' prompt chunks batched into each request's decode steps "
            f"(the stalls between its tokens), {_signed(100 * r['own_prefill_points'], '.1f')} its own prefill, "
            f"{_signed(100 * r['decode_steps_points'], '.1f')} the decode steps themselves and "
            f"{_signed(100 * r['queue_points'], '.1f')} queueing, with a residual of "
            f"{_signed(100 * r['residual_points'], '.1f')};")


def _closure_words(d: Path, head: pd.DataFrame) -> str:
    """model.closure's knees against the measured brackets, in words."""
    from prefixstudy.metrics.headline import knee_bracket
    from prefixstudy.metrics.requests import counted
    from prefixstudy.model.closure import arm_prediction

    st, coef = _study(d)
    req = counted(st.requests)
    limit = int(st.manifest["points"][0]["admission_limit"])
    pred = {m: arm_prediction(coef, g["prompt_tokens"].mean(), g["num_cached_tokens"].mean(), g["output_tokens"].mean(),
                              float(head[f"{m}_mean_ttft_ms"].iloc[0]), limit) for m, g in req.groupby("mode")}
    on, off = knee_bracket(head, "on"), knee_bracket(head, "off")
    sat_on = [(x, k, n) for x, k, n in on["mixed"]]
    measured_on = (f"ON saturated in {sat_on[-1][1]} of {sat_on[-1][2]} repeats at {sat_on[-1][0]:.1f} req/s, the "
                   f"highest rate run" if sat_on else on["text"])
    return (f"from the fitted step costs alone, TPOT ≈ a / (1 − λ·w) (`model.closure`: a = {coef[0]:.2f} ms a step, "
            f"w the engine time a request adds, {pred['off']['work_ms']:.1f} ms OFF and {pred['on']['work_ms']:.1f} ms "
            f"ON) puts OFF's knee at {pred['off']['knee_rate']:.1f} req/s and ON's at {pred['on']['knee_rate']:.1f} "
            f"(where its requests fill {100 * 0.8:.0f} % of its {limit}-request limit); measured, OFF's lies between "
            f"{off['lo']:.1f} and {off['hi']:.1f} req/s, and {measured_on}.")


def _loo_words() -> str:
    """benchmarks/interval_loo.json's coverage on the committed repeats, in words."""
    c = json.loads((REPO / "benchmarks/results/interval_loo.json").read_text())["summary"]

    def held(m):
        return f"{c[m]['covered']} of {c[m]['held_out']}"

    return (f"Coverage tested by simulation (`benchmarks/interval_coverage.py`) and on the committed repeats "
            f"(`benchmarks/interval_loo.py`): with one repeat left out, the others' t prediction held it in "
            f"{held('t_repeats')} cases (h200-tp1's, whose three repeats leave two: a wide t(1)), where the "
            f"requests' own noise alone held {held('within')} and with a "
            f"between-repeat variance pooled over the study's other rates {held('within_pooled')}: runs differ by "
            f"more than their requests' noise, so the intervals come from the repeats.")


def _physics_words(d: Path, sync: Path) -> str:
    """model.closure.physics of the study's fit on its GPU, and the sync engine's per-request cost."""
    from prefixstudy.configs import recorded_model_dir
    from prefixstudy.metrics.requests import counted
    from prefixstudy.model.arch import load_arch
    from prefixstudy.model.closure import physics
    from prefixstudy.model.gpus import get_gpu

    st, coef = _study(d)
    req = counted(st.requests)
    t = physics(coef, load_arch(recorded_model_dir(st.config["model"])), get_gpu(st.manifest["device"]),
                float((req["prompt_tokens"] + req["output_tokens"] / 2).mean())).set_index("coefficient")
    sync_e = json.loads((sync / "manifest.json").read_text())["step_fit"]["e_ms_per_prefill_req"]
    pct = {k: f"{100 * t.loc[k, 'share']:.0f} %" for k in t.index}
    return (f"Against the H200's datasheet (`model.closure.physics`), reading every weight once explains {pct['a_ms']} "
            f"of a step's fixed {coef[0]:.2f} ms, peak bf16 FLOPs {pct['b_ms_per_prefill_token']} of a prompt "
            f"token's cost and reading its context's K and V {pct['c_ms_per_decode_token']} of a decode token's; "
            f"the {coef[2]:.2f} ms per prefilling request (the sync engine's: {sync_e:.2f} ms) is no GPU work of its "
            f"own: launch gaps and host work in the prompt path.")


def bench_sentence(results: Path = RESULTS) -> str:
    """How far prefixstudy's mean E2E is from `vllm bench serve`'s on the same workload
    (h200-threeway/threeway.csv, experiments/gpu/threeway.py), at the points where neither kept a
    saturated bound: over HTTP (`vllm serve`, the peer's lease) and in process (h200-tp1)."""
    t = pd.read_csv(results / "h200-threeway" / "threeway.csv")
    peer = t[t["way"] == "vllm bench serve"].set_index(["mode", "rate"])
    parts = []
    for way, words, band in (("vllm-server (HTTP)", "through `vllm serve`", 3.0), ("in-process", "in process", 5.0)):
        a = t[t["way"] == way].set_index(["mode", "rate"])
        both = a.index.intersection(peer.index)
        calm = [k for k in both if not (a.loc[k, "saturated"] or peer.loc[k, "saturated"])]
        gap = pd.Series({k: 100 * (a.loc[k, "e2e_ms"] / peer.loc[k, "e2e_ms"] - 1) for k in calm})
        worst = gap.abs().idxmax()
        parts.append(f"{words} within ±{band:g} % at {int((gap.abs() <= band).sum())} of {len(gap)} points "
                     f"(largest gap {_signed(gap[worst], '+.1f')} % at {worst[0].upper()} {worst[1]:g} req/s)")
    return (f"Against `vllm bench serve` on the same workload and engine (`experiments/results/h200-threeway/`, "
            f"the points where no one saturated), prefixstudy's mean E2E was {parts[0]}, and {parts[1]}; the "
            f"in-process points are this study's, from a later lease of another H200.")


def _cell(v: float, spec: str, unit: str = "") -> str:
    return "–" if not math.isfinite(v) else _signed(v, spec) + unit


def _cell_ci(v: float, lo: float, hi: float, spec: str, scale: float = 1.0, unit: str = "") -> str:
    if not math.isfinite(v):
        return "–"
    return f"{_signed(v * scale, spec)}{unit} [{_signed(lo * scale, spec)}, {_signed(hi * scale, spec)}]"


def table_begin(study: str) -> str:
    return f"<!-- readme_numbers: table {study} -->"


def study_table(study: str, results: Path = RESULTS) -> str:
    """experiments/results/README.md's per-rate table of ``study``: headline.csv per rate, with
    summary.csv's per-repeat saturation (of the repeats OFF ran) and dispatch lag."""
    from prefixstudy.report.tables import bound_mark

    d = results / study
    head = pd.read_csv(d / "headline.csv").sort_values("arrival_rate")
    summ = pd.read_csv(d / "summary.csv")
    cols = ["rate set (actual)", "repeats ON / OFF", "ON mean E2E (ms)", "OFF mean E2E (ms)", "gain, mean E2E",
            "ON / OFF p90 E2E (ms)", "OFF engine prefill share", "OFF decode slowdown", "TPOT ON / OFF (ms)",
            "spread ON / OFF", "OFF saturated (repeats)", "lag p99 max ON / OFF (ms)"]
    out = [table_begin(study), "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, h in head.iterrows():
        at = summ[summ["rate"] == h["rate"]]
        off = at[at["mode"] == "off"]
        lag = {m: at[at["mode"] == m]["dispatch_lag_p99_ms"].max() for m in ("on", "off")}
        bound = bound_mark(bool(h["on_saturated"]), bool(h["off_saturated"]))
        gain = _cell_ci(h["gain_mean_e2e"], h["gain_mean_e2e_lo"], h["gain_mean_e2e_hi"], ".1f", 100, " %")
        sat = f"{int(off['saturated'].astype(bool).sum())} of {len(off)}" if len(off) else "–"
        out.append("| " + " | ".join([
            f"{h['rate']:g} ({h['arrival_rate']:.2f})",
            f"{at[at['mode'] == 'on']['repeat'].nunique()} / {off['repeat'].nunique()}",
            _cell_ci(h["on_mean_e2e_ms"], h["on_mean_e2e_lo"], h["on_mean_e2e_hi"], ".0f"),
            _cell_ci(h["off_mean_e2e_ms"], h["off_mean_e2e_lo"], h["off_mean_e2e_hi"], ".0f"),
            (bound + gain) if gain != "–" else gain,
            f"{_cell(h['on_p90_e2e_ms'], '.0f')} / {_cell(h['off_p90_e2e_ms'], '.0f')}",
            _cell_ci(h["off_engine_prefill_share"], h["off_engine_prefill_share_lo"], h["off_engine_prefill_share_hi"],
                     ".0f", 100, " %"),
            _cell(h["off_decode_slowdown"], ".2f", "×"),
            f"{_cell(h['on_mean_tpot_ms'], '.2f')} / {_cell(h['off_mean_tpot_ms'], '.2f')}",
            f"{_cell(h['on_spread_pct'], '.1f')} / {_cell(h['off_spread_pct'], '.1f')} %",
            sat, f"{_cell(lag['on'], '.2f')} / {_cell(lag['off'], '.2f')}"]) + " |")
    return "\n".join(out + [END])


def _load_ok(d: Path):
    from prefixstudy.results import load

    st = load(d)
    r = st.requests
    ok = r[~r["warmup"].astype(bool) & (r["error"].isna() | (r["error"] == ""))]
    return st, ok


def _arm_gain(r: pd.Series) -> str:
    from prefixstudy.report.arms import gain_mark

    return gain_mark(r) + _cell_ci(r["gain_mean_e2e"], r["gain_mean_e2e_lo"], r["gain_mean_e2e_hi"], ".1f", 100, " %")


def offload_table(study: str = "h200-offload", results: Path = RESULTS) -> str:
    """Every arm of an offload study per rate: its mean E2E, its paired gain over the baseline
    (arms.csv) and over caching ON alone (metrics.headline.tiers_versus_cache, the report's), the
    hit rate with the engine's split by tier, and how many repeats saturated."""
    from prefixstudy.metrics.headline import tiers_versus_cache

    st, _ = _load_ok(results / study)
    arms, summ = st.arms, st.summary
    tiers = tiers_versus_cache(st.requests, summ[summ["status"] == "ok"], arms).set_index(["arm", "rate"])
    cols = ["rate set (actual)", "arm", "mean E2E (ms)", "gain over OFF", "gain over ON alone",
            "hit rate: GPU + CPU tier (possible)", "saturated (repeats)", "lag p99 max (ms)"]
    out = [table_begin(study), "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    order = {a: i for i, a in enumerate(["off", "on", *[a for a in arms["arm"].unique() if a != "on"]])}
    rows = []
    for rate in sorted(summ["rate"].unique()):
        at = summ[summ["rate"] == rate]
        for arm in sorted(at["mode"].unique(), key=lambda a: order.get(a, 99)):
            m = at[at["mode"] == arm]
            a = arms[(arms["arm"] == arm) & (arms["rate"] == rate)]
            if arm == "off":
                h = st.headline[st.headline["rate"] == rate].iloc[0]
                mean, hit = _cell_ci(h["off_mean_e2e_ms"], h["off_mean_e2e_lo"], h["off_mean_e2e_hi"], ".0f"), "0"
                vs_off = vs_on = "–"
            else:
                r = a.iloc[0]
                mean = _cell_ci(r["mean_e2e_ms"], r["mean_e2e_lo"], r["mean_e2e_hi"], ".0f")
                split = (f"{r['hit_rate_gpu']:.3f} + {r['hit_rate_cpu']:.3f}" if math.isfinite(r["hit_rate_cpu"])
                         else f"{r['hit_rate_gpu']:.3f}")
                hit = f"{split} ({r['hit_rate_expected']:.3f})"
                vs_off = _arm_gain(r)
                vs_on = _arm_gain(tiers.loc[(arm, rate)]) if (arm, rate) in tiers.index else "–"
            rows.append([f"{rate:g} ({m['arrival_rate'].mean():.2f})", arm, mean, vs_off, vs_on, hit,
                         f"{int(m['saturated'].astype(bool).sum())} of {len(m)}",
                         _cell(m["dispatch_lag_p99_ms"].max(), ".2f")])
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out + [END])


def tier_cost_table(studies: tuple[str, ...] = ("h200-offload", "h200-offload-fits"), results: Path = RESULTS) -> str:
    """What a tier hit costs: per study, arm and rate, the measured requests that hit a cache
    (GPU or tier), the median time they waited between arrival at the engine and their first
    step (queue, where a tier hit waits for its blocks to load), their median TTFT, and every
    request's mean TPOT (decode steps, where storing to the tier would show)."""
    cols = ["study", "rate set (actual)", "arm", "requests that hit", "their median queue (ms)",
            "their median TTFT (ms)", "mean TPOT, all requests (ms)"]
    out = [table_begin("tier-cost"), "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for study in studies:
        st, ok = _load_ok(results / study)
        for (rate, arm), g in sorted(ok[ok["mode"] != "off"].groupby(["rate", "mode"]),
                                     key=lambda kv: (kv[0][0], kv[0][1] != "on", kv[0][1])):
            hit = g[g["num_cached_tokens"] > 0]
            actual = st.summary[(st.summary["rate"] == rate) & (st.summary["mode"] == arm)]["arrival_rate"].mean()
            out.append("| " + " | ".join([
                study, f"{rate:g} ({actual:.2f})", arm, f"{len(hit)} of {len(g)}",
                _cell(float(hit["queue_ms"].median()) if len(hit) else math.nan, ".1f"),
                _cell(float(hit["ttft_ms"].median()) if len(hit) else math.nan, ".1f"),
                _cell(float(g["tpot_ms"].mean()), ".2f")]) + " |")
    return "\n".join(out + [END])


def knees_table(results: Path = RESULTS) -> str:
    """Each committed study's knees (metrics.headline.knee_bracket): for ON and OFF, the bracket
    with the repeats on each side, from its headline.csv; studies whose records are committed."""
    from prefixstudy.metrics.headline import MODES, knee_bracket

    out = [table_begin("knees"), "| study | caching ON | caching OFF |", "|---|---|---|"]
    for d in sorted(p.parent for p in results.glob("*/headline.csv") if (p.parent / "requests.parquet").exists()):
        head = pd.read_csv(d / "headline.csv")
        cells = [knee_bracket(head, m)["text"] if head[f"{m}_mean_e2e_ms"].notna().any() else "–" for m in MODES]
        out.append(f"| {d.name} | " + " | ".join(cells) + " |")
    return "\n".join(out + [END])


RENDER = {"h200-offload": offload_table, "tier-cost": lambda _: tier_cost_table(), "knees": lambda _: knees_table()}
TABLES = {RESULTS / "README.md": ("h200-tp1", "h200-tp1-sync", "h200-tp2", "h200-tp1-ray", "h200-multiturn-sync", "h200-offload",
                                   "tier-cost", "knees")}


def render(study: str) -> str:
    return RENDER.get(study, study_table)(study)


def replace_block(text: str, block: str, begin: str = BEGIN) -> str:
    a = text.find(begin)
    b = text.find(END, a)
    if a < 0 or b < a:
        raise SystemExit(f"no {begin} ... {END} block")
    return text[:a] + block + text[b + len(END):]


def regenerated() -> dict[Path, str]:
    """Every README this script keeps, as it should read."""
    out = {README: replace_block(README.read_text(), headline_block())}
    for path, studies in TABLES.items():
        text = path.read_text()
        for st in studies:
            text = replace_block(text, render(st), table_begin(st))
        out[path] = text
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--write", action="store_true")
    g.add_argument("--check", action="store_true")
    a = ap.parse_args()
    if not (a.write or a.check):
        print(headline_block())
        for studies in TABLES.values():
            for st in studies:
                print(render(st))
        return 0
    stale = [p for p, text in regenerated().items() if p.read_text() != text]
    if a.write:
        for p, text in regenerated().items():
            p.write_text(text)
        return 0
    for p in stale:
        print(f"{p.relative_to(REPO)}: stale; run python experiments/readme_numbers.py --write")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
