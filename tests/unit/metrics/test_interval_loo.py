"""benchmarks/interval_loo.py: leave one repeat out of the committed studies and predict it from the
rest.  The committed file is what the code gives: the requests' own noise alone does not cover real
repeats, a pooled between-repeat variance nearly does, and the shipped t over repeats did in every
case it could be tried."""

from __future__ import annotations

import json

from tests.scripts import load_script


def test_the_committed_file_is_what_the_code_gives_and_within_noise_alone_undercovers():
    m = load_script("benchmarks/interval_loo.py")
    rows = m.held_out([c for s in m.STUDIES for c in m.cells(s)])
    committed = json.loads(m.OUT.read_text())
    assert m.summary(rows) == committed["summary"]
    assert committed["summary"] == {"within": {"held_out": 139, "covered": 93},
                                    "within_pooled": {"held_out": 139, "covered": 125},
                                    "t_repeats": {"held_out": 51, "covered": 51}}
    assert [r["error"] for r in committed["rows"]] == rows["error"].tolist()
