"""The tables and figures the README and docs show, rendered from the committed results.

Each block between ``<!-- results: NAME -->`` and ``<!-- /results -->`` in README.md, docs/**/*.md and
experiments/results/README.md is ``BLOCKS[NAME]`` of experiments/results (and the benchmarks' data); it
may move between those pages, and each name appears once.  ``FIGURES`` are written into plots/, and any
other image there is removed.  ``make results`` writes; ``--check`` exits 1 naming each stale block."""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import math
import re
import sys
from pathlib import Path

import pandas as pd
import yaml

from prefixstudy.configs import recorded_model_dir
from prefixstudy.costmodel import arch, engine_fit, gpus
from prefixstudy.metrics import gain_split, headline, order, requests
from prefixstudy.model import closure
from prefixstudy.report import figure_kit, first_screen, gain_split as split_report
from prefixstudy.results import load

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "experiments/results"
MARK = re.compile(r"(<!-- results: ([\w.-]+) -->\n)(.*?)(<!-- /results -->)", re.S)
IMAGES = (".png", ".svg", ".jpg", ".gif")
MID_HALF_POINTS = 10.0  # the widest gain interval (± points) that a study's mid rate may have
ARMS = ("on", "off")


def pages(repo: Path = REPO) -> list[Path]:
    return [p for p in (repo / "README.md", *sorted((repo / "docs").rglob("*.md")), repo / "experiments/results/README.md")
            if p.is_file()]


def script(rel: str):
    spec = importlib.util.spec_from_file_location(Path(rel).stem, REPO / rel)
    spec.loader.exec_module(mod := importlib.util.module_from_spec(spec))
    return mod


def ci(v: float, lo: float, hi: float, scale: float = 1.0, bound: bool = False) -> str:
    """``v [lo, hi]`` to the interval's precision: one digit of its half-width, two where that starts with 1."""
    v, lo, hi, mark = scale * v, scale * lo, scale * hi, "≥ " if bound else ""
    if not (math.isfinite(half := (hi - lo) / 2) and half > 0):
        return mark + num(v)
    d = math.floor(math.log10(half)) - (half / 10 ** math.floor(math.log10(half)) < 2)
    return mark + "{} [{}, {}]".format(*(f"{round(x, -d):.{max(0, -d)}f}" for x in (v, lo, hi)))


def num(x: float, digits: int = 3) -> str:
    return "–" if not math.isfinite(x) else f"{x:.{digits}g}" if abs(x) < 10 ** digits else f"{x:.0f}"


def table(header: list[str], rows: list[list], note: str = "") -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *("| " + " | ".join(map(str, r)) + " |" for r in rows)]
    return "\n".join(lines) + (f"\n\n{note}" if note else "")


def head(d: Path) -> pd.DataFrame:
    return pd.read_csv(d / "headline.csv").sort_values("arrival_rate").reset_index(drop=True)


def manifest(d: Path) -> dict:
    return json.loads((d / "manifest.json").read_text())


def calm(hd: pd.DataFrame, arms=ARMS) -> pd.DataFrame:
    """The rates where every repeat of ``arms`` kept up."""
    return hd[(hd[[f"{a}_saturated_share" for a in arms]] == 0).all(axis=1) & hd["gain_mean_e2e"].notna()]


@functools.cache
def study(d: Path):
    st = load(d)
    return st, engine_fit.recorded_coef(st.manifest.get("step_fit") or {})


def h200_tp1_rates(res: Path) -> str:
    ok, rows = calm(hd := head(res / "h200-tp1")), []
    for _, h in pd.concat([ok, hd[hd["arrival_rate"] > ok["arrival_rate"].max()].head(1)]).iterrows():
        sat = {a: round(h[f"{a}_saturated_share"] * h["n_repeats"]) for a in ARMS}
        e2e = {a: ci(h[f"{a}_mean_e2e_ms"], h[f"{a}_mean_e2e_lo"], h[f"{a}_mean_e2e_hi"], bound=sat[a] > 0) for a in ARMS}
        gain, share = ([h[f"{c}{s}"] for s in ("", "_lo", "_hi")] for c in ("gain_mean_e2e", "off_engine_prefill_share"))
        rows.append([num(h["arrival_rate"]), e2e["off"], e2e["on"], ci(*gain, 100, bool(h["gain_is_bound"])), ci(*share, 100),
                     ", ".join(f"{a.upper()} ({k} of {h['n_repeats']:.0f})" for a, k in sat.items() if k) or "neither"])
    return table(["arrival rate (req/s)", "OFF mean E2E (ms)", "ON mean E2E (ms)", "gain (%)",
                  "OFF prompt share of engine time (%)", "saturated"], rows,
                 "95 % intervals over the repeats (Student's t). ≥: a saturated mode's value, a bound.")


