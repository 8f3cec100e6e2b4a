"""The other default-engine step-cost form (experiments/sim/async_forms.py): its design on numbers
worked by hand, and its committed tables (experiments/results/sim-accuracy/async-forms/) are
what its async.csv gives."""

from __future__ import annotations

import pandas as pd
import pytest

from tests.scripts import REPO, load_script

OUT = REPO / "experiments/results/sim-accuracy/async-forms"


@pytest.fixture(scope="module")
def forms():
    import sys

    sys.path.insert(0, str(REPO / "experiments/sim"))  # it imports accuracy_async beside it
    return load_script("experiments/sim/async_forms.py")


def test_a_step_s_gemm_rows_fill_the_segments_in_order(forms):
    # one 1214-token prompt beside 20 decoders: T = 1234 rows
    row = forms.gpu_design([1214], [1], [20])[0]
    assert row.tolist() == [1, 64, 64, 128, 256, 512, 210, 0, 0, 0, 20, 1, 1]
    assert forms.gpu_design([0], [0], [100])[0].tolist() == [1, 64, 36, 0, 0, 0, 0, 0, 0, 0, 100, 0, 0]


def test_its_tables_are_what_its_async_csv_gives(forms, tmp_path):
    accuracy_async = load_script("experiments/sim/accuracy_async.py")
    accuracy_async.write(pd.read_csv(OUT / "async.csv"), tmp_path)
    for name in ("async.md", "async-summary.md"):
        assert (tmp_path / name).read_text() == (OUT / name).read_text(), name
