"""The result tables in README.md, docs/ and experiments/results/README.md, and the figures in plots/,
are what experiments/render_results.py gives from the committed results (``make results`` rewrites
them).  A results folder with one number altered is the wrong data the check must refuse."""

from __future__ import annotations

import pandas as pd
import pytest

from tests.scripts import load_script

render = load_script("experiments/render_results.py")


@pytest.mark.slow  # reads h200-tp1's step records for the gain split, the fit and the closure model
def test_every_block_and_figure_is_what_the_committed_results_give():
    assert render.stale() == []


@pytest.fixture
def altered(tmp_path):
    """experiments/results with h200-tp1's OFF mean E2E at 16 req/s 10 % higher in headline.csv."""
    for p in render.RESULTS.iterdir():
        if p.name != "h200-tp1":
            (tmp_path / p.name).symlink_to(p)
    d = tmp_path / "h200-tp1"
    d.mkdir()
    for p in (render.RESULTS / "h200-tp1").iterdir():
        if p.name != "headline.csv":
            (d / p.name).symlink_to(p)
    h = pd.read_csv(render.RESULTS / "h200-tp1/headline.csv")
    h.loc[h["rate"] == 16.0, "off_mean_e2e_ms"] *= 1.1
    h.to_csv(d / "headline.csv", index=False)
    return tmp_path


@pytest.mark.slow
def test_the_check_fails_naming_the_page_and_block_an_altered_number_moves(altered, capsys):
    assert render.main(["--check", "--results", str(altered)]) == 1
    assert capsys.readouterr().out.splitlines() == ["README.md: block h200-tp1-rates is stale; run make results"]


def test_a_value_has_the_precision_its_interval_supports():
    assert render.ci(0.4238, 0.3961, 0.4516, 100) == "42 [40, 45]"
    assert render.ci(0.0403, 0.0263, 0.0544, 100) == "4.0 [2.6, 5.4]"
    assert render.ci(1367.1, 1185.9, 1548.3) == "1370 [1190, 1550]"
    assert render.ci(8498.3, 8020.2, 8976.5, bound=True) == "≥ 8500 [8000, 9000]"


def test_an_unknown_or_repeated_block_name_fails_the_render(tmp_path):
    (tmp_path / "README.md").write_text("<!-- results: nosuch -->\n<!-- /results -->\n")
    with pytest.raises(SystemExit, match="README.md: unknown block 'nosuch'"):
        render.rendered(render.RESULTS, tmp_path)
    (tmp_path / "README.md").write_text("<!-- results: threeway -->\n<!-- /results -->\n" * 2)
    with pytest.raises(SystemExit, match="block 'threeway' also in README.md"):
        render.rendered(render.RESULTS, tmp_path)