def h200_tp1_throughput(res: Path) -> str:
    slo = manifest(res / "h200-tp1-slo")["slo_search"]
    at = pd.read_csv(res / "h200-tp1-slo/summary.csv").groupby(["mode", "rate"])["arrival_rate"].mean()
    (metric, bound), = slo["objectives_ms"].items()
    r = {a: (at[(a, slo["arms"][a]["lo_req_s"])], at[(a, slo["arms"][a]["hi_req_s"])]) for a in ARMS}
    return table(["limit", "ON met (req/s)", "ON missed", "OFF met", "OFF missed", "ON / OFF [bracket]"],
                 [[f"{metric.replace('e2e_', 'E2E ')} ≤ {bound:g} ms", *(f"{r[a][i]:.1f}" for a in ARMS for i in (0, 1)),
                   f"{r['on'][0] / r['off'][0]:.1f} [{r['on'][0] / r['off'][1]:.1f}, {r['on'][1] / r['off'][0]:.1f}]"]],
                 "h200-tp1-slo: the SLO search on one H200, 2 repeats at each end, actual arrival rates.")


def capacity(res: Path) -> str:
    c, m = pd.read_csv(res / "h100-tp1-capacity/capacity.csv").set_index("mode"), manifest(res / "h100-tp1-capacity")
    on = c.loc["on"]
    return table(["arm", "sustained (req/s)", "not sustained (req/s)", "width", "ceiling (req/s)",
                  "repeats agreeing: sustained / not", "search stopped"],
                 [[a.upper(), num(r.sustained_req_s), num(r.saturated_req_s), f"{r.bracket_width:.2f}", num(r.ceiling_req_s),
                   f"{r.sustained_votes} of {r.sustained_repeats} / {r.saturated_votes} of {r.saturated_repeats}", r.stopped]
                  for a, r in c.loc[list(ARMS)].iterrows()],
                 f"ON / OFF: {on.ratio_vs_baseline:.1f} [{on.ratio_lo:.1f}, {on.ratio_hi:.1f}] (the brackets' bounds). One "
                 f"{m['device']}, the h200-tp1 config, {m['capacity_search']['edge_window_s']:g}-s windows next to the edge, "
                 "actual arrival rates; ceiling: completions/s while overloaded.")


def h200_tp1_run(res: Path) -> str:
    m, cfg = manifest(d := res / "h200-tp1"), yaml.safe_load((d / "config.yaml").read_text())
    reps = int(cfg["sweep"].get("repeats", 1))
    ran = {(float(p["rate"]), int(p["repeat"])) for p in m["points"] if p.get("status") == "ok" and p["mode"] == "off"}
    missing = [f"{r:g} req/s repeat {k + 1}" for r in cfg["sweep"]["rates"] for k in range(reps) if (float(r), k) not in ran]
    return table(["what", "h200-tp1"], [
        ["GPU", m["device"]], ["engine", f"{m['engine']} {m['vllm_version']}, {m['executor']} executor"],
        ["repeats a rate", reps], ["point length (s)", f"{cfg['sweep']['min_duration_s']:g}"],
        ["device calls (the engines restart at each)", 1 + len(m.get("resumed_at") or [])],
        ["points not run", ", ".join(missing) or "none"], ["step timing", ", ".join(m["step_timing"])],
        ["step-timing checks", {True: "pass", False: "fail"}.get((m.get("step_checks") or {}).get("ok"), "not run")]])


def interval_coverage(res: Path) -> str:
    c = json.loads((REPO / "benchmarks/results/interval_loo.json").read_text())["summary"]
    how = {"t_repeats": "t over the other repeats' means", "within": "the requests' own noise",
           "within_pooled": "the requests' noise and a between-repeat variance pooled over other rates"}
    return table(["a left-out repeat's mean predicted by", "held out", "inside the 95 % interval"],
                 [[how[k], c[k]["held_out"], c[k]["covered"]] for k in how])


def async_vs_sync(res: Path) -> str:
    sync, async_ = pd.read_csv(res / "h200-tp1-sync/summary.csv"), pd.read_csv(res / "h200-tp1/summary.csv")
    t, _ = script("experiments/gpu/async_effect.py").async_effect(sync, async_)
    hot = {(m, r) for s in (sync, async_) for m, r, x in zip(s["mode"], s["rate"], s["saturated"], strict=True) if x}
    return table(["arm", "offered rate (req/s)", "mean E2E lower with async scheduling (%)"],
                 [[m.upper(), f"{r:g}", f"{100 * (1 - 1 / (1 + x / 100)):.0f}"]
                  for (m, r), x in t[("change_pct", "mean_e2e_ms")].dropna().items() if (m, r) not in hot])


