"""README.md's headline numbers are the committed files' (experiments/readme_numbers.py renders
them with the report's definitions); after a study is re-run, regenerate with
``python experiments/readme_numbers.py --write``."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[3]


def _module():
    spec = importlib.util.spec_from_file_location("readme_numbers", REPO / "experiments/readme_numbers.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_headline_s_searched_slo_rates_are_the_search_s_record():
    m = _module()
    assert m._slo_words().endswith("ON meets it up to **53.8 req/s** (misses at 58.7) and OFF up to **12.3 req/s** "
                                   "(misses at 13.4): **4.37×** [4.01, 4.77] (the brackets' bounds, offered rates).")


def test_readme_headline_block_is_what_the_committed_files_give():
    m = _module()
    text = (REPO / "README.md").read_text()
    block = m.headline_block()
    assert m.BEGIN in text and m.END in text
    assert m.replace_block(text, block) == text, "README.md's headline block is stale: run experiments/readme_numbers.py --write"


@pytest.mark.slow
def test_results_readme_tables_are_what_the_committed_files_give():
    m = _module()
    for path, text in m.regenerated().items():
        assert path.read_text() == text, f"{path}: stale; run experiments/readme_numbers.py --write"


def test_the_tables_count_the_repeats_each_mode_ran():
    """h200-tp1 ran 3 repeats a mode at every rate but 96 req/s (2: the device time ran out), and OFF
    saturated in all of them from 32 req/s on: the table counts what ran ("3 of 3", "2 of 2", "0 of 3"),
    never a configured repeat count."""
    t = _module().study_table("h200-tp1")
    rows = {line.split(" | ")[0].lstrip("| ").split()[0]: line for line in t.splitlines()
            if line.startswith("| ") and line[2].isdigit()}
    assert sorted(rows, key=float) == ["1", "16", "32", "56", "96"]
    assert [r for r, line in rows.items() if " | 3 / 3 | " in line] == ["1", "16", "32", "56"]
    assert " | 2 / 2 | " in rows["96"] and " | 2 of 2 | " in rows["96"]
    assert [r for r, line in rows.items() if " | 3 of 3 | " in line] == ["32", "56"]
    assert [r for r, line in rows.items() if " | 0 of 3 | " in line] == ["1", "16"]
    sync = _module().study_table("h200-tp1-sync")
    assert sync.count(" | 2 / 2 | ") == 7 and sync.count(" | 2 of 2 | ") == 2  # the async-off study, as it ran


def test_a_changed_number_is_caught(tmp_path):
    m = _module()
    block = m.headline_block()
    assert "req/s" in block and block.startswith(m.BEGIN) and block.endswith(m.END)
    wrong = block.replace(" ms, **", " ms, **9", 1)
    assert wrong != block and m.replace_block(wrong, block) == block  # a stale block is replaced whole


def test_the_async_engine_is_lower_by_what_the_readme_says():
    """vLLM's default (async) engine against the sync one: (sync - async) / sync of mean E2E,
    positive where async is faster, at the points where both kept up in every repeat (OFF at 32
    req/s saturated in both: a bound, left out).  The README once had it backwards ("34-64 % lower",
    the sync engine's excess over async)."""
    m = _module()
    low = m.async_lower(m.RESULTS / "h200-tp1-sync", m.RESULTS / "h200-tp1")
    assert list(low.index) == [("off", 1.0), ("off", 16.0), ("on", 1.0), ("on", 16.0), ("on", 32.0)]
    assert low.round(1).tolist() == [27.3, 37.9, 26.8, 32.3, 30.7]
    assert "mean E2E was 27–38 % lower than with it off" in m.headline_block()


def test_the_peer_agreement_is_what_the_three_way_table_gives():
    m = _module()
    assert m.bench_sentence() == (
        "Against `vllm bench serve` on the same workload and engine (`experiments/results/h200-threeway/`, the "
        "points where no one saturated), prefixstudy's mean E2E was through `vllm serve` within ±3 % at 7 of 7 "
        "points (largest gap −2.9 % at OFF 16 req/s), and in process within ±5 % at 4 of 5 points (largest gap "
        "+10.1 % at ON 32 req/s); the in-process points are this study's, from a later lease of another H200.")


def test_the_tp8_table_is_what_prefixstudy_model_prints():
    """The TP 8 rows are ``prefixstudy model``'s: the default-parameter row on 8 x A100 is the
    reported case the command prints without flags, and the fitted rows use ``--calibrate``'s fits."""
    from prefixstudy.model.explain import RC, build_case, render_summary
    from prefixstudy.costmodel.gpus import load_gpus
    from prefixstudy.costmodel.roofline import Efficiency

    m = _module()
    t = m.tp8_table()
    assert "| 8 × H200, TP 8 | defaults: 0.50 / 0.80 / 0.00 | 7.50 / 1.14 | 1.11 | 165.2 / 158.9 | 130 / 1,092 |" in t
    assert "| 8 × A100-40GB, TP 8 | defaults: 0.50 / 0.80 / 0.00 | 18.24 / 2.13 | 2.09 | 315.0 / 298.9 | 51 / 423 |" in t
    cli = render_summary(build_case(None, None, RC["gpu"], 8, RC["prompt_len"], RC["prefix_len"], RC["output_len"],
                                    Efficiency(0.5, 0.8, 0.0), load_gpus()))
    assert "E2E batch 1 OFF / ON     314.96 / 298.85 ms" in cli and "rate ceiling OFF / ON    50.7 / 422.7 req/s" in cli
    e = m.fitted_efficiency("h200-tp1")
    assert f"fitted to h200-tp1: {e.mfu:.2f} / {e.bw_eff:.2f} / {e.overhead_ms:.2f}" in t


def test_the_cache_pressure_table_is_the_capacity_files():
    """One row against capacity.csv directly: 40 groups, 5200 blocks, 4 req/s."""
    m = _module()
    t = m.cache_pressure_table()
    row = ("| 40 | 5200 | 0.86 | 0.98 | 4 (3.61) | 0.896 (0.896) | 325 [323, 328] | 435 [432, 438] | "
           "25.2 % [24.1, 26.3] | 0 / 0 of 2 |")
    assert row in t
    cap = pd.read_csv(m.RESULTS / "h200-cache-pressure/groups-40/capacity.csv")
    at = cap[(cap["capacity"] == 5200) & (cap["rate"] == 4)]
    assert f"{at[at['mode'] == 'on']['mean_e2e_ms'].mean():.0f}" == "325"
    assert f"{at[at['mode'] == 'off']['mean_e2e_ms'].mean():.0f}" == "435"
    assert t.count("\n| 40 |") == 12 and t.count("\n| 48 |") == 6


def test_the_multiturn_words_are_the_turn_breakdown():
    turns = (REPO / "experiments/results/h200-multiturn/turns.md").read_text()
    assert "| on | 2 | 0 | 3 | 30 | 1884 | 0.943 |" in turns  # what `prefixstudy breakdown --by turn` wrote


def test_the_replaced_studies_numbers_are_gone():
    """The GC, smoke and fidelity sections once compared with an h200-tp1 whose files were replaced;
    its numbers are in no committed file, so the README does not quote them."""
    m = _module()
    text = (m.RESULTS / "README.md").read_text()
    for gone in ("681.4", "1342.5", "10995.4", "1335.4", "183.98"):
        assert gone not in text
    assert "| 1 req/s | 0.004 / 0.08 | 713.5 | 17.3 |" in m.gc_table()
    assert "| TP 1, in-process | OFF | 16 | 1393.2 | 480 of 480 | 0.000 (0.000) | no | 0.48 |" in m.smoke_table()
    assert "| OFF | 32 | 960 of 960 | 2613.8 | 59.83 | 11109.4 | 25.71 |" in m.fidelity_table()


def test_a_block_the_readme_lacks_is_refused():
    m = _module()
    with pytest.raises(SystemExit, match="tp8-model"):
        m.replace_block("no markers here", m.tp8_table(), m.table_begin("tp8-model"))


def test_the_cpu_default_sentence_is_what_its_report_says():
    report = (_module().RESULTS / "cpu-default/report.md").read_text()
    assert "caching ON sustains ≥ 11.5 req/s" in report and "OFF 3.6 req/s [3.6, 3.9]" in report


def test_the_plain_words_of_the_offload_and_multiturn_sections_hold():
    """Claims the README words without numbers: the 32 GiB arm reaches the hit-rate bound at every
    rate, one offload point has a dispatch-lag p99 over 1 ms, and so does one multiturn-sync point."""
    m = _module()
    arms = pd.read_csv(m.RESULTS / "h200-offload/arms.csv")
    cpu32 = arms[arms["arm"] == "on-cpu32"]
    assert ((cpu32["hit_rate_gpu"] + cpu32["hit_rate_cpu"]) >= cpu32["hit_rate_expected"] - 0.001).all()
    assert (cpu32["hit_rate_cpu"] > cpu32["hit_rate_gpu"]).all()  # most of it from the CPU tier
    for study in ("h200-offload", "h200-multiturn-sync"):
        lag = pd.read_csv(m.RESULTS / study / "summary.csv")["dispatch_lag_p99_ms"]
        assert (lag > 1.0).sum() == 1, study


def test_the_h100_spans_setup_words_are_its_manifests():
    """h100-tp1-spans' section: the KV blocks each engine had, and the whole 1357-token sequences they
    hold there and on one H200 at the same gpu_memory_utilization (h200-tp1)."""
    text = " ".join((REPO / "experiments/results/README.md").read_text().split())

    def blocks(study):
        return sorted({p["num_blocks"] for p in json.loads((REPO / "experiments/results" / study /
                                                            "manifest.json").read_text())["points"]})

    per_sequence = -(-(1214 + 143) // 16)  # blocks of 16 tokens
    h100, h200 = blocks("h100-tp1-spans"), blocks("h200-tp1")
    assert (h100[0], h100[-1], h100[0] // per_sequence, h200[0] // per_sequence) == (10738, 10763, 126, 290)
    assert ("with 10,738 to 10,763 KV blocks of 16 tokens each: room for 126 whole sequences of 1357 tokens, "
            "where one H200 at the same 0.45 holds 290 (h200-tp1)") in text


SAYS = {
    "h200-tp1-sync-steps": ["0 of 2,100 ON and 0 of 608 OFF", "all 40,533 busy steps",
                            "`step_ms = 6.23 + 0.0207·prefill_tokens + 2.02·prefill_requests + 0.0712·decode_tokens`, "
                            "**R² = 0.997**, RMSE 1.0 ms"],
    "h200-tp1-sync-says": ["caching saves 46 ms of 960 (4.7 % [−18.3, 27.8])",
                           "async scheduling on gave 25–39 % lower mean E2E and 26–40 % lower TPOT",
                           "At 19.9 and 23.0 req/s OFF kept up but was still filling"],
    "h200-tp1-async-split": ["(medians, OFF 303 pairs / ON 402 pairs): the record, 23.4 / 11.2 ms",
                             "162 of 257 OFF and 329 of 365 ON prefill-after-decode steps at 16 req/s"],
    "h200-tp1-async-gpu": ["**0 / 0 are shorter than the decode step before by their GPU spans, 84 / 172 by their host "
                           "records**", "Mean E2E there: OFF 1384 ms, ON 824 ms (against 1345 and 814"],
    "h200-cache-pressure-says": ["falls to 0.27 of 0.90 at 1.07; 0.36 of 0.72 at 1.10 and to nothing at 1.16 (0.005)"],
    "h200-multiturn-says": ["the cached share is 0.827, 0.919, 0.937, 0.943 for turns 0–3 (1200 to 1884 prompt tokens)"],
    "h200-threeway-says": ["(−2.9 to +0.5 %, 7 points). On the peer's same-machine repeat the gap is −3.0 to +0.3 %",
                           "(ON: 5.4, 4.9, 7.4, 10.8 ms at 1, 4, 16, 32 req/s)"],
    "tp8-says": ["The reported 20.8 ms saving is ", "leaves room for at most 82 decode steps",
                 "in process on one H100 (h100-tp1-spans) 49 ms of 952 (5.1 % [3.4, 6.8]) at 0.72 req/s.",
                 "(OFF at 32 req/s did not run)"],  # h200-tp2's OFF knee is not measured
    "cpu-replicas-says": ["Affinity served 0.801, 0.763, 0.689 of prompt tokens from cache at 1.77, 3.64, 8.72 req/s",
                          "It routed 37 to 59 of a point's 96 requests",
                          "OFF at 8 req/s saturated in 1 repeat of 2 (a bound, ≥ 2219 ms)"],
    "h200-tp1-hit-rate-throughput": ["16 req/s: ON 2,208 against OFF 2,193 output tok/s (+0.7 %)",
                                     "56 req/s: ON 7,464 against OFF 2,620 output tok/s (+184.9 %)"],
    "seed-says": ["mean E2E ON / OFF 498.3 ± 249.3 / 515.0 ± 263.9 ms at 1 req/s (3.3 % saved)",
                  "OFF saturates from 48 req/s (knee 32), ON does not saturate up to 64 req/s",
                  "The simulated saving is 16.8 ms",
                  "a lone request's step costs the GPU 3.41 ms on 8 A100s and the host 3.16 ms to launch"],
    "h200-tp1-slo-says": ["8, 16 (missed), 11.3, 13.4, 14.6 (missed), 13.4 (missed), 12.3, 12.3",
                          "met at 53.8 req/s in every repeat there, missed at 58.7"],
    "h200-shared-fraction-says": ["shared fraction 0.95, hit rate 0.949: 40.5 [37.7, 43.0] %"],
    "h200-sglang-says": ["SGLang 0.5.17 with RadixAttention 982 ms (TTFT 28.6, TPOT 6.71), hit rate 0.987",
                         "Caching cuts SGLang's mean E2E by 42.7 % and vLLM's by 40.5 %"],
    "h100-tp1-spans-says": ["Every one of its 58,064 engine steps is timed on the GPU",
                            "h100-tp1's decode-only steps took from 2.1 % less to 3.3 % more time",
                            "The simulator's form: held out by point 10 of 10 within 5 % (worst −4.5 %, ON 48)"],
    "cpu-default-says": ["ON sustains ≥ 11.5 req/s (the highest rate run) and OFF 3.6 req/s [3.6, 3.9]"],
}


@pytest.mark.parametrize("name", sorted(SAYS))
def test_a_paragraph_says_what_its_files_give(name):
    """A sample of each rendered paragraph, checked exactly (the values as the committed files give them)."""
    m = _module()
    block = m.render(name)
    assert block.startswith(m.table_begin(name)) and block.endswith(m.END)
    for fragment in SAYS[name]:
        assert fragment in block
    assert any(name in names for names in m.TABLES.values())  # so the regeneration test covers it


def _config(study: str) -> dict:
    import yaml

    return yaml.safe_load((REPO / "experiments/results" / study / "config.yaml").read_text())


def _block_size(study: str) -> int:
    """The engine's block size, as the study's manifest recorded it."""
    return int(json.loads((REPO / "experiments/results" / study / "manifest.json").read_text())["points"][0]["block_size"])


def _and(xs) -> str:
    xs = [f"{x:g}" for x in xs]
    return xs[0] if len(xs) == 1 else ", ".join(xs[:-1]) + " and " + xs[-1]


def _setups() -> dict[str, list[str]]:
    """Each study section's setup words, built from the study's config.yaml as it ran."""
    sync = _config("h200-tp1-sync")
    e, d, s = sync["engine"], sync["dataset"], sync["sweep"]
    out = {"h200-tp1-sync": [
        f"prompt {d['prefix_len']} shared + {d['suffix_len']} unique tokens, {d['output_len']} output tokens (ignore "
        f"EOS), max_num_batched_tokens {e['max_num_batched_tokens']}, max_num_seqs {e['max_num_seqs']}, Poisson "
        f"arrivals, at least {s['num_requests']} requests and {s['min_duration_s']:g} s of arrivals a point (a point "
        f"is cut at {s['max_point_duration_s']:g} s), rates {', '.join(f'{r:g}' for r in s['rates'])} req/s, "
        f"`sweep.repeats: {s['repeats']}`"]}
    caps = {g: sorted(_config(f"h200-cache-pressure/groups-{g}/{b.name}")["engine"]["extra_args"]["num_gpu_blocks_override"]
                      for b in (REPO / f"experiments/results/h200-cache-pressure/groups-{g}").glob("blocks-*"))
            for g in (40, 48)}
    cp = _config("h200-cache-pressure/groups-40/blocks-4400")
    cap40 = pd.read_csv(REPO / "experiments/results/h200-cache-pressure/groups-40/capacity.csv")
    bs = _block_size("h200-cache-pressure/groups-40/blocks-4400")
    d, s = cp["dataset"], cp["sweep"]
    out["h200-cache-pressure"] = [
        f"`max_num_batched_tokens` {cp['engine']['max_num_batched_tokens']}; G prompt groups of {d['prefix_len']} "
        f"shared tokens + {d['suffix_len']} unique, {d['output_len']} output tokens",
        f"{s['num_requests']} measured requests a point", f"arrivals at {_and(s['rates'])} req/s, {s['repeats']} repeats",
        f"capped at {_and(caps[40])} blocks of {bs} tokens (40 groups) and {_and(caps[48])} (48 groups)",
        f"({int(cap40['working_set_blocks'].iloc[0]) // 40} per prefix)",
        f"G × {int(cap40['reuse_footprint_blocks'].iloc[0]) // 40} "
        f"({d['prefix_len'] + d['suffix_len'] + d['output_len'] - 1} computed tokens a request"]
    mt = _config("h200-multiturn")
    d, ss, s = mt["dataset"], mt["dataset"]["sessions"], mt["sweep"]
    out["h200-multiturn"] = [
        f"sessions of {ss['turns']} turns open with one of {d['groups']} system prompts ({d['prefix_len']} tokens) + a "
        f"{d['suffix_len']}-token first message", f"the {d['output_len']} tokens it generated) + {ss['user_len']} new "
        f"user tokens, {ss['think_time_s']:g} s after",
        f"at {_and(s['rates'])} sessions/s, {s['num_requests'] // ss['turns']} sessions ({s['num_requests']} requests) "
        f"a point, {s['repeats']} repeats"]
    off, fits = _config("h200-offload"), _config("h200-offload-fits")
    d, s = off["dataset"], off["sweep"]
    gib = [a["offload"]["size_gib"] for a in off["arms"]]
    bs = _block_size("h200-offload")
    out["h200-offload"] = [
        f"{d['groups']} groups of {d['prefix_len']} shared + {d['suffix_len']} unique tokens in round-robin order, "
        f"primed, {d['output_len']} output tokens. The GPU cache is held to "
        f"{off['engine']['extra_args']['num_gpu_blocks_override']} blocks",
        f"of {gib[0]:g} and of {gib[1]:g} GiB", f"its prefix's blocks ({d['prefix_len'] // bs} of {bs} tokens)",
        f"Rates {_and(s['rates'])} req/s, {s['num_requests']} requests a point, {s['repeats']} repeats",
        f"the control: {fits['dataset']['groups']} groups", f"at {_and(fits['sweep']['rates'])} req/s."]
    cr = _config("cpu-replicas")
    d, s = cr["dataset"], cr["sweep"]
    out["cpu-replicas"] = [
        f"each capped at {cr['engine']['extra_args']['num_gpu_blocks_override']} KV blocks. {d['groups']} prompt groups "
        f"of {d['prefix_len']} shared + {d['suffix_len']} unique tokens, {d['output_len']} output tokens, groups in "
        f"{d['mix']['order']} order; {s['num_requests']} requests a point, {len(s['rates'])} rates, {s['repeats']} "
        f"repeats; round robin and prefix affinity (first block, load bound {cr['router']['load_bound']:g})"]
    return out


def test_the_setup_lines_are_the_configs_as_they_ran():
    """The setup bullets of the results README are typed, not rendered: each is checked against the
    config.yaml the study recorded (whitespace and line breaks aside)."""
    text = " ".join((REPO / "experiments/results/README.md").read_text().split())
    for study, fragments in _setups().items():
        for f in fragments:
            assert f in text, f"{study}: the README's setup does not say {f!r}"
