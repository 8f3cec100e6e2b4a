"""The numbers README.md quotes, regenerated from the committed study files.

The headline block at the top of README.md (between ``<!-- readme_numbers: headline -->`` and
``<!-- /readme_numbers -->``), and the tables and numbered paragraphs of experiments/results/README.md
(between ``<!-- readme_numbers: table NAME -->`` and the same end marker; NAME is a study for its per-rate
table, or a key of ``RENDER``: the other studies' tables and sentences, and ``prefixstudy model``'s TP 8
predictions) are rendered here.  The headline comes from experiments/results/h200-tp1
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
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "experiments/results"
README = REPO / "README.md"
BEGIN, END = "<!-- readme_numbers: headline -->", "<!-- /readme_numbers -->"
INFORMS_POINTS = 10.0  # the largest half-width, in points, of a gain's interval that the headline's mid rate may have


def _ci(v: float, lo: float, hi: float, spec: str = ".0f", scale: float = 1.0) -> str:
    return f"{v * scale:{spec}} [{lo * scale:{spec}}, {hi * scale:{spec}}]"


def _signed(v: float, spec: str) -> str:
    return format(v, spec).replace("-", "−")


def _gain(h: pd.Series) -> str:
    lo, hi = (_signed(100 * h[f"gain_mean_e2e_{e}"], ".1f") for e in ("lo", "hi"))
    return f"{_signed(100 * h['gain_mean_e2e'], '.1f')} % [{lo}, {hi}]"


def _async_effect():
    """experiments/gpu/async_effect.py, loaded as a module."""
    return _script("experiments/gpu/async_effect.py")


def async_lower(sync_dir: Path, async_dir: Path) -> pd.Series:
    """Per (mode, rate) both studies ran and kept up at in every repeat: how much lower the async
    study's mean E2E is than the sync one's, (sync - async) / sync in %, from
    experiments/gpu/async_effect.py's table (means over the repeats' means; its ``change_pct`` is the
    sync engine's excess, sync / async - 1).  A saturated point's mean is a bound, not compared."""
    sync, async_ = pd.read_csv(sync_dir / "summary.csv"), pd.read_csv(async_dir / "summary.csv")
    table, _ = _async_effect().async_effect(sync, async_)
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
    # and its gain's interval informs little.  The mid rate is the highest one whose interval is narrow.
    half = 50 * (calm["gain_mean_e2e_hi"] - calm["gain_mean_e2e_lo"])
    steady = calm[half <= INFORMS_POINTS]
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
        f"and the gain's interval is narrower than ±{INFORMS_POINTS:g} points, "
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
            f"* at **{f['arrival_rate']:.1f} req/s** both modes kept up in every repeat, but the gain's interval is "
            f"±{50 * (f['gain_mean_e2e_hi'] - f['gain_mean_e2e_lo']):.0f} points: OFF's repeats' mean E2E differed by "
            f"{f['off_spread_pct']:.0f} % and the requests in its engine went from {rises} between the arrival "
            f"window's first third and its last ({point_s:g}-second points), so the {_gain(f)} gain informs little;")
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
    lines.append("* " + _slo_words(results))
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
             "the machines it ran on. " + _run_words(d, manifest) + " " + _order_words(d, manifest))
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


def _slo_search(results: Path = RESULTS) -> tuple[dict, dict, pd.DataFrame]:
    """h200-tp1-slo's search record (the manifest's ``slo_search``), its bound and its probes (slo.csv)."""
    d = results / "h200-tp1-slo"
    rec = json.loads((d / "manifest.json").read_text())["slo_search"]
    (name, bound), = rec["objectives_ms"].items()
    return rec, {"name": name, "bound": bound}, pd.read_csv(d / "slo.csv")


def _slo_words(results: Path = RESULTS) -> str:
    """The headline's SLO throughput, searched (h200-tp1-slo) rather than interpolated."""
    rec, obj, _ = _slo_search(results)
    on, off = rec["arms"]["on"], rec["arms"]["off"]
    ratio = on["lo_req_s"] / off["lo_req_s"]
    lo, hi = on["lo_req_s"] / off["hi_req_s"], on["hi_req_s"] / off["lo_req_s"]
    return (f"searched instead (`--slo {obj['name']}:{obj['bound']:g}`, `experiments/results/h200-tp1-slo/`, the same "
            f"engine and workload on a later lease of an H200, {rec['repeats']} repeats at each final rate, to "
            f"{rec['tolerance'] * 100:.0f} %): ON meets it up to **{on['lo_req_s']:.1f} req/s** (misses at "
            f"{on['hi_req_s']:.1f}) and OFF up to **{off['lo_req_s']:.1f} req/s** (misses at "
            f"{off['hi_req_s']:.1f}): **{ratio:.2f}×** [{lo:.2f}, {hi:.2f}] (the brackets' bounds, offered rates).")


def slo_says_block(results: Path = RESULTS) -> str:
    """h200-tp1-slo: each arm's probes in order, where its search stopped and why."""
    rec, obj, probes = _slo_search(results)

    def arm(m):
        a = rec["arms"][m]
        tried = probes[probes["arm"] == m]
        seq = ", ".join(f"{r['rate_req_s']:g}{'' if r['verdict'] == 'met' else ' (' + r['verdict'] + ')'}"
                        for _, r in tried.iterrows())
        return (f"- **{m.upper()}**: {len(tried)} points, in order: {seq}. Stopped: {a['stopped']}; met at "
                f"{a['lo_req_s']:.1f} req/s in every repeat there, missed at {a['hi_req_s']:.1f}.")

    return _block("h200-tp1-slo-says", [arm("on"), arm("off")])


def shared_fraction_block(results: Path = RESULTS) -> str:
    """h200-shared-fraction: the gain against the hit rate at one load (hit_rate.csv)."""
    t = pd.read_csv(results / "h200-shared-fraction" / "hit_rate.csv").sort_values("shared_fraction")
    rate = float(t["rate"].iloc[0])
    rows = "; ".join(f"shared fraction {r['shared_fraction']:g}, hit rate {r['hit_rate']:.3f}: "
                     f"{_ci(r['gain_mean_e2e'], r['gain_mean_e2e_lo'], r['gain_mean_e2e_hi'], '.1f', 100)} %"
                     for _, r in t.iterrows())
    tput = max(abs(t["gain_throughput"]))
    return _block("h200-shared-fraction-says", [
        f"At {rate:g} req/s (actual {t['arrival_rate'].iloc[0]:.1f}), the mean-E2E gain of ON over OFF by hit rate: "
        f"{rows} (paired by request index, 95 % block-bootstrap intervals over one repeat). Output throughput "
        f"differs by at most {100 * tput:.1f} % between the arms at every fraction: both kept up."])


def sglang_block(results: Path = RESULTS) -> str:
    """h200-sglang beside vLLM's arms measured on the same machine minutes before (h200-shared-fraction)."""
    sg = pd.read_csv(results / "h200-sglang" / "summary.csv").set_index("mode")
    rate = float(sg["rate"].iloc[0])
    cells = {}
    for f in ("0", "0.95"):
        s = pd.read_csv(results / "h200-shared-fraction" / f"shared_fraction-{f}" / "summary.csv").set_index("mode")
        cells[f] = s
    v = cells["0.95"]

    def e2e(s, m):
        return f"{s.loc[m, 'mean_e2e_ms']:.0f} ms (TTFT {s.loc[m, 'mean_ttft_ms']:.1f}, TPOT {s.loc[m, 'mean_tpot_ms']:.2f})"

    return _block("h200-sglang-says", [
        f"At {rate:g} req/s (one repeat each; the same H200, minutes apart), mean E2E: SGLang 0.5.17 with "
        f"RadixAttention {e2e(sg, 'on')}, hit rate {sg.loc['on', 'hit_rate_measured']:.3f}; with "
        f"`--disable-radix-cache` {e2e(sg, 'off')}. vLLM 0.26 in process at a shared fraction of 0.95 (hit rate "
        f"{v.loc['on', 'hit_rate_measured']:.3f}): ON {e2e(v, 'on')}, OFF {e2e(v, 'off')}; at fraction 0, OFF "
        f"{e2e(cells['0'], 'off')}. Caching cuts SGLang's mean E2E by "
        f"{100 * (1 - sg.loc['on', 'mean_e2e_ms'] / sg.loc['off', 'mean_e2e_ms']):.1f} % and vLLM's by "
        f"{100 * (1 - v.loc['on', 'mean_e2e_ms'] / v.loc['off', 'mean_e2e_ms']):.1f} %. The two engines' prompts are "
        "the same token ids on the same arrival draw, but SGLang's reach it over HTTP (its client TTFT includes "
        "the server's HTTP path) and vLLM's in process, and SGLang ran with its Triton attention backend "
        "(the offline bundle leaves out FlashAttention 3), so the gap between the engines is not the caches' alone."])


@functools.lru_cache(maxsize=4)
def _study(d: Path):
    """The study (read once for every sentence that needs its records) and its fit's coefficients."""
    from prefixstudy.costmodel.engine_fit import recorded_coef
    from prefixstudy.results import load

    st = load(d)
    coef = recorded_coef(st.manifest.get("step_fit") or {})  # zeros for a study not fitted
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
    from prefixstudy.model.closure import admission_limit, arm_table

    st, coef = _study(d)
    limit = admission_limit(st.manifest)
    pred = arm_table(coef, head, counted(st.requests), limit, ("on", "off")).set_index("arm").to_dict("index")
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
            f"{held('t_repeats')} cases (the two h200-tp1 runs', whose three repeats leave two: a wide t(1)), where the "
            f"requests' own noise alone held {held('within')} and with a "
            f"between-repeat variance pooled over the study's other rates {held('within_pooled')}: runs differ by "
            f"more than their requests' noise, so the intervals come from the repeats.")


def _run_words(d: Path, manifest: dict) -> str:
    """Where and how the headline run ran: its device calls (the manifest's resumes) and the points it lacks."""
    import yaml

    from prefixstudy.config import parse_config

    pts = manifest["points"]
    cfg = parse_config(yaml.safe_load((d / "config.yaml").read_text()), "config.yaml")
    ran = {(p["mode"], float(p["rate"]), int(p["repeat"])) for p in pts if p.get("status") == "ok"}
    missing = sorted({(float(r), k) for m in cfg.sweep.modes for r, k in cfg.sweep.points() if (m, float(r), k) not in ran})
    out = ""
    if manifest.get("resumed_at"):
        from datetime import datetime

        cut = datetime.fromisoformat(manifest["resumed_at"][0]).timestamp()
        before = sum(p["started_at"] < cut for p in pts)
        out = (f"The run went through {1 + len(manifest['resumed_at'])} device calls of a 10-minute limit, the arms' "
               f"engines restarted at each: {before} points before its first resume and {len(pts) - before} after, "
               f"which ran on a second H200 (the first was taken back between the calls; "
               f"`h200-tp1/device-calls.log`), so its repeats span two machines.")
    if missing:
        out += (" Not run, for want of device time: " + ", ".join(f"{r:g} req/s repeat {k + 1}" for r, k in missing)
                + " (both arms).")
    return out.strip()