def split_table(res: Path) -> str:  # per rate both arms kept up: both measures of the split, and the arm order's effect
    st, coef = study(d := res / "h200-tp1")
    c = split_report.cells((g := gain_split.both(st.requests, st.iterations, coef)[0])[g["rate"].isin(calm(head(d))["rate"])])
    o = order.order_effect(st.manifest["points"], pd.read_csv(d / "summary.csv"), "on", "off").set_index("rate")
    rows = [[f"{r.rate:g}", r.measure, r.gain, *(r[p] for p in split_report.SHOWN), f"{o.loc[r.rate, 'difference_points']:+.1f}"
             if r.rate in o.index and r.measure == "fitted" else ""] for _, r in c.iterrows()]
    return table(["offered rate (req/s)", "measure", "gain (points)", "others' prompt chunks in its decode steps", "own prefill",
                  "decode steps", "queue", "unpriced", "residual", "gain with ON first − with OFF first"], rows,
                 "95 % intervals over the repeats (Student's t); where the measures differ by a point or more, whole points.")


def step_fit(res: Path) -> str:
    st, coef = study(res / "h200-tp1")
    fit, req = st.manifest["step_fit"], requests.counted(st.requests)
    ph = closure.physics(coef, arch.load_arch(recorded_model_dir(st.config["model"])), gpus.get_gpu(st.manifest["device"]),
                 float((req["prompt_tokens"] + req["output_tokens"] / 2).mean())).set_index("coefficient")
    terms = [("a_ms", "a step (fixed)", ".2f"), ("b_ms_per_prefill_token", "a prompt token", ".3f"),
             ("e_ms_per_prefill_req", "a prefilling request", ".2f"), ("c_ms_per_decode_token", "a decode token", ".3f")]
    rows = [[w, f"{fit[k]:{f}}", f"{100 * ph.loc[k, 'share']:.0f}" if k in ph.index else "–"] for k, w, f in terms]
    rows.append(["R², every busy step", f"{fit['r2']:.3f} ({fit['n']:,} steps)", ""])
    rows += [["R², ON's steps with prompt tokens", f"{k['r2']:.2f} ({k['n']:,} steps)", ""]
             for k in fit.get("by_kind") or [] if k["mode"] == "on" and k["kind"] == "mixed"]
    rows.append(["a prefilling request, sync engine (h200-tp1-sync)",
                 f"{manifest(res / 'h200-tp1-sync')['step_fit']['e_ms_per_prefill_req']:.2f}", "–"])
    pred = closure.arm_table(coef, hd := head(res / "h200-tp1"), req, closure.admission_limit(st.manifest), ARMS).set_index("arm")
    return table(["cost of", "fitted (ms)", "datasheet explains (%)"], rows) + "\n\n" + table(
                 ["arm", "engine time a request adds (ms)", "predicted knee (req/s)", "measured: kept up at",
                  "measured: saturated at"],
                 [[a.upper(), f"{pred.loc[a, 'work_ms']:.1f}", f"{pred.loc[a, 'knee_rate']:.0f}",
                   *(f"{headline.knee_bracket(hd, a)[k]:.1f}" for k in ("lo", "hi"))] for a in ARMS],
                 f"A step's fixed cost a = {coef[0]:.2f} ms.")


def threeway(res: Path) -> str:
    t = pd.read_csv(res / "h200-threeway/threeway.csv").set_index(["way", "mode", "rate"])
    peer = t.loc["vllm bench serve"]
    rows = [[way, m.upper(), f"{r:g}", f"{x.e2e_ms:.0f}", f"{peer.loc[(m, r), 'e2e_ms']:.0f}",
             f"{100 * (x.e2e_ms / peer.loc[(m, r), 'e2e_ms'] - 1):+.1f}"] for (way, m, r), x in t.iterrows()
            if way != "vllm bench serve" and (m, r) in peer.index and not (x.saturated or peer.loc[(m, r), "saturated"])]
    return table(["prefixstudy", "arm", "offered rate", "its mean E2E (ms)", "vllm bench serve's (ms)", "gap (%)"], rows)


