"""prefixstudy report / compare / export-bench on a synthetic results folder.

The study comes from benchmarks/report_speed.py's generator (schema-true frames, a
single-server queue per mode: OFF saturates before ON), summarized by
prefixstudy.metrics.summary.summarize as a real run is.  The Chromium test needs Debian's
``chromium`` (apt-get install -y chromium); it fails, never skips, without it.
"""

from __future__ import annotations

import html
import importlib.util
import json
import math
import re
import shutil
import struct
import subprocess
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from prefixstudy.metrics.requests import goodput
from prefixstudy.metrics.headline import rate_at_threshold
from prefixstudy.report import bench_import as exchange
from prefixstudy.cli import main as cli_main
from prefixstudy.report import build_report
from prefixstudy.report.precision import rounded, with_ci
from prefixstudy.report.saturation_codes import codes
from prefixstudy.report.tables import bound_mark
from prefixstudy.results import load
from tests.unit.report.test_first_screen import assert_first_screen_is_short, md_tables

# Its module fixtures take seconds (studies, reports, venvs): the whole file runs in `make test`, not `make test-fast`.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]
ARTIFACTS = ROOT / "tests" / "artifacts"  # git ignores it
RATES = (1.0, 2.0, 4.0, 8.0, 16.0)
FAILED = (("off", 32.0, "engine died: CUDA error"),)
STEMS = ("e2e_intervals", "e2e_vs_rate", "ttft_vs_rate", "latency_breakdown", "max_rate_vs_threshold", "caching_gain",
         "engine_timeseries", "e2e_cdf", "prefill_share")