def _order_words(d: Path, manifest: dict) -> str:
    """metrics.order on the headline run: whether the arm that went first moved the gain."""
    from prefixstudy.metrics.order import order_effect

    e = order_effect(manifest["points"], pd.read_csv(d / "summary.csv"), "on", "off")
    if e.empty:
        return ""
    at = " and ".join(f"{_signed(r.difference_points, '+.1f')} points at {r.rate:g} req/s" for r in e.itertuples())
    return (f"ON and OFF took turns point by point, and each rate's repeats alternated which went first: where both "
            f"kept up, the gain with ON first differed from the gain with OFF first by {at} (`metrics.order`; the "
            f"report's \"Arm order\").")


def _physics_words(d: Path, sync: Path) -> str:
    """model.closure.physics of the study's fit on its GPU, and the sync engine's per-request cost."""
    from prefixstudy.configs import recorded_model_dir
    from prefixstudy.metrics.requests import counted
    from prefixstudy.costmodel.arch import load_arch
    from prefixstudy.model.closure import physics
    from prefixstudy.costmodel.gpus import get_gpu

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
        cells = [knee_bracket(head, m)["text"] if head.get(f"{m}_mean_e2e_ms", pd.Series(dtype=float)).notna().any()
                 else "–" for m in MODES]
        out.append(f"| {d.name} | " + " | ".join(cells) + " |")
    return "\n".join(out + [END])


# --------------------------------------------------------------------------- prose blocks of the results README
# Each renders a paragraph (or a list) between ``<!-- readme_numbers: table NAME -->`` and the end marker,
# so the regeneration test covers it like the tables.

def _block(name: str, lines: list[str]) -> str:
    return "\n".join([table_begin(name), *lines, END])


def _manifest(study: str, results: Path = RESULTS) -> dict:
    return json.loads((results / study / "manifest.json").read_text())


def fit_formula(fit: dict) -> str:
    """A manifest's step fit as the formula the README prints (terms the fit dropped left out)."""
    terms = [f"{fit['a_ms']:.2f}", f"{fit['b_ms_per_prefill_token']:.4f}·prefill_tokens",
             f"{fit['e_ms_per_prefill_req']:.2f}·prefill_requests", f"{fit['c_ms_per_decode_token']:.4f}·decode_tokens"]
    if fit.get("k_ms_per_context_token", 0) > 0:
        terms.append(f"{fit['k_ms_per_context_token']:.5f}·context_tokens")
    return (f"`step_ms = {' + '.join(terms)}`, **R² = {fit['r2']:.3f}**, RMSE {fit['rmse_ms']:.1f} ms")


def _pairwise_words(checks: dict) -> str:
    from prefixstudy.metrics.step_checks import PAIR_NOISE_MS, PAIR_NOISE_SHARE

    p = checks["pairwise"]
    return (f"{p['on']['shorter']} of {p['on']['n']:,} ON and {p['off']['shorter']} of {p['off']['n']:,} OFF "
            f"measured shorter than that decode step by more than {PAIR_NOISE_MS:g} ms or "
            f"{100 * PAIR_NOISE_SHARE:.0f} % of it, whichever is larger")


def _lag_words(summ: pd.DataFrame) -> str:
    lag = summ["dispatch_lag_p99_ms"]
    worst = summ.loc[lag.idxmax()]
    return (f"Dispatch lag p99 ≤ {lag.max():.2f} ms at all {len(summ)} points (max at {worst['mode'].upper()} "
            f"{worst['rate']:g} req/s).")


def sync_steps_block(results: Path = RESULTS) -> str:
    """h200-tp1-sync's step checks, its fit and its dispatch lag."""
    m = _manifest("h200-tp1-sync", results)
    summ = pd.read_csv(results / "h200-tp1-sync" / "summary.csv")
    return _block("h200-tp1-sync-steps", [
        "Of the steps that computed prompt tokens right after a decode-only step of the same or a smaller "
        f"batch, {_pairwise_words(m['step_checks'])} (`prefixstudy check experiments/results/h200-tp1-sync`). "
        f"The step-cost fit over all {m['step_fit']['n']:,} busy steps, both modes pooled: "
        f"{fit_formula(m['step_fit'])}. {_lag_words(summ)}"])


def _at(head: pd.DataFrame, rate: float) -> pd.Series:
    return head.set_index("rate").loc[rate]


def _calm(head: pd.DataFrame) -> pd.DataFrame:
    return head[~head["on_saturated"].astype(bool) & ~head["off_saturated"].astype(bool)
                & head["gain_mean_e2e"].notna()]


def sync_says_block(results: Path = RESULTS) -> str:
    """What h200-tp1-sync says: the gain at 1 and 16 req/s, where OFF saturated or was still
    filling, the fit's terms priced, and the async engine against it."""
    from prefixstudy.metrics.headline import knee_bracket
    from prefixstudy.metrics.requests import counted

    d = results / "h200-tp1-sync"
    head = pd.read_csv(d / "headline.csv").sort_values("rate")
    summ = pd.read_csv(d / "summary.csv")
    fit = _manifest("h200-tp1-sync", results)["step_fit"]
    low, mid = head.iloc[0], _at(head, 16.0)
    off = summ[(summ["mode"] == "off")]
    kept = off.groupby("rate").filter(lambda g: not g["saturated"].astype(bool).any())
    filling = sorted(r for r, g in kept.groupby("rate") if (g["in_system_last"] >= 2 * g["in_system_first"]).all())
    arr = head.set_index("rate")["arrival_rate"]
    bound = head[head["gain_is_bound"].astype(bool)]
    off_k, on_k = knee_bracket(head, "off"), knee_bracket(head, "on")
    st, _ = _study(d)
    req = counted(st.requests)
    prompt = float(req["prompt_tokens"].mean())
    on_new = float((req[req["mode"] == "on"]["prompt_tokens"] - req[req["mode"] == "on"]["num_cached_tokens"]).mean())
    block_size = int(st.manifest["points"][0]["block_size"])  # the engine's, as it ran

    def cost(tokens):
        return fit["b_ms_per_prefill_token"] * tokens + fit["e_ms_per_prefill_req"]
    table, gains = _async_effect().async_effect(summ, pd.read_csv(results / "h200-tp1-async" / "summary.csv"))
    lower = {k: 100 * (1 - 1 / (1 + table[("change_pct", k)] / 100)) for k in ("mean_e2e_ms", "mean_tpot_ms")}
    higher = {k: table[("change_pct", k)] for k in ("mean_e2e_ms", "mean_tpot_ms")}
    rng = {k: f"{v.min():.0f}–{v.max():.0f} %" for k, v in lower.items()}
    rng_hi = {k: f"{v.min():.0f}–{v.max():.0f} %" for k, v in higher.items()}
    rates = " and ".join(f"{r:g}" for r in sorted(table.index.get_level_values("rate").unique()))
    share = _cell_ci(mid["off_engine_prefill_share"], mid["off_engine_prefill_share_lo"],
                     mid["off_engine_prefill_share_hi"], ".0f", 100, " %")
    return _block("h200-tp1-sync-says", [
        f"- At {low['arrival_rate']:.2f} req/s caching saves {low['off_mean_e2e_ms'] - low['on_mean_e2e_ms']:.0f} ms "
        f"of {low['off_mean_e2e_ms']:.0f} ({_gain(low)}), about one prefill: prompt work is "
        f"{100 * low['off_engine_prefill_share']:.0f} % of OFF's busy engine time. At {mid['arrival_rate']:.1f} req/s "
        f"prompt work is {share} "
        f"of OFF's engine time, each OFF decode step is {mid['off_decode_slowdown']:.2f}× as long as without the "
        f"prefills it carries, OFF's TPOT is {mid['off_mean_tpot_ms']:.1f} ms against ON's "
        f"{mid['on_mean_tpot_ms']:.1f}, and caching saves {_gain(mid)}.",
        f"- **Saturation.** {off_k['text']}; {on_k['text']}. At "
        + " and ".join(f"{arr[r]:.1f}" for r in filling)
        + " req/s OFF kept up but was still filling: the requests in its engine more than doubled from the "
        "arrival window's first third to its last in every repeat (`summary.csv`'s `in_system_first` and "
        "`in_system_last`), so its latency there understates a longer point's. The gains at "
        + " and ".join(f"{r['arrival_rate']:.1f}" for _, r in bound.iterrows()) + " req/s are lower bounds.",
        f"- **Cost of the fit's terms.** A cached (ON) prefill of {on_new:.0f} tokens (block size {block_size}) "
        f"costs {cost(on_new):.1f} ms of engine time, an uncached one ({prompt:.0f} tokens) {cost(prompt):.1f} ms; "
        f"a decode token {fit['c_ms_per_decode_token']:.3f} ms on top of {fit['a_ms']:.1f} ms a step.",
        "- **Against vLLM's default.** These numbers are for an engine that runs one step at a time, which is "
        f"slower than vLLM 0.26's default: on the same GPU, in the same lease, async scheduling on gave "
        f"{rng['mean_e2e_ms']} lower mean E2E and {rng['mean_tpot_ms']} lower TPOT at {rates} req/s (the sync "
        f"engine's are {rng_hi['mean_e2e_ms']} and {rng_hi['mean_tpot_ms']} higher), and a smaller caching gain "
        f"at 16 req/s ({gains.loc[16.0, 'async_on']:.1f} % against {gains.loc[16.0, 'async_off']:.1f} %); see "
        "`h200-tp1-async` and, measured later on vLLM's default engine, `h200-tp1`."])


def async_effect_block(results: Path = RESULTS) -> str:
    """experiments/gpu/async_effect.py's table of h200-tp1-sync against h200-tp1-async, and the gains."""
    summ = pd.read_csv(results / "h200-tp1-async" / "summary.csv")
    table, gains = _async_effect().async_effect(pd.read_csv(results / "h200-tp1-sync" / "summary.csv"), summ)
    out = ["| mode, rate | mean E2E off / on (ms) | TPOT off / on (ms) | TTFT off / on (ms) |", "|---|---|---|---|"]
    for (mode, rate), r in table.iterrows():
        cells = []
        for k, spec_ in (("mean_e2e_ms", ".0f"), ("mean_tpot_ms", ".2f"), ("mean_ttft_ms", ".1f")):
            cells.append(f"{r[('async_off', k)]:{spec_}} / {r[('async_on', k)]:{spec_}} "
                         f"({_signed(r[('change_pct', k)], '+.0f')} %)")
        out.append(f"| {mode.upper()} {rate:g} | " + " | ".join(cells) + " |")
    lag = summ["dispatch_lag_p99_ms"]
    over = summ[lag > 1.0]
    g = "; ".join(f"{g['async_off']:.1f} / {g['async_on']:.1f} % at {r:g} req/s" for r, g in gains.iterrows())
    lag_words = (f"Dispatch lag p99 ≤ 1 ms at {int((lag <= 1.0).sum())} of these {len(summ)} points"
                 + "".join(f"; {r['mode'].upper()} {r['rate']:g} req/s reached {r['dispatch_lag_p99_ms']:.1f} ms in "
                           "one repeat" for _, r in over.iterrows())
                 + " (not re-run: these points are a comparison, not the study).")
    return _block("h200-tp1-async-effect", [*out, "", f"Caching gain of mean E2E, async off / on: {g}. {lag_words}"])


