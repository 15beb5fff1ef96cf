"""Cells a user joins magpie's tables with TraceLens's on are byte for byte TraceLens's (issue 45.3).

The parity test compares cells by value (a JSON list equals a Python tuple there); here the raw
text of every signature cell of TraceLens's own outputs for the fixture traces must find its row in
magpie's, as a join on those columns (pandas `merge`, a spreadsheet lookup) would.
"""

from __future__ import annotations

import pytest

from test_tracelens_parity import REFERENCE, TRACE_NAMES, _read_csv, magpie_outputs

SIGNATURE = ("name", "Input Dims", "Input type", "Input Strides", "Concrete Inputs")


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    return {trace: magpie_outputs(trace, tmp_path_factory.mktemp(trace)) for trace in TRACE_NAMES}


@pytest.mark.parametrize("table", ["ops_unique_args", "unified_perf_summary"])
def test_every_tracelens_row_joins_a_magpie_row_on_its_signature_text(outputs, table):
    unmatched = {}
    for trace in TRACE_NAMES:
        _, ours = _read_csv(outputs[trace][table])
        _, theirs = _read_csv(next((REFERENCE / trace).glob(f"{table}.csv*")))
        keys = {tuple(row[c] for c in SIGNATURE) for row in ours}
        missing = [tuple(row[c] for c in SIGNATURE) for row in theirs if tuple(row[c] for c in SIGNATURE) not in keys]
        if missing:
            unmatched[trace] = (len(missing), len(theirs), missing[0])
    assert not unmatched, unmatched


def test_the_timeline_sits_beside_the_other_tables(outputs):
    for trace in TRACE_NAMES:
        assert {"gpu_timeline", "ops_summary", "unified_perf_summary"} <= set(outputs[trace])
        assert outputs[trace]["gpu_timeline"].parent == outputs[trace]["ops_summary"].parent
