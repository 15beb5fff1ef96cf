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


def test_rows_of_equal_time_come_in_tracelens_order(tmp_path):
    """TraceLens sorts ops_summary and ops_summary_by_category with numpy's quicksort, which is not
    stable: a trace where many ops tie (every GPU activity 4 µs) gets its rows in the same order."""
    pytest.importorskip("numpy")
    import gzip
    import json

    from test_tracelens_parity import FIXTURES, TRACES

    from magpie.traces.ingest import load_trace
    from magpie.traces.perf_rows import trace_tables

    doc = json.loads(gzip.decompress((TRACES / "train_step_mlp.json.gz").read_bytes()))
    for event in doc["traceEvents"]:
        if event.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            event["ts"], event["dur"] = float(round(event["ts"])), 4.0
    (tmp_path / "ties.json").write_text(json.dumps(doc))
    _, tables = trace_tables(load_trace(tmp_path / "ties.json"))
    for table, label in (("ops_summary", "name"), ("ops_summary_by_category", "op category")):
        _, theirs = _read_csv(FIXTURES / "tracelens_ties" / f"{table}.csv.gz")
        assert [r[label] for r in tables[table]] == [r[label] for r in theirs], table
    _, ops = _read_csv(FIXTURES / "tracelens_ties" / "ops_summary.csv.gz")
    totals = [r["total_direct_kernel_time_sum"] for r in ops]
    assert len(set(totals)) < len(totals)  # ops do tie


def test_a_perf_table_without_any_roofline_leaves_out_the_roofline_columns():
    """As TraceLens's: a sheet has the seven roofline columns only where some row has a roofline
    (here: none without the device's peaks; with them, the columns)."""
    from test_tracelens_parity import TRACES

    from magpie.roofline.specs import lookup
    from magpie.traces.ingest import load_trace
    from magpie.traces.ops_tables import ROOFLINE, table_columns
    from magpie.traces.perf_rows import trace_tables

    trace = load_trace(TRACES / "train_step_mlp.json.gz")
    _, bare = trace_tables(trace, None)
    _, held = trace_tables(trace, lookup("H200"))
    for table in ("Reduce_fwd", "GEMM", "unified_perf_summary"):
        assert not ROOFLINE & set(table_columns(table, bare[table])), table
        assert len(ROOFLINE & set(table_columns(table, held[table]))) == 7, table
