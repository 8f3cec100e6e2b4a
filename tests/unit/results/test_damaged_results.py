"""A results folder damaged or made unwritable after its run: `report` and `run --resume` say what is
wrong in one line (exit 2) instead of a traceback, and resume repairs what it can: a truncated
point part is measured again, an emptied summary.csv is rebuilt from the parts.  On an echo run."""

from __future__ import annotations

import errno
import json
import shutil
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from prefixstudy.cli import main as cli_main
from prefixstudy.config import load_config
from prefixstudy.results import read_summary
from prefixstudy.study.orchestrate import run_study

# Its module fixtures take seconds (studies, reports, venvs): the whole file runs in `make test`, not `make test-fast`.
pytestmark = pytest.mark.slow

N = 4


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("clean")
    cfg = load_config(None, {"study": "dmg", "executor": "local", "out": str(tmp), "engine": {"kind": "echo"},
                             "dataset": {"num_requests": N, "prefix_len": 32, "suffix_len": 4, "output_len": 2},
                             "sweep": {"rates": [50, 100], "num_requests": N, "warmup_requests": 0}})
    return run_study(cfg, progress=False)


@pytest.fixture
def run(clean_run, tmp_path) -> Path:
    d = tmp_path / "run"
    shutil.copytree(clean_run, d)
    return d


def invoke(*args) -> tuple[int, list[str]]:
    res = CliRunner().invoke(cli_main, [str(a) for a in args])
    assert "Traceback" not in res.output, res.output
    return res.exit_code, [ln for ln in res.output.splitlines() if ln.strip()]


def refused(*args) -> str:
    code, lines = invoke(*args)
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


def test_a_manifest_that_is_not_a_run_s_is_one_line(run):
    m = run / "manifest.json"
    m.write_text("[1, 2]")
    for cmd in (["report", run], ["run", "--resume", run, "--no-report", "--quiet"]):
        assert refused(*cmd) == f"error: {m}: not a prefixstudy manifest (not an object)"
    assert m.read_text() == "[1, 2]"  # nothing rewritten


def test_a_point_without_a_rate_is_one_line(run, clean_run):
    m = run / "manifest.json"
    man = json.loads((clean_run / "manifest.json").read_text())
    del man["points"][1]["rate"]
    m.write_text(json.dumps(man))
    for cmd in (["report", run], ["run", "--resume", run, "--no-report", "--quiet"]):
        assert refused(*cmd) == f"error: {m}: not a prefixstudy manifest (point 1 has no mode and rate)"


def test_a_truncated_part_is_named_by_report_and_measured_again_by_resume(run):
    part = run / "requests.parquet" / "on-50.parquet"
    part.write_bytes(part.read_bytes()[:100])
    line = refused("report", run)
    assert line.startswith(f"error: {part}: unreadable results table (")
    assert line.endswith("; `prefixstudy run --resume` on its run measures that point again")
    code, _ = invoke("run", "--resume", run, "--no-report", "--quiet")
    assert code == 0
    assert invoke("report", run)[0] == 0


def test_a_file_where_the_parts_folder_should_be_is_one_line(run):
    table = run / "requests.parquet"
    shutil.rmtree(table)
    table.write_text("x\n")
    for cmd in (["report", run], ["run", "--resume", run, "--no-report", "--quiet"]):
        assert refused(*cmd).startswith(f"error: {table}: unreadable results table (")


def test_an_emptied_summary_is_refused_by_report_and_rebuilt_by_resume(run, clean_run):
    (run / "summary.csv").write_text("")
    assert refused("report", run) == f"error: {run}: summary.csv is missing or empty; no point was summarized"
    code, _ = invoke("run", "--resume", run, "--no-report", "--quiet")
    assert code == 0
    got, want = read_summary(run / "summary.csv"), read_summary(clean_run / "summary.csv")
    assert list(zip(got["mode"], got["rate"], got["status"], strict=True)) == \
        list(zip(want["mode"], want["rate"], want["status"], strict=True))
    assert len(got) == 4 and (got["n_ok"] == N).all()


def test_a_report_that_cannot_be_written_is_one_line_and_leaves_no_half_file(run, monkeypatch):
    import prefixstudy.report.figure_kit as figure_kit

    def read_only(path, data):
        raise OSError(errno.EROFS, "Read-only file system", str(path))

    monkeypatch.setattr(figure_kit, "atomic_write_bytes", read_only)
    line = refused("report", run)
    assert line.startswith(f"error: {run / 'plots'}/") and line.endswith(
        ": cannot write the report (Read-only file system); the results themselves are untouched")
    assert not (run / "report.md").exists() and not list((run / "plots").glob("*.*"))
    assert yaml.safe_load((run / "config.yaml").read_text())["study"] == "dmg"


def test_a_manifest_that_loops_or_is_a_device_is_one_line(run):
    m = run / "manifest.json"
    m.unlink()
    m.symlink_to(m)
    assert refused("report", run) == f"error: {m}: cannot read (Too many levels of symbolic links)"
    m.unlink()
    m.symlink_to("/dev/zero")
    assert refused("report", run) == f"error: {m}: a device, not a file; expected a run's manifest.json"


def test_a_recorded_config_nested_past_the_parser_is_one_line(run):
    (run / "config.yaml").write_text("[" * 6000 + "]" * 6000 + "\n")
    assert refused("report", run) == f"error: {run / 'config.yaml'}: unreadable recorded config (RecursionError)"


def test_files_the_user_may_not_read_are_one_line(run, tmp_path, monkeypatch):
    # The suite runs as root, whom file modes do not stop: the refusal is made where the file is opened.
    import builtins

    from prefixstudy.errors import UserError
    from prefixstudy.workloads import load_rows

    real_open = builtins.open
    denied = set()

    def guarded(file, *a, **k):
        if str(file) in denied:
            raise PermissionError(13, "Permission denied", str(file))
        return real_open(file, *a, **k)

    monkeypatch.setattr(builtins, "open", guarded)
    for f in ("manifest.json", "summary.csv"):
        denied.clear()
        denied.add(str(run / f))
        assert refused("report", run) == f"error: {run / f}: " + (
            "cannot read (Permission denied)" if f == "manifest.json" else "unreadable summary ([Errno 13] Permission denied: "
            f"'{run / f}')")
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt_token_ids": [1, 2], "output_len": 2}\n')
    denied.clear()
    denied.add(str(data))
    with pytest.raises(UserError, match=rf"^{data}: cannot read \(Permission denied\)$"):
        load_rows(load_config(None, {"engine": {"kind": "echo"}, "executor": "local", "dataset": {"path": str(data)}}))