TP8_GPUS = (("8 × H200, TP 8", "H200-SXM"), ("8 × A100-40GB, TP 8", "A100-SXM4-40GB"))
TP8_FITTED = ("h200-tp1", "h200-tp2")


def fitted_efficiency(study: str, results: Path = RESULTS):
    """``prefixstudy model --calibrate``'s efficiencies for a committed study."""
    from prefixstudy.model.calibrate import calibrate, deployment_from_study
    from prefixstudy.costmodel.roofline import Efficiency

    st, _ = _study(results / study)
    dep = deployment_from_study(st.config, str(st.manifest["device"]), eff=Efficiency())
    return calibrate(st.summary, st.requests, st.iterations, dep).eff


def tp8_cases(results: Path = RESULTS) -> list[tuple[str, str, object]]:
    """(setup, parameters, the model's Case) for each row of the TP 8 table: the command's default
    efficiencies and those fitted to each study in TP8_FITTED, on each GPU of TP8_GPUS."""
    from prefixstudy.model.explain import RC, build_case
    from prefixstudy.costmodel.gpus import load_gpus
    from prefixstudy.costmodel.roofline import Efficiency

    gpus = load_gpus()
    effs = [("defaults", Efficiency(0.5, 0.8, 0.0))] + [(f"fitted to {s}", fitted_efficiency(s, results))
                                                       for s in TP8_FITTED]
    return [(setup, f"{label}: {e.mfu:.2f} / {e.bw_eff:.2f} / {e.overhead_ms:.2f}",
             build_case(None, None, gpu, 8, RC["prompt_len"], RC["prefix_len"], RC["output_len"], e, gpus))
            for setup, gpu in TP8_GPUS for label, e in effs]