def _generator():
    spec = importlib.util.spec_from_file_location("report_speed", ROOT / "benchmarks" / "report_speed.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.write_synthetic_study


write_synthetic_study = _generator()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    run = write_synthetic_study(tmp_path_factory.mktemp("study"), RATES, 40, failed=FAILED)
    build_report(run)
    return run


def _points(run: Path) -> list[tuple[str, float]]:
    man = json.loads((run / "manifest.json").read_text())
    return [(p["mode"], float(p["rate"])) for p in man["points"]]


# ----------------------------------------------------------------- files

def test_every_figure_is_written_non_empty(run_dir):
    for stem in STEMS:
        for ext in ("png", "svg"):
            f = run_dir / "plots" / f"{stem}.{ext}"
            assert f.is_file() and f.stat().st_size > 2000, f
    png = (run_dir / "plots" / "e2e_vs_rate.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert (run_dir / "plots" / "e2e_vs_rate.svg").read_text().lstrip().startswith("<?xml")


def test_html_is_self_contained_and_names_every_point(run_dir):
    page = (run_dir / "report.html").read_text()
    srcs = re.findall(r"<img [^>]*src='([^']*)'", page)
    assert len(srcs) == len(STEMS)
    assert all(s.startswith("data:image/png;base64,") and len(s) > 5000 for s in srcs)
    assert "plots/" not in page  # nothing linked from outside the page
    for mode, rate in _points(run_dir):
        assert f"{mode.upper()} @ {rate:g} req/s" in page, (mode, rate)
    assert "engine died: CUDA error" in page and "failed" in page
    md = (run_dir / "report.md").read_text()
    for stem in STEMS:
        assert f"(plots/{stem}.png)" in md and f"(plots/{stem}.svg)" in md


def test_headline_agrees_with_summary_csv(run_dir):
    md = (run_dir / "report.md").read_text()
    m = re.search(r"At p90 E2E ≤ ([\d.]+) ms caching ON sustains ([\d.]+) req/s .* and OFF ([\d.]+) req/s", md)
    assert m, md[:800]
    y, x, z = (float(g) for g in m.groups())
    summ = pd.read_csv(run_dir / "summary.csv")
    head = pd.read_csv(run_dir / "headline.csv")
    off = summ[(summ["mode"] == "off") & (summ["status"] == "ok")].sort_values("rate")
    assert y == round(2 * off["p90_e2e_ms"].iloc[0], 1)  # the stated default threshold
    for mode, sustained in (("on", x), ("off", z)):  # headline.csv's crossing, interpolated
        assert sustained == round(rate_at_threshold(head, mode, 2 * off["p90_e2e_ms"].iloc[0])[0], 1)
    # the saturation sentence names headline.csv's saturated rates (actual arrival rates)
    for mode in ("on", "off"):
        sat = head.loc[head[f"{mode}_saturated"], "arrival_rate"].tolist()
        if sat:
            assert f"Caching {mode.upper()}: saturated at {', '.join(f'{r:.2f}' for r in sat)} req/s" in md
    assert sum(1 for line in md.splitlines() if "⚠" in line) >= 2  # saturated rows are marked


def test_slo_goodput_and_threshold(tmp_path):
    run = write_synthetic_study(tmp_path, (1.0, 4.0, 16.0), 30)
    build_report(run, slo="ttft=100,e2e=300", n_boot=50)
    md = (run / "report.md").read_text()
    assert "At p90 E2E ≤ 300.0 ms" in md and "Threshold: the e2e SLO" in md
    assert "goodput (req/s)" in md
    s = load(run)
    gp = goodput(s.requests, {"ttft": 100.0, "e2e": 300.0}, durations=s.summary)
    row = gp[(gp["mode"] == "on") & (gp["rate"] == 1.0)].iloc[0]
    assert f"| {row['goodput_rps']:.2f} |" in md


def test_model_section_for_a_known_gpu(tmp_path, monkeypatch):
    import prefixstudy.model.calibrate as model

    run = write_synthetic_study(tmp_path, (1.0, 2.0), 20, device="NVIDIA H100 80GB HBM3")
    seen = {}

    def fake(summary_df, requests_df, iterations_df, config_dict, device_name):
        seen["device"] = device_name
        return pd.DataFrame({"mode": ["on"], "rate": [1.0], "quantity": ["prefill"],
                             "measured_ms": [8.0], "predicted_ms": [7.5], "error_pct": [-6.25]})

    monkeypatch.setattr(model, "model_vs_measurement", fake)
    build_report(run, n_boot=20)
    md = (run / "report.md").read_text()
    assert seen["device"] == "NVIDIA H100 80GB HBM3"
    assert "## Model vs measurement" in md and "| -6.25 |" in md


def test_no_model_section_on_cpu(run_dir):
    assert "Model vs measurement" not in (run_dir / "report.md").read_text()


# ----------------------------------------------------------------- exchange

VLLM_FIELDS = ("date", "backend", "label", "model_id", "num_prompts", "request_rate",
               "max_concurrency", "duration", "completed", "failed", "total_input_tokens", "total_output_tokens",
               "request_throughput", "request_goodput", "output_throughput", "total_token_throughput",
               "mean_ttft_ms", "median_ttft_ms", "std_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms",
               "p99_tpot_ms", "mean_itl_ms", "mean_e2el_ms", "median_e2el_ms", "p99_e2el_ms",
               "max_output_tokens_per_s", "max_concurrent_requests")


def test_export_bench_matches_summary_and_round_trips(run_dir, tmp_path):
    res = CliRunner().invoke(cli_main, ["export-bench", str(run_dir), "--out", str(tmp_path / "bench")])
    assert res.exit_code == 0, res.output
    files = sorted((tmp_path / "bench").glob("*.json"))
    assert len(files) == 2 * len(RATES)  # the failed point is not exported
    summ = pd.read_csv(run_dir / "summary.csv").set_index(["mode", "rate"])
    for f in files:
        r = json.loads(f.read_text())
        assert all(k in r for k in VLLM_FIELDS), set(VLLM_FIELDS) - set(r)
        assert r["burstiness"] is None  # written always; constant arrivals (this study) have no gamma shape
        s = summ.loc[(r["prefixstudy_mode"], r["request_rate"])]
        assert r["completed"] == s["n_ok"]
        assert r["mean_e2el_ms"] == pytest.approx(s["mean_e2e_ms"], rel=1e-12)
        assert r["p99_ttft_ms"] == pytest.approx(s["p99_ttft_ms"], rel=1e-12)
        assert r["request_throughput"] == pytest.approx(s["achieved_rate"], rel=1e-12)
        assert r["prefix_caching"] == (r["prefixstudy_mode"] == "on")
        assert r["saturated"] == bool(s["saturated"])
    peers = exchange.peer_points(files, label="peer")
    assert len(peers) == 2 * len(RATES)
    assert sorted(peers["rate"].unique()) == list(RATES)
    run = Path(shutil.copytree(run_dir, tmp_path / "run"))  # leave the shared report as it was
    build_report(run, peers=[files[0]], n_boot=20)
    assert "Peer measurements overlaid" in (run / "report.md").read_text()


def test_load_bench_accepts_append_result_lines(tmp_path):
    f = tmp_path / "peer.json"
    f.write_text(json.dumps({"request_rate": 2.0, "mean_e2el_ms": 10.0, "label": "a"}) + "\n"
                 + json.dumps({"request_rate": "inf", "request_throughput": 5.0, "mean_e2el_ms": 20.0}) + "\n")
    p = exchange.peer_points(f)
    assert p["rate"].tolist() == [2.0, 5.0] and p["rate_is_achieved"].tolist() == [False, True]
    assert p["mean_e2e_ms"].tolist() == [10.0, 20.0] and math.isnan(p["p99_e2e_ms"].iloc[0])


# ----------------------------------------------------------------- CLI

def _one_line_error(res, words):
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and words in lines[0], res.output


@pytest.mark.parametrize("args, words", [
    (["--slo", "ttft=fast"], "not a number"),
    (["--slo", "p50=3"], "unknown key"),
    (["--point", "3"], "no finished point at that rate"),
    (["--point", "sideways 3"], "expected [MODE] RATE"),
    (["--peer", "missing.json"], "file not found"),
])
def test_report_cli_bad_input(run_dir, args, words):
    _one_line_error(CliRunner().invoke(cli_main, ["report", str(run_dir), *args]), words)


def test_report_cli_not_a_results_folder(tmp_path):
    _one_line_error(CliRunner().invoke(cli_main, ["report", str(tmp_path / "nope")]), "not found")


def test_report_cli_point_and_peer(run_dir, tmp_path):
    peer = tmp_path / "peer.json"
    peer.write_text(json.dumps({"request_rate": 4.0, "mean_e2el_ms": 150.0, "p99_e2el_ms": 300.0,
                                "mean_ttft_ms": 20.0, "p99_ttft_ms": 40.0, "label": "other-lab"}))
    run = Path(shutil.copytree(run_dir, tmp_path / "run"))  # leave the shared report as it was
    res = CliRunner().invoke(cli_main, ["report", str(run), "--point", "on 2", "--peer", str(peer)])
    assert res.exit_code == 0, res.output
    assert "Figure 8. Engine state over time at 2 req/s set, first repeat (chosen with --point)" in \
        (run / "report.md").read_text()


def test_compare_overlays_studies(tmp_path):
    a = write_synthetic_study(tmp_path / "a", (1.0, 4.0, 16.0), 20, study="small", device="cpu", tp=1)
    b = write_synthetic_study(tmp_path / "b", (1.0, 4.0, 16.0), 20, seed=1, study="big", device="cpu", tp=2)
    out = tmp_path / "cmp"
    res = CliRunner().invoke(cli_main, ["compare", str(a), str(b), "--out", str(out)])
    assert res.exit_code == 0, res.output
    page = (out / "report.html").read_text()
    assert "small / cpu / TP=1" in page and "big / cpu / TP=2" in page
    assert page.count("data:image/png;base64,") == 5
    for f in ("compare_e2e", "compare_ttft", "compare_gain", "compare_max_rate_e2e", "compare_max_rate_ttft"):
        assert (out / "plots" / f"{f}.png").stat().st_size > 2000 and (out / "plots" / f"{f}.svg").is_file()
    _one_line_error(CliRunner().invoke(cli_main, ["compare", str(a)]), "at least two")


# ----------------------------------------------------------------- in a real browser

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage"]
IMG_PROBE = """<script>
window.addEventListener('load', function () {
  var out = [].slice.call(document.images).map(function (i) {
    return {src: i.getAttribute('src').slice(0, 22), w: i.naturalWidth, h: i.naturalHeight, ok: i.complete};
  });
  var pre = document.createElement('pre'); pre.id = 'imgcheck'; pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""


def _chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if exe is None:
        pytest.fail("chromium not found; install it: apt-get install -y --no-install-recommends chromium")
    return exe


def test_the_first_screen_is_the_figure_one_table_and_four_findings(run_dir):
    md = (run_dir / "report.md").read_text()
    table = assert_first_screen_is_short(md)
    head = pd.read_csv(run_dir / "headline.csv").sort_values("arrival_rate")
    summ = pd.read_csv(run_dir / "summary.csv").fillna({"saturation_reason": ""})
    assert list(table.columns) == ["rate (req/s)", "ON E2E (ms)", "OFF E2E (ms)", "gain % [CI]", "OFF prompt %",
                                   "saturated"]
    assert table["rate (req/s)"].tolist() == [f"{r:.2f}".rstrip("0").rstrip(".") for r in head["arrival_rate"]]
    for mode in ("on", "off"):  # a saturated mean is a lower bound
        assert table[f"{mode.upper()} E2E (ms)"].tolist() == [
            ("≥" if sat else "") + rounded(m, lo, hi, most=0) for sat, m, lo, hi in
            zip(head[f"{mode}_saturated"], head[f"{mode}_mean_e2e_ms"], head[f"{mode}_mean_e2e_lo"],
                head[f"{mode}_mean_e2e_hi"], strict=True)]
    assert table["gain % [CI]"].tolist() == [
        bound_mark(a, b).strip() + with_ci(g, lo, hi, scale=100, most=1) for a, b, g, lo, hi in
        zip(head["on_saturated"], head["off_saturated"], head["gain_mean_e2e"], head["gain_mean_e2e_lo"],
            head["gain_mean_e2e_hi"], strict=True)]

    def saturated(rate):  # one repeat a point: the arms that saturated, each with its reason's codes
        s = summ[(summ["rate"] == rate) & summ["saturated"]]
        return "; ".join(f"{r['mode'].upper()} {'+'.join(codes(r['saturation_reason']))}"
                         for _, r in s.sort_values("mode", ascending=False).iterrows())
    assert table["saturated"].tolist() == [saturated(r) for r in head["rate"]]  # blank: none saturated
    assert "" in table["saturated"].tolist() and any("OFF behind" in c for c in table["saturated"])
    # the reasons in full stay further down, one row per saturated repeat
    reasons = md_tables(md.split("\n## Saturation\n", 1)[1].split("\n## ", 1)[0])[0]
    assert sorted(reasons["reason"]) == sorted(summ.loc[summ["saturated"], "saturation_reason"])


FIRST_SCREEN_PROBE = """<script>
window.addEventListener('load', function () {
  function box(sel) {
    var e = document.querySelector(sel); if (!e) return null;
    var r = e.getBoundingClientRect(); return {top: r.top, bottom: r.bottom, left: r.left, right: r.right};
  }
  var pre = document.createElement('pre'); pre.id = 'boxes';
  pre.textContent = JSON.stringify({figure: box('#first-screen figure img'), table: box('#first-screen table'),
                                    width: window.innerWidth});
  document.body.appendChild(pre);
});
</script>"""


def test_html_renders_in_chromium(run_dir, tmp_path):
    exe = _chromium()
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "report.png"
    shot.unlink(missing_ok=True)
    page = run_dir / "report.html"
    subprocess.run([exe, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'ud1'}", f"--screenshot={shot}",
                    "--window-size=1200,3000", page.as_uri()], check=True, capture_output=True, timeout=120)
    head = shot.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", head[16:24]) == (1200, 3000)

    # The same page plus a probe that writes each <img>'s natural size into the DOM once loaded.
    probe = tmp_path / "probe.html"
    probe.write_text(page.read_text().replace("</body>", IMG_PROBE + "</body>"))
    res = subprocess.run([exe, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'ud2'}",
                          "--virtual-time-budget=10000", "--dump-dom", probe.as_uri()],
                         check=True, capture_output=True, text=True, timeout=120)
    m = re.search(r'<pre id="imgcheck">(.*?)</pre>', res.stdout, re.S)
    assert m, res.stdout[-2000:]
    imgs = json.loads(html.unescape(m.group(1)))
    assert len(imgs) == len(STEMS)
    for i in imgs:
        assert i["src"] == "data:image/png;base64," and i["ok"] and i["w"] > 0 and i["h"] > 0, i

    # At 1280 × 800 the figure and the compact table are on screen before any scrolling.
    probe.write_text(page.read_text().replace("</body>", FIRST_SCREEN_PROBE + "</body>"))
    res = subprocess.run([exe, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'ud3'}", "--window-size=1280,800",
                          "--virtual-time-budget=10000", "--dump-dom", probe.as_uri()],
                         check=True, capture_output=True, text=True, timeout=120)
    m = re.search(r'<pre id="boxes">(.*?)</pre>', res.stdout, re.S)
    assert m, res.stdout[-2000:]
    boxes = json.loads(html.unescape(m.group(1)))
    assert boxes["width"] == 1280, boxes
    for name in ("figure", "table"):
        b = boxes[name]
        assert b and 0 <= b["top"] < b["bottom"] <= 800 and 0 <= b["left"] < b["right"] <= 1280, (name, boxes)
    assert boxes["figure"]["bottom"] - boxes["figure"]["top"] > 300  # drawn at a readable size, not shrunk away
    first = ARTIFACTS / "report-first-screen.png"
    first.unlink(missing_ok=True)
    subprocess.run([exe, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'ud4'}", f"--screenshot={first}",
                    "--window-size=1280,800", page.as_uri()], check=True, capture_output=True, timeout=120)
    assert struct.unpack(">II", first.read_bytes()[16:24]) == (1280, 800)


def test_figures_are_numbered_from_one_in_the_order_shown_and_the_checks_are_printed(run_dir):
    lines = (run_dir / "report.md").read_text()
    numbers = [int(n) for n in re.findall(r"^\*Figure (\d+)\.", lines, flags=re.M)]
    assert numbers == list(range(1, len(STEMS) + 1))
    md = " ".join(lines.split())  # a long paragraph breaks between sentences
    assert "## Step-timing checks" in md and "steps with prompt tokens not faster than decode-only" in md
    assert "request-level prefill share (mean prefill time / mean E2E of a request). It is not the engine" in md
    # the Definitions state headline.knee's rule, and the intervals' machine
    assert "between the last rate where most repeats kept up" in md and "no repeat saturated" not in md
    assert "An interval holds for the machine the study ran on" in md
    assert "vLLM None" not in md and "torch None" not in md


def test_points_table_marks_only_the_repeat_that_saturated(tmp_path):
    from prefixstudy.report.data import analyze
    from prefixstudy.report.tables import all_points_table
    from prefixstudy.results import load

    run = write_synthetic_study(tmp_path, (1.0, 4.0), 30)
    s = pd.read_csv(run / "summary.csv")
    two = pd.concat([s, s.assign(repeat=1)], ignore_index=True)
    two["saturated"] = (two["mode"] == "off") & (two["rate"] == 4.0) & (two["repeat"] == 1)
    two.to_csv(run / "summary.csv", index=False)
    m = json.loads((run / "manifest.json").read_text())
    m["points"] = m["points"] + [{**p, "repeat": 1} for p in m["points"]]
    (run / "manifest.json").write_text(json.dumps(m))
    t = all_points_table(analyze(load(run), n_boot=20))
    marked = t.loc[t["saturated"] == "yes", "point"].tolist()
    assert len(marked) == 1 and marked[0].startswith("OFF @ 4 req/s repeat 1")


def test_why_sentences_without_engine_steps_print_no_dash():
    """An echo or HTTP study has no engine prefill share: the sentences leave that clause out, and
    say why there is none."""
    from prefixstudy.report.first_screen import no_share_reason, why_sentences

    nan = float("nan")
    head = pd.DataFrame({"rate": [1.0, 8.0], "arrival_rate": [0.724408, 8.1], "gain_mean_e2e": [0.05, 0.4],
                         "gain_mean_e2e_lo": [0.04, 0.3], "gain_mean_e2e_hi": [0.06, 0.5],
                         "on_mean_e2e_ms": [690.0, 800.0], "off_mean_e2e_ms": [727.0, 1400.0],
                         "on_saturated": False, "off_saturated": False, "gain_is_bound": False,
                         "off_engine_prefill_share": nan, "off_decode_slowdown": nan})
    first, second = why_sentences(head)
    assert first == "At 0.72 req/s caching saves 37 ms of 727 ms (gain 5.0 % [4.0, 6.0])."
    # a gain of 40 % ± 10 points has whole points only (report.precision)
    assert second == ("At 8.10 req/s, the highest rate where neither mode saturated, caching cuts mean E2E by "
                      "40 % [30, 50]. This backend records no engine steps, so there is no engine-level "
                      "prefill share.")
    # a simulated run has steps, priced rather than timed: the sentence says so, not "no steps"
    sim = no_share_reason({"sim": {"gpu": "A100-SXM4-40GB"}, "step_timing": ["sim"]})
    assert why_sentences(head, no_share=sim)[1].endswith(
        "[30, 50]. A simulated run prices its steps with the calibration's step-cost model rather than timing "
        "them, so there is no engine-level prefill share.")
    assert no_share_reason({"step_timing": ["engine-async"]}) == (
        "Its engine ran with async scheduling and no GPU timer, so its host-stamped steps are not per-step costs "
        "and there is no engine-level prefill share.")
    assert no_share_reason({"step_timing": ["request"]}) == no_share_reason({}) == (
        "This backend records no engine steps, so there is no engine-level prefill share.")


@pytest.mark.parametrize("on_sat, off_sat, mark", [(False, False, ""), (False, True, "≥ "), (True, False, "≤ "),
                                                   (True, True, "⚠ ")])
def test_the_headline_gain_is_a_bound_only_where_one_mode_saturated(on_sat, off_sat, mark):
    # OFF saturated alone: OFF would only get slower, so the gain is at least this; ON alone: at most;
    # both: each side's mean would grow, and the gain bounds nothing.
    from prefixstudy.report.first_screen import _bound

    h = pd.Series({"gain_is_bound": on_sat or off_sat, "on_saturated": on_sat, "off_saturated": off_sat})
    assert _bound(h) == mark
