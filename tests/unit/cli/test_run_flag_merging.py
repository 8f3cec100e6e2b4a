"""`prefixstudy run` flags beside each other: every --set applies (also beside --target-on /
--target-off, which replace the engine section), and --goodput takes vLLM's space-separated form."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import yaml

from tests import forkcli

REPO = Path(__file__).resolve().parents[3]
TARGETS = ("--target-on", "http://127.0.0.1:9", "--target-off", "http://127.0.0.1:9")


def cli(*args) -> subprocess.CompletedProcess:
    return forkcli.run(args, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)


def test_a_set_beside_the_targets_is_applied_or_refused():
    r = cli("run", "--dry-run", *TARGETS, "--set", "engine.bogus=1")
    assert (r.returncode, r.stdout, r.stderr) == (2, "", "error: --set engine: field 'engine.bogus': unknown key\n")
    r = cli("run", "--dry-run", *TARGETS, "--set", "engine.reset_path=/flush_cache", "--set", "engine.health_timeout_s=0")
    assert r.returncode == 2  # it reached the config: the http section's own check refuses 0
    assert r.stderr.startswith("error: --set engine: field 'engine.health_timeout_s'"), r.stderr


def test_goodput_takes_vllms_space_separated_form():
    from prefixstudy.cli import join_goodput
    from prefixstudy.cli.run_flags import _goodput

    assert _goodput("ttft:200 e2e:2000") == _goodput("ttft:200,e2e:2000") == {"ttft": 200.0, "e2e": 2000.0}
    # Unquoted, as `vllm bench serve --goodput ttft:200 e2e:2000` takes it: the objectives join the
    # flag, a config name after them stays the config.
    assert join_goodput(["run", "--goodput", "ttft:200", "e2el:2e3", "try-echo", "--goodput", "tpot=5"]) == \
        ["run", "--goodput", "ttft:200 e2el:2e3", "try-echo", "--goodput", "tpot=5"]
    assert join_goodput(["run", "--", "--goodput", "ttft:1", "e2e:2"]) == ["run", "--", "--goodput", "ttft:1", "e2e:2"]


def test_an_unquoted_goodput_reaches_the_saved_config(tmp_path):
    r = cli("run", "--set", "engine.kind=echo", "--executor", "local", "--modes", "on", "--rates", "50",
            "--num-requests", "2", "--set", "sweep.warmup_requests=0", "--no-report", "--quiet", "--out", tmp_path,
            "--goodput", "ttft:200", "e2e:2000")
    assert r.returncode == 0, r.stderr
    (run,) = (tmp_path / "default").iterdir()
    assert yaml.safe_load((run / "config.yaml").read_text())["goodput"] == {"ttft": 200.0, "e2e": 2000.0}


def test_a_target_url_without_a_valid_port_is_one_line():
    r = cli("run", "--dry-run", "--target-on", "http://127.0.0.1:abc", "--target-off", "http://127.0.0.1:9")
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr == ("error: --set engine: field 'engine.targets': Value error, on: 'http://127.0.0.1:abc' "
                        "has no valid host and port\n")


def test_slo_sets_the_search_and_the_dry_run_names_it():
    r = cli("run", "try-echo", "--dry-run", "--slo", "e2e_p90:2000,itl_p95:40", "--set", "sweep.slo.tolerance=0.1")
    assert r.returncode == 0, r.stderr
    assert "SLO search e2e_p90:2000,itl_p95:40 ms" in r.stdout and "rates" not in r.stdout
