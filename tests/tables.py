"""A derived table against its committed copy: the committed columns first (new ones may follow at
the end), the same rows and text, and numbers equal to a relative 1e-9.

The engine columns come from a least-squares fit (``costmodel.engine_fit``) that runs through
OpenBLAS, and OpenBLAS picks its kernels for the CPU it finds: on a 2-core AMD EPYC VM the committed
h200-tp1-sync study re-derived to fitted shares and slowdowns up to a relative 1.1e-12 from the
committed ones, while every flag, count and text matched.  There numpy's OpenBLAS chose its Haswell kernels;
forced to its SkylakeX ones (OPENBLAS_CORETYPE=SkylakeX), the same VM re-derived the committed bytes.
A byte comparison would make the test pass or fail by the machine it ran on."""

from __future__ import annotations

import numpy as np
import pandas as pd

RTOL = 1e-9


def assert_same_table(got: pd.DataFrame, committed: pd.DataFrame, name: str = "") -> None:
    assert list(got.columns[:len(committed.columns)]) == list(committed.columns), name  # new columns go at the end
    assert len(got) == len(committed) > 0, name
    for c in committed.columns:
        a, b = got[c].to_numpy(), committed[c].to_numpy()
        if a.dtype.kind in "fiu" and b.dtype.kind in "fiu":
            np.testing.assert_allclose(a.astype(float), b.astype(float), rtol=RTOL, equal_nan=True,
                                       err_msg=f"{name} {c}")
        else:
            assert (got[c].astype(object).fillna("").astype(str).tolist()
                    == committed[c].astype(object).fillna("").astype(str).tolist()), f"{name} {c}"