def studies(res: Path) -> str:
    rows = []
    for d in sorted(p for p in res.iterdir() if (p / "summary.csv").is_file()):
        m, summ = manifest(d), pd.read_csv(d / "summary.csv")
        arms = list(dict.fromkeys(summ["mode"]))
        engine = m.get("engine") or yaml.safe_load((d / "config.yaml").read_text())["engine"].get("kind", "vllm")
        rates = summ.groupby("rate")["arrival_rate"].mean()
        hd, gain = head(d), "–"
        both = [a for a in arms if f"{a}_saturated_share" in hd]
        ok = calm(hd, both[:2])  # one arm: no gain
        narrow = ok[50 * (ok["gain_mean_e2e_hi"] - ok["gain_mean_e2e_lo"]) <= MID_HALF_POINTS]
        for _, h in (narrow if len(narrow) else ok).iloc[-1:].iterrows():
            gain = f"{ci(*(h[f'gain_mean_e2e{s}'] for s in ('', '_lo', '_hi')), 100)} at {num(h['arrival_rate'])}"
        kept = [f"{a.upper()} {'' if math.isfinite(b['hi']) else '≥ '}{num(b['lo'])}"
                for a, b in ((a, headline.knee_bracket(hd, a)) for a in both)]
        rows.append([f"[{d.name}]({d.name}/{'report.md' if (d / 'report.md').is_file() else ''})", m.get("device", "–"),
                     f"{engine} {m.get('vllm_version') or ''}: {', '.join(a.upper() for a in arms)}".replace(" :", ":"),
                     f"{num(rates.min())}–{num(rates.max())} ({len(rates)})", int(summ["repeat"].max()) + 1, gain,
                     ", ".join(kept) or "–"])
    return table(["study", "GPU / machine", "engine: arms", "arrival rates (req/s; count)", "repeats",
                  "gain in mean E2E (%) at a mid rate (req/s)", "highest sustained rate (req/s)"], rows)


def sim_table(res: Path, csv: str, mod: str = "accuracy_async", fn: str = "summary") -> str:
    m, df = script(f"experiments/sim/{mod}.py"), pd.read_csv(res / "sim-accuracy" / csv)
    return getattr(m, fn)(df if fn == "verifiable" else m.per_point(df))


def seed_says(res: Path) -> str:
    band = script("experiments/sim/seed.py").transfer_band(pd.read_csv(res / "sim-accuracy/accuracy.csv"))
    rows = []
    for name in ("sim-seed-a100x8-tp8", "sim-seed-h200x8-tp8", "sim-seed-h200x8-tp4-parallel"):
        s = pd.read_csv(res / name / "summary.csv")
        by = {a: s[s["mode"] == a].set_index("rate") for a in ARMS}
        for r in [x for x in by["on"].index.intersection(by["off"].index) if x in (1, 16, 32, s["rate"].max())]:
            e2e = {a: t.loc[r, "mean_e2e_ms"] for a, t in by.items()}
            cells = [ci(e2e[a], e2e[a] * (1 - band(a, r)), e2e[a] * (1 + band(a, r)), bound=bool(by[a].loc[r, "saturated"]))
                     for a in ARMS]
            rows.append([name.removeprefix("sim-seed-"), f"{r:g}", *cells, f"{100 * (1 - e2e['on'] / e2e['off']):.0f}",
                         ", ".join(a.upper() for a in ARMS if by[a].loc[r, "saturated"]) or "neither"])
    return table(["simulated target", "rate (req/s)", "ON mean E2E (ms)", "OFF mean E2E (ms)", "saved (%)", "saturated"], rows,
                 f"Brackets: the TP 1 → TP 2 transfer's error at that mode and nearest rate ({band.direction}).")


def sim_capacity(res: Path) -> str:
    """Each arm's measured capacity bracket beside the one the simulator predicts from another study's steps."""
    meas, sim = res / "h100-tp1-capacity", res / "sim-accuracy/capacity-h100-tp1"
    c = {d: pd.read_csv(d / "capacity.csv").set_index("mode") for d in (meas, sim)}
    cal = res / Path(manifest(sim)["sim"]["calibration"]).name
    same = {what: "the same" if set.intersection(*({x[k][:n] for x in manifest(d)["machines"]} for d in (meas, cal)))
            else "another" for what, k, n in (("card", "device_uuid", None), ("day", "at", 10))}
    rows = []
    for arm, mode, cols in [*((a.upper(), a, ("sustained_req_s", "saturated_req_s", "ceiling_req_s")) for a in ARMS),
                            ("ON / OFF", "on", ("ratio_lo", "ratio_hi", None))]:
        (m_lo, m_hi), (s_lo, s_hi) = ((c[d].loc[mode, cols[0]], c[d].loc[mode, cols[1]]) for d in (meas, sim))
        rows.append([arm, *(f"{c[d].loc[mode, col]:#.3g}" if col else "–" for d in (meas, sim) for col in cols),
                     "yes" if m_lo < s_hi and s_lo < m_hi else "no"])
    ratio = {d: f"{c[d].loc['on', 'ratio_vs_baseline']:#.3g}" for d in (meas, sim)}
    return table(["arm", "measured: sustained (req/s)", "not sustained", "ceiling", "simulated: sustained", "not sustained",
                  "ceiling", "brackets overlap"], rows,
                 f"Measured: {meas.name}, one {manifest(meas)['device']}, the h200-tp1 config, "
                 f"{manifest(meas)['capacity_search']['edge_window_s']:g}-s windows next to the edge. Simulated: the same "
                 f"config and search, calibrated on {cal.name} ({same['card']} card, {same['day']} day). Actual arrival "
                 f"rates. ON / OFF: the bounds the brackets allow; the ratio of their geometric means is {ratio[meas]} "
                 f"measured, {ratio[sim]} simulated. A bracket is where the search's verdict changed, not a confidence "
                 "interval.")


