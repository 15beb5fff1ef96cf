"""magpie.traces' notebook API (issue 45.6): the DataFrames `magpie.traces.open(path)` and
`magpie.traces.comparison(before, after)` give are the CSVs the CLI writes for the same traces,
cell by cell; bad input is one UserError line; pandas is imported only when the API is used."""

from __future__ import annotations

import csv
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import magpie_in_process

pandas = pytest.importorskip("pandas")

FIXTURES = Path(__file__).parent / "fixtures" / "traces"
# a training step (GEMM, elementwise, reduce, norm sheets), convolutions, and a rank of an NCCL capture (collectives)
TRACES = {
    "train_step_mlp": FIXTURES / "h200" / "train_step_mlp.json.gz",
    "conv_bf16": FIXTURES / "h200" / "conv_bf16.json.gz",
    "nccl_tp2_rank0": FIXTURES / "h200_nccl_tp2" / "nccl_tp2_rank0.json.gz",
}


def _read_csv(path: Path) -> tuple[list[str], list[dict]]:
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames or []), list(reader)


def _cell_matches(value, text: str) -> bool:
    """A DataFrame cell against the CSV's text of it: empty for a missing value or empty text, numbers equal as
    numbers (a column of ints with a blank holds floats), anything else as the CSV writer's str()."""
    if text == "":
        return value is None or value == "" or (isinstance(value, float) and math.isnan(value))
    if isinstance(value, (int, float)) and not isinstance(value, bool) or hasattr(value, "dtype"):
        number = float(text)
        return float(value) == number or (math.isnan(number) and math.isnan(float(value)))
    return str(value) == text


def assert_frame_is_csv(frame, path: Path) -> None:
    columns, rows = _read_csv(path)
    assert list(frame.columns) == columns, path.name
    assert len(frame) == len(rows), path.name
    for i, (record, row) in enumerate(zip(frame.itertuples(index=False), rows)):
        for column, value in zip(columns, record):
            assert _cell_matches(value, row[column]), f"{path.name} row {i} {column!r}: {value!r} vs {row[column]!r}"


@pytest.fixture(scope="module", params=list(TRACES))
def analysed(request, tmp_path_factory):
    """One trace analysed by the CLI into out/ and opened by the API."""
    import magpie.traces

    root = tmp_path_factory.mktemp(request.param)
    (root / "traces").mkdir()
    shutil.copy(TRACES[request.param], root / "traces" / f"{request.param}.json.gz")
    magpie_in_process("benchmark", "--trace-dir", root / "traces", "-o", root / "out", cwd=root, check=0)
    return request.param, root / "out", magpie.traces.open(root / "traces" / f"{request.param}.json.gz")


def test_op_tables_are_the_csvs(analysed):
    label, out, trace = analysed
    tables = out / "tracelens" / label
    assert_frame_is_csv(trace.ops_summary(), tables / "ops_summary.csv")
    assert_frame_is_csv(trace.ops_summary_by_category(), tables / "ops_summary_by_category.csv")
    assert_frame_is_csv(trace.ops_unique_args(), tables / "ops_unique_args.csv")
    assert_frame_is_csv(trace.unified_perf_summary(), tables / "unified_perf_summary.csv")
    written = sorted(
        p.stem
        for p in tables.glob("*.csv")
        if p.stem
        not in (
            "ops_summary",
            "ops_summary_by_category",
            "ops_unique_args",
            "unified_perf_summary",
            "gpu_timeline",
            "coll_analysis",
        )
    )
    assert sorted(trace.perf_families()) == written
    for family in written:
        assert_frame_is_csv(trace.perf_table(family), tables / f"{family}.csv")
    assert_frame_is_csv(trace.kernel_roofline(), out / "tracelens" / f"{label}_kernel_roofline_simple.csv")


def test_kernels_timeline_and_collectives_are_the_csvs(analysed):
    label, out, trace = analysed
    assert_frame_is_csv(trace.gap_analysis(), out / "gap_analysis" / "gap_analysis.csv")
    assert_frame_is_csv(trace.timeline(), out / "gpu_timeline.csv")
    collectives = out / "tracelens" / label / "coll_analysis.csv"
    assert collectives.exists() == (label == "nccl_tp2_rank0")
    if collectives.exists():
        assert len(trace.collectives()) > 0
        assert_frame_is_csv(trace.collectives(), collectives)


def test_comparison_is_the_csv(tmp_path):
    import magpie.traces

    before, after = (
        FIXTURES / "h200_nccl_tp2" / "nccl_tp2_rank0.json.gz",
        FIXTURES / "h200_nccl_tp2" / "nccl_tp2_rank1.json.gz",
    )
    magpie_in_process("benchmark", "--compare-traces", before, after, "-o", tmp_path, cwd=tmp_path, check=0)
    compared = magpie.traces.comparison([before], after)
    assert_frame_is_csv(compared.table(), tmp_path / "trace_compare.csv")
    assert len(compared.ops()) + len(compared.kernels()) == len(compared.table())
    assert set(compared.ops()["level"]) == {"op"}


def test_bad_input_is_one_user_error(tmp_path):
    import magpie.traces
    from magpie.errors import UserError

    missing = tmp_path / "nope.json.gz"
    with pytest.raises(UserError, match=r"nope\.json\.gz: no such trace file") as err:
        magpie.traces.open(missing)
    assert "\n" not in str(err.value)
    (tmp_path / "config.json").write_text('{"model": "llama"}')
    with pytest.raises(UserError, match=r"config\.json") as err:
        magpie.traces.open(tmp_path / "config.json")
    assert "\n" not in str(err.value)
    with pytest.raises(UserError, match="unknown accelerator"):
        magpie.traces.open(TRACES["conv_bf16"], arch="no-such-gpu")
    with pytest.raises(UserError, match=r"comparison: .*nope\.json\.gz"):
        magpie.traces.comparison(missing, TRACES["conv_bf16"])
    with pytest.raises(UserError, match="unknown family"):
        magpie.traces.open(TRACES["conv_bf16"]).perf_table("gemm")


def test_pandas_only_when_the_api_is_used():
    code = (
        "import sys, magpie, magpie.traces, magpie.cli; from magpie.traces import open as open_trace; "
        f"before = 'pandas' in sys.modules; open_trace({str(TRACES['conv_bf16'])!r}).ops_summary(); "
        "print(before, 'pandas' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "True"]
