"""Trace analysis over real traces captured on the H200 (tests/fixtures/traces/h200)."""

import csv
import gzip
import json

import pytest

from conftest import FIXTURES, magpie
from magpie.traces.gap import COLUMNS, Window, gap_rows, window_total_us
from magpie.traces.ingest import TraceError, load_trace
from magpie.traces.kernels import category, normalize
from magpie.traces.timeline import gpu_timeline, length, subtract, union

TRACES = FIXTURES / "traces" / "h200"
ALL = ["llama_decode_bf16.json.gz", "triton_rmsnorm_matmul.json.gz", "train_step_mlp.json.gz"]


def raw_events(name):
    return json.load(gzip.open(TRACES / name))["traceEvents"]


@pytest.mark.parametrize("name", ALL)
def test_kernel_time_equals_an_independent_sum(name):
    expected = sum(e["dur"] for e in raw_events(name) if e.get("cat") == "kernel" and e.get("ph") == "X")
    trace = load_trace(TRACES / name)
    assert sum(k.dur for k in trace.kernels) == pytest.approx(expected)
    assert window_total_us(trace, Window()) == pytest.approx(expected)
    assert sum(r["Self CUDA total (us)"] for r in gap_rows(trace, Window())) == pytest.approx(expected, abs=0.01)
    assert trace.device_name() == "NVIDIA H200"


@pytest.mark.parametrize("name", ALL)
def test_every_kernel_links_to_its_launch_and_aten_kernels_to_their_op(name):
    trace = load_trace(TRACES / name)
    assert trace.unlinked["kernels_without_launch"] == 0
    assert all(trace.launches[k.launch].correlation == k.correlation for k in trace.kernels)
    # Triton's launcher calls the driver directly, outside any aten op: those are counted as such
    without_op = [k.name for k in trace.kernels if k.op is None]
    assert trace.unlinked["kernels_without_cpu_op"] == len(without_op)
    assert set(without_op) <= {"_rms_kernel"}


def test_unlinked_kernels_are_counted_not_dropped(tmp_path):
    events = [
        {"ph": "X", "cat": "kernel", "name": "k_linked", "ts": 10, "dur": 5, "args": {"correlation": 1}},
        {"ph": "X", "cat": "kernel", "name": "k_orphan", "ts": 20, "dur": 7, "args": {"correlation": 99}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 5, "dur": 2, "pid": 1, "tid": 1,
         "args": {"correlation": 1}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::relu", "ts": 4, "dur": 4, "pid": 1, "tid": 1,
         "args": {"Input Dims": [[8, 8]]}},
    ]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    trace = load_trace(path)
    assert trace.unlinked == {"kernels_without_launch": 1, "kernels_without_cpu_op": 0}
    rows = {r["Name"]: r for r in gap_rows(trace, Window())}
    assert rows["k_linked"]["CPU Op"] == "aten::relu" and rows["k_linked"]["Input Shapes"] == "[[8, 8]]"
    assert rows["k_orphan"]["Self CUDA total (us)"] == 7


def test_gap_rows_rank_by_total_contribution_with_magpie_columns():
    trace = load_trace(TRACES / "llama_decode_bf16.json.gz")
    rows = gap_rows(trace, Window(), top_k=10)
    totals = [r["Self CUDA total (us)"] for r in rows]
    assert totals == sorted(totals, reverse=True) and len(rows) == 10
    assert set(COLUMNS) == set(rows[0])
    top = rows[0]
    assert top["Category"] == "gemm" and top["CPU Op"] == "aten::mm"
    assert top["Avg time (us)"] == pytest.approx(top["Self CUDA total (us)"] / top["Calls"], abs=1e-3)


def test_window_and_filters():
    trace = load_trace(TRACES / "llama_decode_bf16.json.gz")
    lo, hi = Window(50, 100).bounds(trace)
    second_half = sum(k.dur for k in trace.kernels if lo <= k.ts <= hi)
    assert window_total_us(trace, Window(50, 100)) == pytest.approx(second_half)
    gemm_only = gap_rows(trace, Window(), include={"gemm"})
    assert gemm_only and all(r["Category"] == "gemm" for r in gemm_only)
    assert all(r["Category"] != "gemm" for r in gap_rows(trace, Window(), exclude={"gemm"}))
    assert all(r["Avg time (us)"] >= 5 for r in gap_rows(trace, Window(), min_duration_us=5))


