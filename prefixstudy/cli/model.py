"""``prefixstudy model``: the first-principles estimate, explained, or calibrated to a study.

Parses flags and echoes what ``prefixstudy.model`` returns; bad input is a ``UserError``,
which the main CLI turns into one line and exit code 2.  Registered with
``main.add_command(model)``.
"""

from __future__ import annotations

from pathlib import Path

import click

from prefixstudy.model.explain import RC, build_case, render_explain, render_summary
from prefixstudy.costmodel.gpus import load_gpus
from prefixstudy.costmodel.roofline import Efficiency


@click.command("model")
@click.option("--explain", is_flag=True, help="Print every step of the arithmetic.")
@click.option("--calibrate", "calibrate_dir", type=click.Path(path_type=Path), default=None,
              metavar="RESULTS_DIR", help="Fit mfu, bw_eff and overhead to a measured study.")
@click.option("--config-json", type=str, default=None, help="A Hugging Face config.json.")
@click.option("--model-dir", type=str, default=None, help="A folder holding config.json.")
@click.option("--gpu", "gpu_name", default=RC["gpu"], show_default=True,
              help="GPU table entry or torch device name.")
@click.option("--tp", type=click.IntRange(min=1), default=RC["tp"], show_default=True,
              help="Tensor-parallel size.")
@click.option("--prompt-len", type=click.IntRange(min=1), default=RC["prompt_len"], show_default=True)
@click.option("--prefix-len", type=click.IntRange(min=0), default=RC["prefix_len"], show_default=True,
              help="Shared prefix tokens the cache can serve.")
@click.option("--output-len", type=click.IntRange(min=1), default=RC["output_len"], show_default=True)
@click.option("--mfu", type=click.FloatRange(min=0, min_open=True, max=1), default=0.5, show_default=True)
@click.option("--bw-eff", type=click.FloatRange(min=0, min_open=True, max=1), default=0.8, show_default=True)
@click.option("--overhead-ms", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="Fixed time per engine step.")
@click.option("--allreduce-latency-us", type=click.FloatRange(min=0), default=10.0, show_default=True)
@click.option("--all-logits", is_flag=True, help="Run lm_head on every prompt token (vLLM: last only).")
@click.option("--observed-off-ms", type=float, default=None, help="Measured mean latency, cache OFF.")
@click.option("--observed-on-ms", type=float, default=None, help="Measured mean latency, cache ON.")
@click.option("--gpus-file", type=click.Path(path_type=Path), default=None,
              help="YAML adding or overriding GPU table entries.")
def model(explain, calibrate_dir, config_json, model_dir, gpu_name, tp, prompt_len, prefix_len,
          output_len, mfu, bw_eff, overhead_ms, allreduce_latency_us, all_logits, observed_off_ms,
          observed_on_ms, gpus_file):
    """First-principles prefill/decode model; defaults are the reported Mistral-7B case."""
    gpus = load_gpus(gpus_file)
    if calibrate_dir is not None:
        from prefixstudy.model.calibrate import run_calibrate  # pandas: only when calibrating

        eff = Efficiency(overhead_ms=overhead_ms, allreduce_latency_us=allreduce_latency_us)
        click.echo(run_calibrate(calibrate_dir, gpus, eff))
        return
    eff = Efficiency(mfu, bw_eff, overhead_ms, allreduce_latency_us)
    case = build_case(config_json, model_dir, gpu_name, tp, prompt_len, prefix_len, output_len,
                      eff, gpus, all_logits, observed_off_ms, observed_on_ms)
    click.echo(render_explain(case) if explain else render_summary(case))