def tp8_table(results: Path = RESULTS) -> str:
    """``prefixstudy model --tp 8``'s summary numbers per GPU and parameter set, and the reported case."""
    from prefixstudy.model.explain import RC
    from prefixstudy.costmodel.roofline import prefix_saving, rate_ceiling

    cols = ["setup", "parameters (mfu / bw_eff / overhead ms)", "prefill step OFF / ON (ms)",
            "decode step, batch 1 (ms)", "E2E batch 1 OFF / ON (ms)", "rate ceiling OFF / ON (req/s)"]
    out = [table_begin("tp8-model"), "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for setup, params, c in tp8_cases(results):
        sv = prefix_saving(c.dep, c.prefix_len, c.suffix_len, c.output_len)
        rc = [rate_ceiling(c.dep, c.prompt_len, cached, c.output_len).engine_rps for cached in (0, c.prefix_len)]
        out.append(f"| {setup} | {params} | {sv.off.prefill.total_ms:.2f} / {sv.on.prefill.total_ms:.2f} | "
                   f"{sv.off.decode_step.total_ms:.2f} | {sv.off.e2e_ms:.1f} / {sv.on.e2e_ms:.1f} | "
                   f"{rc[0]:,.0f} / {rc[1]:,.0f} |")
    out.append(f"| reported (8 × A100, TP 8) | measured by the user | | | {RC['observed_off_ms']:g} / "
               f"{RC['observed_on_ms']:g} | |")
    return "\n".join(out + [END])


def tp8_says_block(results: Path = RESULTS) -> str:
    """What the measured studies and the model say about TP 8, every number from the files or the model."""
    from prefixstudy.metrics.headline import knee_bracket
    from prefixstudy.model.explain import RC, numbers, observation
    from prefixstudy.costmodel.roofline import prefix_saving

    heads = {s: pd.read_csv(results / s / "headline.csv").sort_values("rate")
             for s in ("h200-tp1", "h200-tp1-ray", "h200-tp2", "h100-tp1-spans")}
    low = {s: h.iloc[0] for s, h in heads.items()}

    def saving(s):
        r = low[s]
        return (f"{r['off_mean_e2e_ms'] - r['on_mean_e2e_ms']:.0f} ms of {r['off_mean_e2e_ms']:.0f} "
                f"({_gain(r)}) at {r['arrival_rate']:.2f} req/s")

    cases = tp8_cases(results)
    pred = [prefix_saving(c.dep, c.prefix_len, c.suffix_len, c.output_len) for _, _, c in cases]
    pred_ms = [p.off.e2e_ms - p.on.e2e_ms for p in pred]
    reported = next(c for setup, params, c in cases if "A100" in setup and params.startswith("defaults"))
    ob = observation(reported, numbers(reported))
    summ = {s: pd.read_csv(results / s / "summary.csv") for s in ("h200-tp1-ray", "h200-tp2")}

    def off_low(s, col):
        g = summ[s][(summ[s]["mode"] == "off") & (summ[s]["rate"] == summ[s]["rate"].min())]
        return float(g[col].mean())

    def rise(s, mode):
        """TPOT at the highest rate OFF kept up at, over TPOT at the lowest."""
        h = heads[s]
        kept = h[~h["off_saturated"].astype(bool) & h["off_mean_e2e_ms"].notna()]
        return kept.iloc[-1][f"{mode}_mean_tpot_ms"] / kept.iloc[0][f"{mode}_mean_tpot_ms"], kept.iloc[-1]["arrival_rate"]

    tpot = [off_low(s, "mean_tpot_ms") for s in ("h200-tp1-ray", "h200-tp2")]
    pre = [off_low(s, "mean_prefill_ms") for s in ("h200-tp1-ray", "h200-tp2")]
    e_req = [_manifest(s, results)["step_fit"]["e_ms_per_prefill_req"] for s in ("h200-tp1-ray", "h200-tp2")]
    r1, r2 = rise("h200-tp1-ray", "off"), rise("h200-tp2", "off")
    o1, o2 = rise("h200-tp1-ray", "on"), rise("h200-tp2", "on")
    seen = RC["observed_off_ms"] - RC["observed_on_ms"]
    where = "is in that range" if min(pred_ms) <= seen <= max(pred_ms) else "is outside that range"
    return _block("tp8-says", [
        f"- **The saving at the lowest rate is one prefill, and it stays small.** In process at TP 1 (h200-tp1) "
        f"caching saved {saving('h200-tp1')}; through Ray at TP 1 (h200-tp1-ray) {saving('h200-tp1-ray')}, and at "
        f"TP 2 (h200-tp2) {saving('h200-tp2')}; in process on one H100 (h100-tp1-spans) {saving('h100-tp1-spans')}. "
        f"The rows above predict {min(pred_ms):.0f}–{max(pred_ms):.0f} ms "
        f"for TP 8. The reported {seen:.1f} ms saving {where}.",
        f"- **The reported absolute latencies are not.** {RC['observed_off_ms']:g} and {RC['observed_on_ms']:g} ms "
        f"lie below {reported.output_len - 1} decode steps at the A100's memory-bandwidth floor "
        f"({ob.decode_floor_ms:.1f} ms). `prefixstudy model --explain` says so: at 100 % HBM bandwidth, ON's "
        f"{RC['observed_on_ms']:g} ms leaves room for at most {max(ob.steps_room, 0):.0f} decode steps. The user's "
        "requests probably generated fewer tokens than the sequence limit allows.",
        f"- **What the second GPU bought.** Through the same Ray executor, from TP 1 to TP 2 OFF's TPOT at the "
        f"lowest rate went from {tpot[0]:.1f} to {tpot[1]:.1f} ms ({tpot[0] / tpot[1]:.1f}× faster) and its mean "
        f"prefill from {pre[0]:.1f} to {pre[1]:.1f} ms ({pre[0] / pre[1]:.1f}×), while the fitted cost of each "
        f"prefill request grew from {e_req[0]:.2f} to {e_req[1]:.2f} ms: costs that do not shrink with the degree "
        "are what TP 8 is most likely to be bound by.",
        f"- **The gain's growth with load should carry over.** Up to the highest rate OFF kept up at, OFF's TPOT "
        f"rose {r1[0]:.1f}× at TP 1 through Ray ({r1[1]:.1f} req/s) and {r2[0]:.1f}× at TP 2 ({r2[1]:.1f} req/s), ON's "
        f"{o1[0]:.1f}× and {o2[0]:.1f}×. {knee_bracket(heads['h200-tp1-ray'], 'off')['text']} at TP 1 through Ray; at "
        f"TP 2, {knee_bracket(heads['h200-tp2'], 'off')['text'][len('OFF '):]} (OFF at 32 req/s did not run)."])


def _span(v, spec: str, unit: str = "") -> str:
    lo, hi = format(min(v), spec), format(max(v), spec)
    return f"{lo}{unit}" if lo == hi else f"{lo}–{hi}{unit}"


def _longer(pct: pd.Series) -> str:
    """'3.9–7.3 % longer', or where some took less time, 'from 2.1 % less to 3.3 % more time'."""
    if pct.min() >= 0:
        return f"{_span(pct, '.1f', ' %')} longer"
    return f"from {-pct.min():.1f} % less to {pct.max():.1f} % more time"


def _accuracy_words(acc, df: pd.DataFrame, check: str, study: str) -> str:
    """'N of M within 5 % (worst ±x.x %, MODE R)' over the unsaturated points of one check of an
    async.csv (``acc``: experiments/sim/accuracy.py)."""
    pp = acc.per_point(df[(df["check"] == check) & (df["study"] == study)])
    u = pp[pp["saturated_meas_share"] <= 0.5]
    worst = u.loc[u["mean_e2e_ms_err"].abs().idxmax()]
    return (f"{int((u['mean_e2e_ms_err'].abs() <= 0.05).sum())} of {len(u)} within 5 % (worst "
            f"{_signed(100 * worst['mean_e2e_ms_err'], '+.1f')} %, {worst['mode'].upper()} {worst['rate']:g})")


ANOTHER_LEASE = "vLLM on another lease's H200s, one GPU per arm there and one for both here"


def spans_rerun_says_block(name: str, then_name: str, unit: str, same: str, results: Path = RESULTS,
                           machines: str = ANOTHER_LEASE, workload_fit: bool = True) -> str:
    """A default-engine study re-run with its steps timed on the GPU (``name``) against the committed
    run it repeats (``then_name``, host stamps only, another lease), and the simulator's
    default-engine form and two it is compared with on it (sim-accuracy/async.csv,
    async-forms-linear/async.csv, async-forms/async.csv).  ``same``: what the
    two runs share, in words; ``machines``: what they do not.  ``workload_fit``: the study is also
    one of the workloads h200-tp1's fit predicts."""
    acc = _script("experiments/sim/accuracy.py")
    now = pd.read_csv(results / name / "summary.csv")
    then = pd.read_csv(results / then_name / "summary.csv")
    e2e_now, e2e_then = (t.groupby(["mode", "rate"])["mean_e2e_ms"].mean() for t in (now, then))
    diff = 100 * (e2e_now[e2e_then.index] / e2e_then - 1)
    slower = like_steps_slower(results / then_name, results / name)
    below, above = diff[diff < 0].abs(), diff[diff >= 0]
    side = (f"{_span(below, '.1f', ' %')} below {then_name}'s" if above.empty else
            f"{_span(above, '.1f', ' %')} above {then_name}'s" if below.empty else
            f"{_span(below, '.1f', ' %')} below {then_name}'s at {len(below)} of {len(diff)} points and "
            f"{_span(above, '.1f', ' %')} above at {_points_words(above)}")
    rates = [f"{r:g}" for r in sorted(then["rate"].unique())]
    timing = pd.read_parquet(results / name / "iterations.parquet", columns=["timing"])["timing"]
    timed = (f"Every one of its {len(timing):,} engine steps is timed on the GPU" if (timing == "gpu-span").all() else
             f"{(timing == 'gpu-span').sum():,} of its {len(timing):,} engine steps are timed on the GPU")
    forms = {"simulator": pd.read_csv(results / "sim-accuracy" / "async.csv"),
             "linear": pd.read_csv(results / "sim-accuracy" / "async-forms-linear" / "async.csv"),
             "piecewise": pd.read_csv(results / "sim-accuracy" / "async-forms" / "async.csv")}

    def checks(df):
        words = (f"held out by point {_accuracy_words(acc, df, 'held-out point', name)}; by repeat "
                 f"{_accuracy_words(acc, df, 'held-out repeat', name)}")
        return words + (f"; fitted on h200-tp1 {_accuracy_words(acc, df, 'another workload', name)}"
                        if workload_fit else "")

    return _block(f"{name}-says", [
        f"**What it says.** {timed}, with the host's stamps beside. At the rates both runs share "
        f"({', '.join(rates[:-1])} and {rates[-1]} {unit}), its mean E2E is {side} (ON and OFF, the repeats' "
        f"means): {same} "
        f"and {machines}. Like for like, "
        f"{then_name}'s decode-only steps took {_longer(100 * slower)} ({len(slower)} groups of "
        "a mode, a rate and a batch size, the median host-stamped step of each). The simulator's "
        "default-engine model, calibrated on these steps, predicts "
        f"its mean E2E as follows. The simulator's form: {checks(forms['simulator'])}. The linear form of "
        f"`experiments/sim/async_forms.py`: {checks(forms['linear'])}. Its piecewise form: "
        f"{checks(forms['piecewise'])}. "
        f"Calibrated here, the simulator's form puts {then_name} "
        f"{_accuracy_words(acc, forms['simulator'], 'another run', then_name)}, the linear form "
        f"{_accuracy_words(acc, forms['linear'], 'another run', then_name)} and the "
        f"piecewise form {_accuracy_words(acc, forms['piecewise'], 'another run', then_name)}: what "
        "separates the two runs is their machines and setup, which a calibration on one of them cannot see. "
        f"{_lag_over_words(now, unit)}"])


def _points_words(v: pd.Series) -> str:
    """(mode, rate) points in words: "ON 24", "ON 24 and OFF 12"."""
    words = [f"{m.upper()} {r:g}" for m, r in v.index]
    return " and ".join([", ".join(words[:-1]), words[-1]] if len(words) > 1 else words)


def like_steps_slower(then: Path, now: Path, min_steps: int = 30) -> pd.Series:
    """How much longer ``then``'s decode-only steps took than ``now``'s, like for like: per mode, rate
    both ran, and bin of decoders (1-8, 9-16, 17-32, ...), the ratio of the two median host-stamped
    step times less one, over the bins with ``min_steps`` steps or more in both runs.  Host stamps
    (``host_step_ms`` where the GPU timed the steps) are shifted a step under async scheduling, but
    a run of decode-only steps of one size tiles the same wall time either way."""
    bins = [0, 8, 16, 32, 64, 128, 256, 512]
    med = []
    for d in (then, now):
        names = pq.read_schema(next((d / "iterations.parquet").glob("*.parquet"))).names
        col = "host_step_ms" if "host_step_ms" in names else "step_ms"
        t = pd.read_parquet(d / "iterations.parquet", columns=["mode", "rate", "prefill_tokens", "decode_tokens", col])
        t = t[(t["prefill_tokens"] == 0) & (t["decode_tokens"] > 0) & (t[col] > 0)]
        g = t.groupby(["mode", "rate", pd.cut(t["decode_tokens"], bins)], observed=True)[col]
        med.append(g.median()[g.size() >= min_steps])
    both = med[0].index.intersection(med[1].index)
    return med[0][both] / med[1][both] - 1


def _lag_over_words(summ: pd.DataFrame, unit: str = "sessions/s") -> str:
    """The points whose dispatch-lag p99 is over 1 ms, and what share of their mean E2E it is at most."""
    over = summ[summ["dispatch_lag_p99_ms"] > 1.0]
    if over.empty:
        return "Every point's dispatch-lag p99 is under 1 ms."
    modes = " and ".join(sorted({m.upper() for m in over["mode"]}))
    share = (over["dispatch_lag_p99_ms"] / over["mean_e2e_ms"]).max()
    return (f"{len(over)} of {len(summ)} points ({modes}, at {_span(over['rate'], 'g')} {unit}) have a dispatch-lag "
            f"p99 over 1 ms, up to {over['dispatch_lag_p99_ms'].max():.2f} ms: read their latencies as including up "
            f"to that much client-side delay, at most {100 * share:.2f} % of their mean E2E.")


def tp2_fit_block(results: Path = RESULTS) -> str:
    fit = _manifest("h200-tp2", results)["step_fit"]
    return _block("h200-tp2-fit", [f"Step-cost fit over {fit['n']:,} busy steps: {fit_formula(fit)}."])


def tp2_says_block(results: Path = RESULTS) -> str:
    """The h200-tp2 paragraph under its table: the prefill-request cost, the gains, the dispatch lag."""
    d = results / "h200-tp2"
    fit = _manifest("h200-tp2", results)["step_fit"]
    head = pd.read_csv(d / "headline.csv").sort_values("rate")
    summ = pd.read_csv(d / "summary.csv")
    from prefixstudy.metrics.requests import counted

    st, _ = _study(d)
    on = counted(st.requests)
    on = on[on["mode"] == "on"]
    new = float((on["prompt_tokens"] - on["num_cached_tokens"]).mean())
    low, top = head.iloc[0], _calm(head).iloc[-1]
    lag = summ.set_index(["mode", "rate"])["dispatch_lag_p99_ms"]
    low_lag = lag[lag.index.get_level_values("rate") == summ["rate"].min()]
    rest = lag[lag.index.get_level_values("rate") != summ["rate"].min()]
    ray_lag = pd.read_csv(results / "h200-tp1-ray" / "summary.csv")["dispatch_lag_p99_ms"].max()
    return _block("h200-tp2-says", [
        f"One repeat: the intervals hold the spread between requests (in blocks), not between runs. At TP 2 the "
        f"per-prefill-request cost is large ({fit['e_ms_per_prefill_req']:.1f} ms), so an ON prefill of {new:.0f} "
        f"tokens costs {fit['e_ms_per_prefill_req'] + fit['b_ms_per_prefill_token'] * new:.1f} ms of engine time "
        f"and the saving at {low['arrival_rate']:.2f} req/s is small: {_gain(low)}. At {top['arrival_rate']:.1f} "
        f"req/s, where neither mode saturated, caching saves {_gain(top)}. The {summ['rate'].min():g} req/s points "
        f"have p99 dispatch lag of {_span(low_lag, '.0f', ' ms')}; the others are ≤ {rest.max():.1f} ms. The late "
        "sends at the lowest rate follow the longest gaps of the schedule, late in proportion to the gap: the Ray "
        "actor's event loop (uvloop) oversleeps long timers (`benchmarks/timer_overshoot.py`). The runner now "
        "naps in short slices; h200-tp2 was not re-run (it needs two GPUs), but h200-tp1-ray below, through the "
        f"same Ray actor path at TP 1, has a dispatch-lag p99 of at most {ray_lag:.2f} ms at every point, the "
        "lowest rate included."])


def ray_checks_block(results: Path = RESULTS) -> str:
    m = _manifest("h200-tp1-ray", results)
    c = m["step_checks"]
    wa = c["window_agreement"]
    worst = max(wa["modes"][k]["total_diff"] for k in wa["modes"])
    lag = pd.read_csv(results / "h200-tp1-ray" / "summary.csv")["dispatch_lag_p99_ms"].max()
    verdict = "The step checks hold" if c.get("ok") else "The step checks do not all hold"
    return _block("h200-tp1-ray-checks", [
        f"{verdict} (`manifest.json`'s `step_checks`): of the steps that computed prompt tokens right after a "
        f"decode-only step of the same or a smaller batch, {_pairwise_words(c)}, and the fit on sums of "
        f"{wa['window']} steps agrees with the per-step fit within {100 * worst:.1f} % of busy time. Dispatch lag "
        f"p99 ≤ {lag:.2f} ms at every point."])


def cache_pressure_table(results: Path = RESULTS) -> str:
    """h200-cache-pressure per group count, capacity and rate: the two ratios (capacity.csv), ON's
    hit rate and its infinite-cache bound, both modes' mean E2E and the paired gain (the capacity's
    headline.csv), and the repeats that saturated (its summary.csv)."""
    from prefixstudy.report.tables import bound_mark

    cols = ["groups", "capacity (blocks)", "working set ÷ capacity", "cached between two uses ÷ capacity",
            "rate set (actual)", "ON hit (bound)", "ON mean E2E (ms)", "OFF mean E2E (ms)", "gain, mean E2E",
            "saturated ON / OFF (repeats)"]
    out = [table_begin("h200-cache-pressure"), "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for gdir in sorted((results / "h200-cache-pressure").glob("groups-*"), key=lambda p: int(p.name.split("-")[1])):
        cap = pd.read_csv(gdir / "capacity.csv")
        for bdir in sorted(gdir.glob("blocks-*"), key=lambda p: int(p.name.split("-")[1])):
            blocks = float(bdir.name.split("-")[1])
            c = cap[cap["capacity"] == blocks].iloc[0]
            head = pd.read_csv(bdir / "headline.csv").sort_values("rate")
            summ = pd.read_csv(bdir / "summary.csv")
            for _, h in head.iterrows():
                at = summ[summ["rate"] == h["rate"]]
                sat = {m: at[at["mode"] == m]["saturated"].astype(bool) for m in ("on", "off")}
                gain = _cell_ci(h["gain_mean_e2e"], h["gain_mean_e2e_lo"], h["gain_mean_e2e_hi"], ".1f", 100, " %")
                out.append("| " + " | ".join([
                    gdir.name.split("-")[1], f"{blocks:.0f}", f"{c['working_set_ratio']:.2f}",
                    f"{c['reuse_footprint_ratio']:.2f}", f"{h['rate']:g} ({h['arrival_rate']:.2f})",
                    f"{h['on_hit_rate']:.3f} ({h['on_hit_rate_expected']:.3f})",
                    _cell_ci(h["on_mean_e2e_ms"], h["on_mean_e2e_lo"], h["on_mean_e2e_hi"], ".0f"),
                    _cell_ci(h["off_mean_e2e_ms"], h["off_mean_e2e_lo"], h["off_mean_e2e_hi"], ".0f"),
                    bound_mark(bool(h["on_saturated"]), bool(h["off_saturated"])) + gain,
                    f"{int(sat['on'].sum())} / {int(sat['off'].sum())} of {len(sat['off'])}"]) + " |")
    return "\n".join(out + [END])


def _pressure_rows(results: Path = RESULTS) -> pd.DataFrame:
    rows = []
    for gdir in (results / "h200-cache-pressure").glob("groups-*"):
        cap = pd.read_csv(gdir / "capacity.csv")
        for bdir in gdir.glob("blocks-*"):
            blocks = float(bdir.name.split("-")[1])
            head = pd.read_csv(bdir / "headline.csv")
            head["groups"] = int(gdir.name.split("-")[1])
            head["blocks"] = blocks
            c = cap[cap["capacity"] == blocks].iloc[0]
            head["working_set_ratio"], head["reuse_footprint_ratio"] = c["working_set_ratio"], c["reuse_footprint_ratio"]
            head["hit_rate_estimated"] = cap[(cap["capacity"] == blocks) & (cap["mode"] == "on")].groupby(
                "rate")["hit_rate_estimated"].mean().reindex(head["rate"]).to_numpy()
            rows.append(head)
    return pd.concat(rows, ignore_index=True)


def cache_pressure_says_block(results: Path = RESULTS) -> str:
    """What h200-cache-pressure says: where the hit rate collapses (by the ratios), the rate's
    (non-)effect on it, the cost of a miss, and the estimate and the simulator beside it."""
    p = _pressure_rows(results)
    p["held"] = p["on_hit_rate"] / p["on_hit_rate_expected"]
    per_cap = p.groupby(["groups", "blocks"]).agg(reuse=("reuse_footprint_ratio", "first"),
                                                   ws=("working_set_ratio", "first"), held=("held", "mean"),
                                                   hit=("on_hit_rate", "mean"), bound=("on_hit_rate_expected", "first"),
                                                   move=("on_hit_rate", lambda s: s.max() - s.min())).reset_index()
    fits = per_cap[per_cap["held"] > 0.99]
    part = per_cap[(per_cap["held"] > 0.05) & (per_cap["held"] <= 0.99)]
    gone = per_cap[per_cap["held"] <= 0.05]
    est_err = (p["hit_rate_estimated"] - p["on_hit_rate"]).abs().max()
    low = p[p["rate"] == p["rate"].min()]
    g40 = p[(p["groups"] == 40)]
    low40 = g40[g40["rate"] == g40["rate"].min()].set_index("blocks")
    mid40 = g40[g40["rate"] == 12.0].set_index("blocks")
    fit40, gone40 = fits[fits["groups"] == 40]["blocks"].min(), gone[gone["groups"] == 40]["blocks"].max()
    part40 = part[part["groups"] == 40]["blocks"].min()
    sim = pd.read_csv(results / "sim-accuracy" / "pressure.csv")
    sim_on = sim[(sim["mode"] == "on") & sim["run"].str.startswith("groups-")]
    sim_hit = (sim_on["hit_rate_measured_sim"] - sim_on["hit_rate_measured_meas"]).abs().max()

    def gain(r):
        return ("≥ " if r["gain_is_bound"] else "") + f"{100 * r['gain_mean_e2e']:.1f} %"

    return _block("h200-cache-pressure-says", [
        "- **Where it collapses.** The hit rate holds at its bound while the blocks cached between two uses of a "
        f"prefix fit the cache (ratio {', '.join(f'{x:.2f}' for x in sorted(fits['reuse']))}), falls to "
        + "; ".join(f"{r['hit']:.2f} of {r['bound']:.2f} at {r['reuse']:.2f}" for _, r in part.iterrows())
        + " and to nothing at " + ", ".join(f"{x:.2f} ({h:.3f})" for x, h in zip(gone["reuse"], gone["hit"], strict=True))
        + ". The working-set ratio predicts it badly: 48 groups collapse at "
        + ", ".join(f"{x:.2f}" for x in part[part["groups"] == 48]["ws"])
        + " of it, because the one-off prompts and every request's unique blocks churn the LRU queue too. Right "
        "after priming the spans are shorter, which is why part of the requests still hit when the steady state "
        "no longer fits.",
        f"- **Load.** The hit rate at a capacity does not depend on the rate: it moved by at most "
        f"{per_cap['move'].max():.3f} between {low['arrival_rate'].min():.1f} and {p['arrival_rate'].max():.1f} req/s "
        f"at every capacity run. What load changes is the cost of a miss: with 40 groups at "
        f"{low40['arrival_rate'].iloc[0]:.1f} req/s a collapsed cache takes the E2E gain from "
        f"{gain(low40.loc[fit40])} ({fit40:.0f} blocks) to {gain(low40.loc[gone40])} ({gone40:.0f} blocks); at "
        f"{mid40['arrival_rate'].iloc[0]:.1f} req/s from {gain(mid40.loc[fit40])} through {gain(mid40.loc[part40])} "
        f"({part40:.0f}) to {gain(mid40.loc[gone40])}.",
        "- **The estimate beside it.** The capacity-aware estimate (`hit_rate_estimated`: an LRU replay of the "
        f"requests as sent, with the engine's block count) is within {est_err:.3f} of the measured hit rate at every "
        f"ON point. The simulator (vLLM's own scheduler and KV-cache manager) is within {sim_hit:.3f} of it at all "
        f"{len(sim_on.groupby(['run', 'rate']))} ON points, each repeat "
        "(`experiments/results/sim-accuracy/pressure.md`)."])


def multiturn_says_block(results: Path = RESULTS) -> str:
    """h200-multiturn per turn (`prefixstudy breakdown --by turn`), and the simulator against it."""
    from prefixstudy.metrics.breakdown import breakdown

    st, _ = _study(results / "h200-multiturn")
    b = breakdown(st.requests, "turn")
    on, off = b[b["mode"] == "on"], b[b["mode"] == "off"]
    share = on.groupby("turn")["cached_share"]
    same = bool((share.max() - share.min() < 5e-4).all())
    turns = sorted(on["turn"].unique())
    prompt = on.groupby("turn")["prompt_tokens_mean"].mean()
    rates = sorted(b["rate"].unique())

    ttft = "; ".join(
        f"{_span(off[(off['turn'] == turns[0]) & (off['rate'] == r)]['mean_ttft_ms'], '.0f')} → "
        f"{_span(off[(off['turn'] == turns[-1]) & (off['rate'] == r)]['mean_ttft_ms'], '.0f')} ms at {r:g} sessions/s"
        for r in rates)
    gains = "; ".join(
        f"from {_span(100 * on[(on['turn'] == turns[0]) & (on['rate'] == r)]['e2e_gain'], '.0f', ' %')} on turn "
        f"{turns[0]} to {_span(100 * on[(on['turn'] == turns[-1]) & (on['rate'] == r)]['e2e_gain'], '.0f', ' %')} on "
        f"turn {turns[-1]} at {r:g} sessions/s" for r in rates)
    sim = pd.read_csv(results / "sim-accuracy" / "pressure.csv")
    mt = sim[sim["run"] == "multiturn"]
    hit_err = (mt["hit_rate_measured_sim"] - mt["hit_rate_measured_meas"]).abs().max()
    e2e_err = 100 * (mt.groupby(["mode", "rate"])["mean_e2e_ms_sim"].mean()
                     / mt.groupby(["mode", "rate"])["mean_e2e_ms_meas"].mean() - 1)
    hit_words = ("equals the measured one here" if hit_err < 5e-4 else
                 f"is within {hit_err:.3f} of the measured one here")
    e2e_words = (f"{_span(e2e_err, '.0f', ' %')} above it" if (e2e_err > 0).all() else
                 f"{_span(e2e_err, '+.0f', ' %')} off it")
    return _block("h200-multiturn-says", [
        "**What it says.** Later turns hit more of a longer prompt: the cached share is "
        + ", ".join(f"{share.mean()[t]:.3f}" for t in turns)
        + f" for turns {turns[0]}–{turns[-1]} ({prompt.iloc[0]:.0f} to {prompt.iloc[-1]:.0f} prompt tokens)"
        + (", in every repeat and at both rates" if same else "") + ". ON's TTFT stays at "
        + f"{_span(on['mean_ttft_ms'], '.0f')} ms on every turn, while OFF's grows with the history ({ttft}). The "
        f"E2E gain per turn grows with it, {gains}. The simulator's hit rate {hit_words}, and its mean E2E is "
        f"{e2e_words} (`sim-accuracy/pressure.md`)."])


def gc_table(results: Path = RESULTS) -> str:
    """h200-tp1-gc: ON at each rate it ran, with the heap frozen before every point."""
    summ = pd.read_csv(results / "h200-tp1-gc" / "summary.csv").sort_values("rate")
    out = [table_begin("h200-tp1-gc"), "| ON, TP 1 | dispatch lag p50 / p99 (ms) | mean E2E (ms) | mean TTFT (ms) |",
           "|---|---|---|---|"]
    for _, r in summ.iterrows():
        out.append(f"| {r['rate']:g} req/s | {r['dispatch_lag_p50_ms']:.3f} / {r['dispatch_lag_p99_ms']:.2f} | "
                   f"{r['mean_e2e_ms']:.1f} | {r['mean_ttft_ms']:.1f} |")
    return "\n".join(out + [END])


SMOKE = (("tp2-ray", "TP 2, Ray"), ("tp1-split", "TP 1, in-process"))


def smoke_table(results: Path = RESULTS) -> str:
    """h200-smoke-after-layout: each path's points, and whether every request finished, its hit
    rate was the expected one and no point saturated."""
    cols = ["run", "mode", "rate", "mean E2E (ms)", "finished", "hit rate (expected)", "saturated",
            "lag p99 (ms)"]
    out = [table_begin("h200-smoke-after-layout"), "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for sub, label in SMOKE:
        s = pd.read_csv(results / "h200-smoke-after-layout" / sub / "summary.csv")
        s = s.sort_values(["mode", "rate"], key=lambda c: c.map({"on": 0, "off": 1}) if c.name == "mode" else c)
        for _, r in s.iterrows():
            out.append(f"| {label} | {r['mode'].upper()} | {r['rate']:g} | {r['mean_e2e_ms']:.1f} | "
                       f"{int(r['n_ok'])} of {int(r['n_sent'])} | {r['hit_rate_measured']:.3f} "
                       f"({r['hit_rate_expected']:.3f}) | {'yes' if r['saturated'] else 'no'} | "
                       f"{r['dispatch_lag_p99_ms']:.2f} |")
    return "\n".join(out + [END])


def fidelity_table(results: Path = RESULTS) -> str:
    """`vllm bench serve`'s means per mode and rate (fidelity/bench.json)."""
    bench = json.loads((results / "fidelity" / "bench.json").read_text())
    out = [table_begin("fidelity"), "| mode | rate (req/s) | prompts | TTFT (ms) | TPOT (ms) | E2E (ms) | "
           "achieved rate (req/s) |", "|---|---|---|---|---|---|---|"]
    keys = sorted(bench, key=lambda k: (k.split("-")[0] != "on", float(k.split("-")[1])))
    for k in keys:
        b = bench[k]
        out.append(f"| {k.split('-')[0].upper()} | {b['request_rate']:g} | {b['completed']} of {b['num_prompts']} | "
                   f"{b['mean_ttft_ms']:.1f} | {b['mean_tpot_ms']:.2f} | {b['mean_e2el_ms']:.1f} | "
                   f"{b['request_throughput']:.2f} |")
    return "\n".join(out + [END])


def _ratios_cell(term: str, column: str, results: Path = RESULTS) -> float:
    """A cell of h200-tp-shard-profile/ratios.md (experiments/sim/tp_profile.py writes it)."""
    rows = [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in (results / "h200-tp-shard-profile" / "ratios.md").read_text().splitlines()
            if line.startswith("|") and not line.startswith("|---")]
    head = rows[0]
    row = next(r for r in rows[1:] if r[0].startswith(term))
    return float(row[head.index(column)].split()[0])


def ray_says_block(results: Path = RESULTS) -> str:
    """The step-cost fits of h200-tp1-sync (in process), h200-tp1-ray and h200-tp2 (through Ray) side by side."""
    f = {s: _manifest(s, results)["step_fit"] for s in ("h200-tp1-sync", "h200-tp1-ray", "h200-tp2")}
    sync, ray, tp2 = f["h200-tp1-sync"], f["h200-tp1-ray"], f["h200-tp2"]
    e, a = "e_ms_per_prefill_req", "a_ms"
    return _block("h200-tp1-ray-says", [
        f"- The **per-prefill-request cost** is {sync[e]:.2f} ms in process (h200-tp1-sync) and {ray[e]:.2f} ms "
        f"through Ray at TP 1, and {tp2[e]:.2f} ms at TP 2 through Ray: Ray's executor adds about "
        f"{ray[e] - sync[e]:.1f} ms per new request, and TP 2 costs {tp2[e] / ray[e]:.1f}× that.",
        f"- The **step's fixed cost c0** is {sync[a]:.2f} ms in process and {ray[a]:.2f} ms through Ray at TP 1, "
        f"and {tp2[a]:.2f} ms at TP 2: it is not host overhead that a second GPU leaves unchanged. The roofline "
        "transfer (`costmodel/transfer.py`) carries what the datasheet roofline does not explain of c0 unchanged; the "
        "step's fixed cost halves instead, as a weight read at the measured efficiency would.",
        f"- Per-token prefill and decode costs scale about as the roofline says "
        f"({tp2['b_ms_per_prefill_token'] / ray['b_ms_per_prefill_token']:.2f} and "
        f"{tp2['c_ms_per_decode_token'] / ray['c_ms_per_decode_token']:.2f} between the two Ray studies, against "
        f"{_ratios_cell('prefill_tokens', 'roofline transfer', results):.2f} and "
        f"{_ratios_cell('decode_tokens', 'roofline transfer', results):.2f}, `ratios.md`)."])


def _script(rel: str):
    """A script of the repository (experiments/...), loaded as a module."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(Path(rel).stem, REPO / rel)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def async_split_block(results: Path = RESULTS) -> str:
    """experiments/gpu/timing_check.py's split, trace and steps on h200-tp1-async's step traces."""
    tc = _script("experiments/gpu/timing_check.py")
    d = results / "h200-tp1-async"
    sp = {m: tc.split_table(str(d / f"step-trace-{m}.gz")).iloc[0] for m in ("off", "on")}
    tr = {m: tc.trace_table(str(d / f"step-trace-{m}.gz")) for m in ("off", "on")}
    steps = tc.check_steps(d).set_index(["mode", "rate"])
    st, _ = _study(d)
    from prefixstudy.metrics.requests import counted

    req = counted(st.requests)
    new = {m: float((g["prompt_tokens"] - g["num_cached_tokens"]).mean()) for m, g in req.groupby("mode")}
    alone = {m: tr[m].loc["prompt only"] for m in tr}
    decode_launch = _span([tr[m].loc["decode-only", "execute_model_ms_median"] for m in tr], ".1f")
    top = steps.index.get_level_values("rate").max()

    def both(col, spec=".1f"):
        a, b = (format(sp[m][col], spec) for m in ("off", "on"))
        return a if a == b else f"{a} / {b}"

    return _block("h200-tp1-async-split", [
        "`python experiments/gpu/timing_check.py split experiments/results/h200-tp1-async/step-trace-off.gz` (and "
        "`-on.gz`) splits each decode-only record followed by a step with prompt tokens (medians, OFF "
        f"{int(sp['off']['pairs'])} pairs / ON {int(sp['on']['pairs'])} pairs): the record, {both('record_N')} ms, is "
        f"{both('schedule_next')} ms scheduling N+1, **{both('execute_model_next')} ms in N+1's `execute_model`** "
        f"(preparing and launching a step that runs outside the full CUDA graphs), {both('sample_next_and_wait_N')} ms "
        f"launching N+1's sampling and waiting for N, {both('update_N')} ms updating from N. The step with prompt "
        f"tokens then records {both('record_next')} ms: its GPU work ran under the record before. Decode-only steps "
        f"spend {decode_launch} ms in `execute_model` (a full CUDA graph). For a step of prompt tokens alone "
        f"(`timing_check.py trace`, {_span([int(alone[m]['steps']) for m in alone], 'd')} such steps a mode, run while "
        f"nothing else ran) `execute_model` takes {alone['on']['execute_model_ms_median']:.1f} ms with {new['on']:.0f} "
        f"prompt tokens (ON) and {alone['off']['execute_model_ms_median']:.1f} ms with {new['off']:.0f} (OFF): the "
        f"{new['on']:.0f}-token step's is the host's preparation and launch outside the full CUDA graphs; the extra "
        f"{alone['off']['execute_model_ms_median'] - alone['on']['execute_model_ms_median']:.1f} ms with "
        f"{new['off']:.0f} tokens grow with the GPU's work, so the host is paced by the GPU there (a full launch "
        "queue or an implicit synchronisation: the trace does not tell which), and most of OFF's prefill runs on "
        "the GPU before the engine core gets to update the step before it. The check of h200-tp1-sync above fails "
        f"here (`timing_check.py steps`): {steps.loc[('off', top), 'prefill_faster']} of "
        f"{steps.loc[('off', top), 'pairs']} OFF and {steps.loc[('on', top), 'prefill_faster']} of "
        f"{steps.loc[('on', top), 'pairs']} ON prefill-after-decode steps at {top:g} req/s measured more than "
        f"{tc.NOISE_MS:g} ms shorter than the decode step before them."])


def async_gpu_block(results: Path = RESULTS) -> str:
    """timing_check.py gpu on the CUDA-event traces of h200-tp1-async/gpu-spans, and that lease's mean E2E."""
    tc = _script("experiments/gpu/timing_check.py")
    d = results / "h200-tp1-async"
    g = {m: tc.gpu_table(str(d / "gpu-spans" / f"step-trace-{m}.gz")) for m in ("off", "on")}
    spans = pd.read_csv(d / "gpu-spans" / "summary.csv").groupby("mode")["mean_e2e_ms"].mean()
    first = pd.read_csv(d / "summary.csv")
    rate = float(pd.read_csv(d / "gpu-spans" / "summary.csv")["rate"].iloc[0])
    first = first[first["rate"] == rate].groupby("mode")["mean_e2e_ms"].mean()

    def med(m, kind):
        r = g[m].loc[kind]
        return f"{r['gpu_ms_median']:.2f} against {r['record_ms_median']:.2f} ms"

    return _block("h200-tp1-async-gpu", [
        "`python experiments/gpu/timing_check.py gpu experiments/results/h200-tp1-async/gpu-spans/step-trace-off.gz` "
        f"(and `-on.gz`): of {int(g['off']['pairs'].iloc[0])} OFF / {int(g['on']['pairs'].iloc[0])} ON "
        f"prefill-after-decode pairs, **{int(g['off']['faster_by_gpu_span'].iloc[0])} / "
        f"{int(g['on']['faster_by_gpu_span'].iloc[0])} are shorter than the decode step before by their GPU spans, "
        f"{int(g['off']['faster_by_record'].iloc[0])} / {int(g['on']['faster_by_record'].iloc[0])} by their host "
        f"records**. Medians, GPU span against host record: OFF steps with prompt and decode tokens "
        f"{med('off', 'prompt and decode')}, decode-only {med('off', 'decode-only')}; ON "
        f"{med('on', 'prompt and decode')} and {med('on', 'decode-only')}. Mean E2E there: OFF {spans['off']:.0f} ms, "
        f"ON {spans['on']:.0f} ms (against {first['off']:.0f} and {first['on']:.0f} without the events, in the "
        "first lease)."])


def threeway_says_block(results: Path = RESULTS) -> str:
    """What h200-threeway says, from experiments/gpu/threeway.py's tables of the committed files."""
    import re

    tw = _script("experiments/gpu/threeway.py")
    t = pd.read_csv(results / "h200-threeway" / "threeway.csv")
    http = tw.gaps(t, "vllm-server (HTTP)")
    calm = http[~http["saturated"].astype(bool)]
    same = pd.concat([tw.bench_points().query("lease == 1").pipe(tw.table), t[t["way"] == "vllm-server (HTTP)"]],
                     ignore_index=True)
    same = tw.gaps(same, "vllm-server (HTTP)").dropna(subset=["e2e_gap_pct"])
    same = same[~same["saturated"].astype(bool)]
    peer = tw.bench_points()
    peer = peer[peer["rate"] == 16.0].groupby("mode")["e2e"]
    on_ttft = calm[calm["mode"] == "on"].sort_values("rate")
    sat = t[(t["mode"] == "off") & (t["rate"] == 32.0)]
    srv = pd.read_csv(results / "h200-vllm-server" / "summary.csv")
    srv = srv[(srv["mode"] == "off") & (srv["rate"] == 32.0)]
    limit = _manifest("h200-vllm-server", results)["points"][0]["admission_limit"]
    inproc = tw.gaps(t, "in-process").dropna(subset=["e2e_gap_pct"])
    inproc = inproc[~inproc["saturated"].astype(bool)]
    worst = inproc.loc[inproc["e2e_gap_pct"].abs().idxmax()]
    own = t[(t["way"] == "in-process") & (t["mode"] == worst["mode"]) & (t["rate"] == worst["rate"])].iloc[0]
    peer_n = int(t[(t["way"] == "vllm bench serve") & (t["mode"] == worst["mode"])
                   & (t["rate"] == worst["rate"])]["n"].iloc[0])
    tok = float(re.search(r"median ([0-9.]+) ms", (results / "h200-threeway" / "threeway.md").read_text()).group(1))

    def rng(s, spec=".1f"):
        return f"{_signed(s.min(), spec)} to {_signed(s.max(), spec)}"

    return _block("h200-threeway-says", [
        f"- **E2E: prefixstudy's HTTP path is within ±3 % of `vllm bench serve` at "
        f"{'every' if (calm['e2e_gap_pct'].abs() <= 3).all() else 'not every'} unsaturated point** "
        f"({rng(calm['e2e_gap_pct'], '+.1f')} %, {len(calm)} points). On the peer's same-machine repeat the gap is "
        f"{rng(same['e2e_gap_pct'], '+.1f')} %. The spread between repeats is as wide as the gap: the peer's "
        f"{peer.size()['on']} ON 16 req/s runs span {peer.min()['on']:.0f}–{peer.max()['on']:.0f} ms, and its OFF 16 "
        f"runs span {peer.min()['off']:.0f}–{peer.max()['off']:.0f} ms.",
        f"- **TTFT: the 2 ms goal is not met.** prefixstudy's HTTP TTFT is {-calm['ttft_gap_ms'].max():.1f}–"
        f"{-calm['ttft_gap_ms'].min():.1f} ms lower than the peer's.",
        "  - The gap is not the measurement clock. Both take TTFT on the client, from the send to the first "
        "streamed chunk.",
        "  - It is the work the peer's requests ask of the server and prefixstudy's do not. The peer sends text, so "
        f"the server tokenizes the prompt on every request: a median {tok:.2f} ms on one core (`threeway.py` times "
        "it with the same tokenizer). The server also detokenizes every output token of every stream, in the same "
        "frontend process and event loop that sends each request's first token.",
        "  - The gap grows with the rate (ON: " + ", ".join(f"{-x:.1f}" for x in on_ttft["ttft_gap_ms"]) + " ms at "
        + ", ".join(f"{r:g}" for r in on_ttft["rate"]) + " req/s). That fits frontend CPU work that scales with "
        "requests and tokens per second.",
        "  - Not shown: a run of the peer with token-id prompts. Its `prefix_repetition` dataset sends text.",
        "  - prefixstudy sends token ids on purpose. The prompt is then exactly the dataset's, and no tokenizer is "
        "needed. So this gap is a difference in workload, not an error. To reproduce the peer's TTFT, send text.",
        f"- **TPOT agrees within {calm['tpot_gap_ms'].abs().max():.2f} ms** at every unsaturated point.",
        f"- **OFF at 32 req/s is saturated in all three ways** (mean E2E {sat['e2e_ms'].min() / 1e3:.1f}–"
        f"{sat['e2e_ms'].max() / 1e3:.1f} s, a bound). Through HTTP there are no engine steps; the point is flagged "
        "because the server ran full: the client's requests in flight ("
        + ", ".join(f"{a:.0f} → {b:.0f}" for a, b in zip(srv["in_system_first"], srv["in_system_last"], strict=True))
        + f" from the window's first third to its last, a repeat each) passed 80 % of the {limit}-request limit it "
        "was launched with.",
        f"- **In-process vs the peer** (different leases): within ±5 % at {int((inproc['e2e_gap_pct'].abs() <= 5).sum())} "
        f"of {len(inproc)} unsaturated points; {worst['mode'].upper()} at {worst['rate']:g} req/s reads "
        f"{abs(worst['e2e_gap_pct']):.1f} % {'higher' if worst['e2e_gap_pct'] > 0 else 'lower'} (`threeway.md`). "
        f"h200-tp1's own repeats there span {own['e2e_min_ms']:.0f}–{own['e2e_max_ms']:.0f} ms; the peer ran "
        f"{peer_n} repeat{'s' if peer_n > 1 else ''}. "
        "In-process, the load generator shares one Python process with vLLM's frontend; through HTTP the server's "
        "frontend has a process of its own. A same-lease run of both paths would tell whether that costs anything "
        "under load (`experiments/gpu/README.md` has both commands)."])


def hit_rate_throughput_block(results: Path = RESULTS) -> str:
    """vLLM PR #53395's observation on h200-tp1: a high hit rate buys no output throughput while
    both arms keep up (an open loop serves what is offered), and a lot once OFF saturates."""
    s = pd.read_csv(results / "h200-tp1" / "summary.csv")
    m = s.groupby(["rate", "mode"])[["output_tok_s", "hit_rate_measured", "saturated"]].agg(
        {"output_tok_s": "mean", "hit_rate_measured": "mean", "saturated": "sum"}).unstack("mode")
    n = s.groupby("rate")["repeat"].nunique()
    up = [r for r in m.index if m.loc[r, ("saturated", "on")] == 0 and m.loc[r, ("saturated", "off")] == 0]
    past = [r for r in m.index if m.loc[r, ("saturated", "on")] == 0 and m.loc[r, ("saturated", "off")] == n[r]]
    hit = m[("hit_rate_measured", "on")].iloc[0]

    def tok(r):
        on, off = m.loc[r, ("output_tok_s", "on")], m.loc[r, ("output_tok_s", "off")]
        return f"{r:g} req/s: ON {on:,.0f} against OFF {off:,.0f} output tok/s ({_signed(100 * (on / off - 1), '+.1f')} %)"

    return _block("h200-tp1-hit-rate-throughput", [
        f"**A high hit rate and no throughput gain, until OFF saturates** (vLLM PR #53395 saw a 94.59 % hit rate "
        f"buy 5.7–6.2 % throughput). Here ON hits {hit:.3f} of the prompt tokens at every rate. Where both arms "
        f"kept up in every repeat, output throughput is the same: " + "; ".join(tok(r) for r in up) + ". An open "
        "loop serves what it is offered, so an engine that keeps up without the cache gains nothing in "
        "throughput from it; what caching buys there is latency (the gain column above). Where OFF saturated in "
        "every repeat and ON in none, it buys throughput: " + "; ".join(tok(r) for r in past) + ". "
        "The shared-fraction sweep (`cpu-shared-fraction`, `grid: {dataset.shared_fraction: [...]}`) sets the hit "
        "rate itself at a fixed prompt length."])


def cpu_replicas_says_block(results: Path = RESULTS) -> str:
    """cpu-replicas' hits, imbalance and latency per policy and rate (routing.csv, replicas.csv), and
    each policy's step fit."""
    d = results / "cpu-replicas"
    r = pd.read_csv(d / "routing.csv")
    on = r[r["mode"] == "on"].set_index(["policy", "rate"]).sort_index()
    aff, rr = on.loc["prefix_affinity"], on.loc["round_robin"]
    reps = pd.read_csv(d / "replicas.csv")
    routed = reps[(reps["policy"] == "prefix_affinity") & (reps["mode"] == "on")]["n_routed"]
    per_point = int(reps[(reps["policy"] == "round_robin")].groupby(["mode", "rate", "repeat"])["n_routed"].sum().iloc[0])
    r2 = {p: _manifest(f"cpu-replicas/policy-{p}", results)["step_fit"]["r2"] for p in ("round_robin", "prefix_affinity")}
    rr_off = pd.read_csv(d / "policy-round_robin" / "summary.csv")
    rr_off = rr_off[rr_off["mode"] == "off"]
    low = rr_off[rr_off["rate"] == rr_off["rate"].min()].sort_values("repeat")
    sat = r[(r["mode"] == "off") & (r["saturated_share"] > 0)]
    sat_counts = [(x, int(rr_off[rr_off["rate"] == x["rate"]]["saturated"].astype(bool).sum()),
                   len(rr_off[rr_off["rate"] == x["rate"]])) for _, x in sat.iterrows()]

    def seq(s, spec):
        return ", ".join(format(x, spec) for x in s)

    overlap = all((a["mean_e2e_lo"] <= b["mean_e2e_hi"]) and (b["mean_e2e_lo"] <= a["mean_e2e_hi"])
                  for (_, a), (_, b) in zip(aff.iterrows(), rr.iterrows(), strict=True))
    lines = [
        f"Step-cost fit R² {r2['round_robin']:.3f} (round robin) and {r2['prefix_affinity']:.3f} (affinity: two "
        "engines' steps interleaved on two cores).",
        "",
        f"- **Hits.** Affinity served {seq(aff['hit_rate_measured'], '.3f')} of prompt tokens from cache at "
        f"{seq(aff['arrival_rate'], '.2f')} req/s (actual rates); round robin {seq(rr['hit_rate_measured'], '.3f')}. "
        f"With an unbounded cache they would be {_span(aff['hit_rate_expected'], '.2f')} and "
        f"{_span(rr['hit_rate_expected'], '.2f')} (`hit_rate_expected`). Both lose more as load grows: more "
        "requests in flight hold blocks.",
        f"- **What affinity cost.** It routed {routed.min()} to {routed.max()} of a point's {per_point} requests to "
        f"one replica (requests imbalance, max/mean, {seq(aff['requests_imbalance'], '.2f')}); busy time was less "
        f"uneven ({seq(aff['busy_imbalance'], '.2f')}). Round robin: {_span(rr['requests_imbalance'], '.2f')}.",
        "- **Latency.** Affinity's mean E2E was " + ("lower at every rate: " if (aff["mean_e2e_ms"] < rr["mean_e2e_ms"]).all()
                                                    else "at each rate: ")
        + ", ".join(f"{a:.0f} vs {b:.0f}" for a, b in zip(aff["mean_e2e_ms"], rr["mean_e2e_ms"], strict=True))
        + " ms. " + ("**The intervals overlap at every rate**, so the report claims no clear difference: "
                     if overlap else "")
        + f"{int(aff['n_repeats'].iloc[0])} repeats on 2 shared cores, where OFF at {low['rate'].iloc[0]:g} req/s "
        f"read {' and '.join(f'{x:.0f}' for x in low['mean_e2e_ms'])} ms in its repeats."
        + "".join(f" OFF at {x['rate']:g} req/s saturated in {k} repeat{'s' if k > 1 else ''} of {n} (a bound, "
                  f"≥ {x['mean_e2e_ms']:.0f} ms)." for x, k, n in sat_counts),
    ]
    return _block("cpu-replicas-says", lines)


def cpu_default_says_block(results: Path = RESULTS) -> str:
    """cpu-default's hit rate, where OFF saturated, and the rate each mode sustains at the report's
    default p90 threshold (twice OFF's p90 E2E at the lowest rate)."""
    from prefixstudy.metrics.headline import rate_at_threshold
    from prefixstudy.metrics.requests import counted

    d = results / "cpu-default"
    head = pd.read_csv(d / "headline.csv").sort_values("arrival_rate")
    summ = pd.read_csv(d / "summary.csv")
    st, _ = _study(d)
    on = counted(st.requests)
    on = on[on["mode"] == "on"]
    off = summ[summ["mode"] == "off"]
    y = 2 * float(off[off["rate"] == off["rate"].min()]["p90_e2e_ms"].mean())
    top = head["arrival_rate"].max()

    def sustains(mode):
        v, lo, hi = rate_at_threshold(head, mode, y)
        if v == top:  # p90 never crossed the threshold: a bound
            return f"≥ {v:.1f} req/s (the highest rate run)"
        return f"{v:.1f} req/s [{lo:.1f}, {hi:.1f}]"

    sat = {m: summ[(summ["mode"] == m) & summ["saturated"].astype(bool)] for m in ("on", "off")}
    words = {m: ("saturated at " + ", ".join(f"{r['arrival_rate']:.1f}" for _, r in g.iterrows()) + " req/s"
                 if len(g) else "kept up at every rate") for m, g in sat.items()}
    return _block("cpu-default-says", [
        f"ON hit rate {on['num_cached_tokens'].sum() / on['prompt_tokens'].sum():.3f} "
        f"({on['num_cached_tokens'].mean():.0f} of {on['prompt_tokens'].mean():.0f} prompt tokens, "
        f"{int(st.manifest['points'][0]['block_size'])}-token blocks), OFF 0; OFF {words['off']}, ON {words['on']} "
        f"(actual rates). At p90 E2E ≤ {y:.0f} ms (twice OFF's p90 at its lowest rate) ON sustains "
        f"{sustains('on')} and OFF {sustains('off')}, as `report.md` has it."])


def _seed(study: str, results: Path = RESULTS):
    """A simulated seed study's summary by (mode, rate), its error bar function and knee words."""
    seed = _script("experiments/sim/seed.py")
    s = pd.read_csv(results / study / "summary.csv")
    band = seed.transfer_band(pd.read_csv(results / "sim-accuracy" / "accuracy.csv"))
    return s, band, seed


def _seed_at(s: pd.DataFrame, band, rate: float) -> str:
    on = s[(s["mode"] == "on") & (s["rate"] == rate)].iloc[0]
    off = s[(s["mode"] == "off") & (s["rate"] == rate)].iloc[0]
    return (f"{on['mean_e2e_ms']:.1f} ± {on['mean_e2e_ms'] * band('on', rate):.1f} / {off['mean_e2e_ms']:.1f} ± "
            f"{off['mean_e2e_ms'] * band('off', rate):.1f} ms at {rate:g} req/s "
            f"({(1 - on['mean_e2e_ms'] / off['mean_e2e_ms']) * 100:.1f} % saved)")


def _seed_knees(s: pd.DataFrame, seed) -> str:
    out = []
    for m in ("off", "on"):
        g = s[s["mode"] == m]
        sat = g[g["saturated"].astype(bool)]
        out.append(f"{m.upper()} saturates from {sat['rate'].min():g} req/s (knee {seed.knee_rate(s, m):g})" if len(sat)
                   else f"{m.upper()} does not saturate up to {g['rate'].max():g} req/s")
    return ", ".join(out)


def seed_says_block(results: Path = RESULTS) -> str:
    """docs/simulator.md's seed paragraphs: the three simulated seed studies, the transfer's error bars."""
    s, band, seed = _seed("sim-seed-a100x8-tp8", results)
    calib = json.loads((results / "sim-seed-a100x8-tp8" / "manifest.json").read_text())["sim"]["calibration"]

    def best(frame, t, m):
        r = seed.max_rate_meeting(frame, "mean_e2e_ms", t, m)
        top = " (the highest rate simulated)" if r == frame["rate"].max() else ""
        return "none" if math.isnan(r) else f"{'≥ ' if top else ''}{r:g} req/s{top}"

    at1 = s[s["rate"] == 1.0].set_index("mode")
    tpot = at1.loc["on", "mean_tpot_ms"]
    from prefixstudy.costmodel.step_cost import CostModel
    from prefixstudy.costmodel.step import StepFeatures

    cost = CostModel.load(results / "sim-seed-a100x8-tp8" / "cost_model.json")
    lone = StepFeatures(0, 1, 1300, 1, kv_tokens=1312)  # one request decoding, its 1214-token prompt and some output

    h8, b8, _ = _seed("sim-seed-h200x8-tp8", results)
    h4, b4, _ = _seed("sim-seed-h200x8-tp4-parallel", results)
    top = float(h8["rate"].max())
    return _block("seed-says", [
        f"Mistral-7B on 8×A100-40GB at TP 8, calibrated on {Path(calib).name}'s engine steps (vLLM's default "
        "engine: the GPU part on its GPU spans, the host's launch of each step on its host stamps), error bars from "
        "the TP 1 → TP 2 "
        f"transfer error at the same mode and nearest rate (measured on the one-step-at-a-time engine, the only "
        f"one run at two TP degrees; a lower bound for TP 8, not a bound: that transfer predicted "
        f"{band.direction}): mean E2E ON / OFF {_seed_at(s, band, 1.0)}, {_seed_at(s, band, 16.0)}, "
        f"{_seed_at(s, band, 32.0)}. {_seed_knees(s, seed)}. Under a 1 s mean E2E, ON serves {best(s, 1000, 'on')} "
        f"and OFF {best(s, 1000, 'off')}.",
        "",
        f"At 1 req/s the report says 115.35 → 94.56 ms, a 20.8 ms saving. The simulated saving is "
        f"{at1.loc['off', 'mean_e2e_ms'] - at1.loc['on', 'mean_e2e_ms']:.1f} ms. The absolute E2E is far from the "
        "report's: "
        f"ON's simulated TPOT there is {tpot:.2f} ms, so 143 output tokens take about {142 * tpot:.0f} ms of "
        "decode alone. The reported 94.56 ms cannot be 143 generated tokens on that hardware (fewer tokens, or "
        "TTFT, would explain it; the results README's TP 8 section has the roofline's floor). In the simulation a "
        f"lone request's step costs the GPU {cost.gpu_ms(lone):.2f} ms on 8 A100s and the host "
        f"{cost.launch_ms(lone):.2f} ms to launch (the slower of the two sets the pace), both carried from "
        f"{Path(calib).name} by the roofline; no run on the target checks either.",
        "",
        "For 8 × H200, where nothing has been measured ([`experiments/results/sim-seed-h200x8-tp8/`]"
        "(../experiments/results/sim-seed-h200x8-tp8/), `sim-seed-h200x8-tp4-parallel/`, the same calibration and "
        f"error bars, `--gpu H200-SXM --tp 8` / `--tp 4`, rates {h8['rate'].min():g}–{top:g}): 8×H200 at TP 8, ON / "
        f"OFF {_seed_at(h8, b8, 1.0)}, {_seed_at(h8, b8, top)}; {_seed_knees(h8, seed)}. Two TP-4 engines (one per "
        f"mode): {_seed_at(h4, b4, 1.0)}, {_seed_at(h4, b4, top)}; {_seed_knees(h4, seed)}."])


RENDER = {"h200-offload": offload_table, "tier-cost": lambda _: tier_cost_table(), "knees": lambda _: knees_table(),
          "h200-tp1-sync-steps": lambda _: sync_steps_block(), "h200-tp1-sync-says": lambda _: sync_says_block(),
          "h200-tp1-async-effect": lambda _: async_effect_block(), "h200-tp1-async-split": lambda _: async_split_block(),
          "h200-tp1-async-gpu": lambda _: async_gpu_block(), "h200-tp2-fit": lambda _: tp2_fit_block(),
          "h200-tp2-says": lambda _: tp2_says_block(), "h200-tp1-ray-checks": lambda _: ray_checks_block(),
          "h200-tp1-ray-says": lambda _: ray_says_block(),
          "h200-cache-pressure": lambda _: cache_pressure_table(),
          "h200-cache-pressure-says": lambda _: cache_pressure_says_block(),
          "h200-multiturn-says": lambda _: multiturn_says_block(), "h200-tp1-gc": lambda _: gc_table(),
          "h200-smoke-after-layout": lambda _: smoke_table(), "fidelity": lambda _: fidelity_table(),
          "h200-threeway-says": lambda _: threeway_says_block(), "cpu-replicas-says": lambda _: cpu_replicas_says_block(),
          "h200-tp1-hit-rate-throughput": lambda _: hit_rate_throughput_block(),
          "cpu-default-says": lambda _: cpu_default_says_block(),
          "tp8-model": lambda _: tp8_table(), "tp8-says": lambda _: tp8_says_block(),
          "seed-says": lambda _: seed_says_block(), "h200-tp1-slo-says": lambda _: slo_says_block(),
          "h200-shared-fraction-says": lambda _: shared_fraction_block(),
          "h200-sglang-says": lambda _: sglang_block(),
          "h100-tp1-spans-says": lambda _: spans_rerun_says_block(
              "h100-tp1-spans", "h100-tp1", "req/s", "the same config", workload_fit=False,
              machines="vLLM on another H100 the same day, there through Ray with one arm's sweep after the "
                       "other's and host stamps only, here in process with the arms taking turns"),
          "h200-multiturn-spans-says": lambda _: spans_rerun_says_block(
              "h200-multiturn-spans", "h200-multiturn", "sessions/s", "the same sessions"),
          "h200-cache-pressure-spans-says": lambda _: spans_rerun_says_block(
              "h200-cache-pressure-spans", "h200-cache-pressure/groups-48/blocks-6400", "req/s", "the same cell"),
          "h200-cache-pressure-spans-4400-says": lambda _: spans_rerun_says_block(
              "h200-cache-pressure-spans-4400", "h200-cache-pressure/groups-40/blocks-4400", "req/s", "the same cell")}
TABLES = {RESULTS / "README.md": ("h200-tp1", "h200-tp1-hit-rate-throughput", "h200-tp1-slo-says",
                                  "h200-shared-fraction-says", "h200-sglang-says",
                                  "h200-tp1-sync", "h200-tp1-sync-steps", "h200-tp1-sync-says",
                                  "h200-tp1-async-split", "h200-tp1-async-gpu", "h200-tp1-async-effect",
                                  "h200-tp2-fit", "h200-tp2", "h200-tp2-says", "h200-tp1-ray-checks", "h200-tp1-ray",
                                  "h200-tp1-ray-says", "h200-cache-pressure", "h200-cache-pressure-says",
                                  "h200-multiturn", "h200-multiturn-says", "h200-multiturn-sync",
                                  "h200-multiturn-spans", "h200-multiturn-spans-says",
                                  "h200-cache-pressure-spans", "h200-cache-pressure-spans-says",
                                  "h200-cache-pressure-spans-4400", "h200-cache-pressure-spans-4400-says",
                                  "h100-tp1-spans", "h100-tp1-spans-says", "h200-offload",
                                  "tier-cost", "h200-tp1-gc", "h200-smoke-after-layout", "fidelity",
                                  "h200-threeway-says", "tp8-model", "tp8-says", "cpu-replicas-says",
                                  "cpu-default-says", "knees"),
          REPO / "docs" / "simulator.md": ("seed-says",)}


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