def test_name_normalization_and_categories():
    assert normalize("void at::native::vectorized_elementwise_kernel<4, F, std::array<char*, 2ul> >(int, F)") == \
        "at::native::vectorized_elementwise_kernel"
    assert normalize("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT") == "nvjet_sm90_tst_NxM_NxM_NxM_h_bz_coopA_TNT"
    assert normalize("triton_poi_fused_add_mul_0") == "triton_poi_fused_add_mul"
    assert normalize("void at::native::(anonymous namespace)::CatArrayBatchedCopy<int>(int)") == \
        "at::native::CatArrayBatchedCopy"
    assert category("ncclDevKernel_AllReduce_Sum_bf16_RING_LL") == "communication"
    assert category("_rms_kernel", op_name=None) == "other"
    assert category("Memcpy HtoD", kind="memcpy") == "memcpy"


def test_custom_triton_kernel_is_found_with_its_launch():
    trace = load_trace(TRACES / "triton_rmsnorm_matmul.json.gz")
    names = {k.name for k in trace.kernels}
    assert "_rms_kernel" in names
    rms = next(k for k in trace.kernels if k.name == "_rms_kernel")
    assert trace.launches[rms.launch].name in ("cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernel")


def test_interval_arithmetic_by_hand():
    compute = union([(0, 10), (5, 15), (20, 30)])
    assert compute == [(0, 15), (20, 30)] and length(compute) == 25
    comm = union([(12, 22), (40, 45)])
    assert subtract(comm, compute) == [(15, 20), (40, 45)]


@pytest.mark.parametrize("name", ALL)
def test_timeline_adds_up(name):
    trace = load_trace(TRACES / name)
    (rows,) = gpu_timeline(trace).values()
    t = {r["type"]: r["time ms"] for r in rows}
    assert t["busy_time"] + t["idle_time"] == pytest.approx(t["total_time"])
    assert t["computation_time"] <= sum(k.dur for k in trace.kernels) / 1000 * (1 + 1e-6)
    assert t["busy_time"] >= t["computation_time"]
    assert {r["type"] for r in rows} >= {"computation_time", "exposed_comm_time", "exposed_memcpy_time",
                                          "busy_time", "idle_time", "total_time"}


def test_cli_writes_tracelens_and_magpie_outputs(tmp_path):
    proc = magpie("benchmark", "--trace-dir", TRACES, "--top-k", "5", "-o", tmp_path / "out", "--json",
                  cwd=tmp_path, check=0)
    summary = json.loads(proc.stdout)
    assert len(summary["traces"]) == 3 and any("capture_info.json" in w for w in summary["warnings"])
    with open(tmp_path / "out/gap_analysis/gap_analysis.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == COLUMNS and len(rows) == 5
    for rank in ("0", "1", "2"):
        assert (tmp_path / f"out/gap_analysis/gap_analysis_rank{rank}.csv").is_file()
    with open(tmp_path / "out/gpu_timeline_rank0_dev0.csv") as handle:
        assert list(csv.DictReader(handle))[0].keys() == {"type", "time ms", "percent"}


def test_bad_traces_are_one_line(tmp_path):
    truncated = tmp_path / "truncated"
    truncated.mkdir()
    data = (TRACES / "train_step_mlp.json.gz").read_bytes()
    (truncated / "rank0.json.gz").write_bytes(data[: len(data) // 2])
    for folder, expected in ((truncated, "cannot decompress"), (tmp_path / "missing", "not a folder")):
        proc = magpie("benchmark", "--trace-dir", folder, cwd=tmp_path)
        assert proc.returncode == 2 and expected in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1
    with pytest.raises(TraceError, match="not valid JSON"):
        (tmp_path / "broken.json").write_text('{"traceEvents": [')
        load_trace(tmp_path / "broken.json")


def test_bad_window_and_top_k_are_one_line(tmp_path):
    for args, expected in ((["--start-pct", "60", "--end-pct", "40"], "--start-pct/--end-pct"),
                           (["--top-k", "0"], "--top-k")):
        proc = magpie("benchmark", "--trace-dir", TRACES, *args, cwd=tmp_path)
        assert proc.returncode == 2 and expected in proc.stderr and proc.stderr.count("\n") == 1