BLOCKS = {
    "h200-tp1-rates": h200_tp1_rates, "h200-tp1-throughput": h200_tp1_throughput, "h200-tp1-run": h200_tp1_run,
    "capacity": capacity, "interval-coverage": interval_coverage, "async-vs-sync": async_vs_sync, "gain-split": split_table,
    "step-fit": step_fit, "threeway": threeway, "studies": studies, "seed-says": seed_says,
    **{name: lambda res, v=verdict: (s := script("benchmarks/saturation_error_rates.py")).markdown(s.read_rows(), v)
       for name, verdict in (("saturated", "saturated"), ("saturated-http", "saturated_http"))},
    "sim-accuracy": lambda res: sim_table(res, "accuracy.csv", "accuracy"),
    "sim-accuracy-async": lambda res: sim_table(res, "async.csv"),
    "sim-accuracy-async-verifiable": lambda res: sim_table(res, "async.csv", fn="verifiable"),
    "sim-gpu-transfer": lambda res: sim_table(res, "gpu-transfer.csv"), "sim-capacity": sim_capacity,
}
FIGURES = {"plots/h200-tp1-e2e.png": lambda res: first_screen.e2e_with_intervals(head(res / "h200-tp1"))}


def rendered(res: Path = RESULTS, repo: Path = REPO) -> dict[Path, str]:
    """Every page that holds a block, as it should read; an unknown or repeated name is an error."""
    out, seen, cache = {}, {}, {}
    for page in pages(repo):
        text = page.read_text()
        for _, name, _, _ in MARK.findall(text):
            if name not in BLOCKS or name in seen:
                raise SystemExit(f"{page.relative_to(repo)}: " + (f"block {name!r} also in {seen[name]}" if name in seen
                                 else f"unknown block {name!r}; known: {', '.join(BLOCKS)}"))
            seen[name] = page.relative_to(repo)
            cache[name] = BLOCKS[name](res).rstrip("\n")
        if MARK.search(text):
            out[page] = MARK.sub(lambda mt: f"{mt[1]}{cache[mt[2]]}\n{mt[4]}", text)
    return out


def stale(res: Path = RESULTS, repo: Path = REPO) -> list[str]:
    """One line per stale block (page and name), and per figure missing, not made here or shown by no page."""
    bad = []
    for page, text in rendered(res, repo).items():
        old = {name: body for _, name, body, _ in MARK.findall(page.read_text())}
        bad += [f"{page.relative_to(repo)}: block {name} is stale" for _, name, body, _ in MARK.findall(text)
                if old[name] != body]
    images = {p.relative_to(repo).as_posix() for p in (repo / "plots").rglob("*") if p.suffix in IMAGES}
    bad += [f"{f}: " + ("missing" if f in FIGURES else "not made by make results") for f in sorted(images ^ set(FIGURES))]
    return bad + [f"{f}: shown by no page" for f in sorted(FIGURES) if not any(f in p.read_text() for p in pages(repo))]


def write(res: Path = RESULTS, repo: Path = REPO) -> None:
    for page, text in rendered(res, repo).items():
        page.write_text(text)
    for p in (repo / "plots").rglob("*"):
        if p.suffix in IMAGES and p.relative_to(repo).as_posix() not in FIGURES:
            p.unlink()
    for rel, fig in FIGURES.items():
        figure_kit.save(fig(res), (repo / rel).with_suffix(""), ("png",))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 naming each stale block or figure")
    ap.add_argument("--results", type=Path, default=RESULTS, help="the results folder (default: experiments/results)")
    a = ap.parse_args(argv)
    bad = stale(a.results) if a.check else write(a.results) or []
    print("".join(f"{b}; run make results\n" for b in bad), end="")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
