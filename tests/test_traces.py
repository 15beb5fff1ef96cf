"""Trace analysis over real traces captured on the H200 (tests/fixtures/traces/h200)."""

import ast
import csv
import gzip
import json
import math
from pathlib import Path

import pytest
from conftest import FIXTURES, magpie_in_process
from hypothesis import given, settings
from hypothesis import strategies as st

from magpie.traces.gap import COLUMNS, Window, gap_rows, window_total_us
from magpie.traces.ingest import TraceError, load_trace
from magpie.traces.kernels import category, normalize
from magpie.traces.timeline import gpu_timeline, length, subtract, union

TRACES = FIXTURES / "traces" / "h200"
ALL = [
    "llama_decode_bf16.json.gz",
    "triton_rmsnorm_matmul.json.gz",
    "train_step_mlp.json.gz",
    "serving_steps_vllm_format.json.gz",
    "llama_unannotated.json.gz",
    "conv_bf16.json.gz",
    "fp8_scaled_mm.json.gz",
    "graph_replay.json.gz",
]


FIRST_THREE = ALL[:3]


def first_three(tmp_path):
    """The first three captures and the capture notes beside them, as one trace folder."""
    import shutil

    folder = tmp_path / "traces"
    folder.mkdir(exist_ok=True)
    for name in [*FIRST_THREE, "capture_info.json"]:
        shutil.copy(TRACES / name, folder / name)
    return folder


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
    # Triton's launcher calls the driver directly, and a graph replay is no aten op: kernels
    # outside any op are those, counted as such
    without_op = [k for k in trace.kernels if k.op is None]
    assert trace.unlinked["kernels_without_cpu_op"] == len(without_op)
    assert all(k.name == "_rms_kernel" or trace.launches[k.launch].name == "cudaGraphLaunch" for k in without_op)


def test_unlinked_kernels_are_counted_not_dropped(tmp_path):
    events = [
        {"ph": "X", "cat": "kernel", "name": "k_linked", "ts": 10, "dur": 5, "args": {"correlation": 1}},
        {"ph": "X", "cat": "kernel", "name": "k_orphan", "ts": 20, "dur": 7, "args": {"correlation": 99}},
        {
            "ph": "X",
            "cat": "cuda_runtime",
            "name": "cudaLaunchKernel",
            "ts": 5,
            "dur": 2,
            "pid": 1,
            "tid": 1,
            "args": {"correlation": 1},
        },
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": "aten::relu",
            "ts": 4,
            "dur": 4,
            "pid": 1,
            "tid": 1,
            "args": {"Input Dims": [[8, 8]]},
        },
    ]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    trace = load_trace(path)
    assert trace.unlinked == {"kernels_without_launch": 1, "kernels_without_cpu_op": 0}
    rows = {r["Name"]: r for r in gap_rows(trace, Window())}
    assert rows["k_linked"]["CPU Op"] == "aten::relu" and rows["k_linked"]["Input Shapes"] == "[[8, 8]]"
    assert rows["k_orphan"]["Self CUDA total (us)"] == 7


def test_launches_outside_any_op_are_attributed_to_the_python_function_around_them(tmp_path):
    """with_stack traces: a Triton launcher's driver call has no aten op around it, but a
    Python function; an aten op, where there is one, still wins."""
    events = [
        {
            "ph": "X",
            "cat": "python_function",
            "name": "kernels.py(12): rmsnorm",
            "ts": 0,
            "dur": 50,
            "pid": 1,
            "tid": 1,
        },
        {
            "ph": "X",
            "cat": "cuda_driver",
            "name": "cuLaunchKernelEx",
            "ts": 5,
            "dur": 2,
            "pid": 1,
            "tid": 1,
            "args": {"correlation": 1},
        },
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 20, "dur": 10, "pid": 1, "tid": 1},
        {
            "ph": "X",
            "cat": "cuda_runtime",
            "name": "cudaLaunchKernel",
            "ts": 22,
            "dur": 2,
            "pid": 1,
            "tid": 1,
            "args": {"correlation": 2},
        },
        {"ph": "X", "cat": "kernel", "name": "_rms_kernel", "ts": 10, "dur": 5, "args": {"correlation": 1}},
        {"ph": "X", "cat": "kernel", "name": "gemm_kernel", "ts": 30, "dur": 5, "args": {"correlation": 2}},
    ]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    trace = load_trace(path)
    assert len(trace.python_calls) == 1 and trace.unlinked["kernels_without_cpu_op"] == 1
    rows = {r["Name"]: r for r in gap_rows(trace, Window())}
    assert rows["_rms_kernel"]["CPU Op"] == "python: kernels.py(12): rmsnorm"
    assert rows["gemm_kernel"]["CPU Op"] == "aten::mm"


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
    assert (
        normalize("void at::native::vectorized_elementwise_kernel<4, F, std::array<char*, 2ul> >(int, F)")
        == "at::native::vectorized_elementwise_kernel"
    )
    assert normalize("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT") == "nvjet_sm90_tst_NxM_NxM_NxM_h_bz_coopA_TNT"
    assert normalize("triton_poi_fused_add_mul_0") == "triton_poi_fused_add_mul"
    assert (
        normalize("void at::native::(anonymous namespace)::CatArrayBatchedCopy<int>(int)")
        == "at::native::CatArrayBatchedCopy"
    )
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


def test_timeline_by_hand_with_communication_and_memcpy():
    """Exposed communication is what computation leaves uncovered, exposed memcpy what both leave;
    busy is the union of all three."""
    from magpie.traces.ingest import GpuActivity, Trace

    gpu = [
        GpuActivity("gemm", "kernel", 0.0, 10.0, 0, 7, None),
        GpuActivity("ncclKernel_AllReduce", "kernel", 8.0, 6.0, 0, 8, None),
        GpuActivity("Memcpy DtoH", "memcpy", 12.0, 6.0, 0, 9, None),
        GpuActivity("gemm", "kernel", 30.0, 5.0, 0, 7, None),
    ]
    t = {r["type"]: r["time ms"] * 1000 for r in gpu_timeline(Trace("t", None, [], gpu))[0]}
    assert t["computation_time"] == pytest.approx(15) and t["exposed_comm_time"] == pytest.approx(4)  # 10-14
    assert t["exposed_memcpy_time"] == pytest.approx(4)  # 14-18
    assert (t["busy_time"], t["idle_time"], t["total_time"]) == pytest.approx((23, 12, 35))


@pytest.mark.parametrize("name", ALL)
def test_timeline_adds_up(name):
    trace = load_trace(TRACES / name)
    (rows,) = gpu_timeline(trace).values()
    t = {r["type"]: r["time ms"] for r in rows}
    assert t["busy_time"] + t["idle_time"] == pytest.approx(t["total_time"])
    computing = [a for a in trace.gpu if a.kind != "memcpy"]  # memsets count as computation, as in TraceLens
    # intervals from the recorded timestamps (2**-10 µs resolution near 5e12 µs, as TraceLens reads them)
    assert t["computation_time"] <= sum(a.dur for a in computing) / 1000 * (1 + 1e-4)
    assert t["busy_time"] >= t["computation_time"]
    assert {r["type"] for r in rows} >= {
        "computation_time",
        "exposed_comm_time",
        "exposed_memcpy_time",
        "busy_time",
        "idle_time",
        "total_time",
    }


def test_cli_writes_tracelens_and_magpie_outputs(tmp_path):
    proc = magpie_in_process(
        "benchmark",
        "--trace-dir",
        first_three(tmp_path),
        "--top-k",
        "5",
        "-o",
        tmp_path / "out",
        "--json",
        cwd=tmp_path,
        check=0,
    )
    summary = json.loads(proc.stdout)
    assert len(summary["traces"]) == 3 and any("capture_info.json" in w for w in summary["warnings"])
    with open(tmp_path / "out/gap_analysis/gap_analysis.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == COLUMNS and len(rows) == 5
    for rank in ("0", "1", "2"):
        assert (tmp_path / f"out/gap_analysis/gap_analysis_rank{rank}.csv").is_file()
    with open(tmp_path / "out/gpu_timeline_rank0_dev0.csv") as handle:
        assert list(csv.DictReader(handle))[0].keys() == {"type", "time ms", "percent"}
    from magpie.traces.ops_tables import BY_CATEGORY, OPS_SUMMARY, UNIFIED

    for table, columns in (
        ("ops_summary", OPS_SUMMARY),
        ("ops_summary_by_category", BY_CATEGORY),
        ("unified_perf_summary", UNIFIED),
    ):
        with open(tmp_path / f"out/tracelens/train_step_mlp/{table}.csv") as handle:
            assert next(csv.reader(handle)) == columns


def test_bad_traces_are_one_line(tmp_path):
    truncated = tmp_path / "truncated"
    truncated.mkdir()
    data = (TRACES / "train_step_mlp.json.gz").read_bytes()
    (truncated / "rank0.json.gz").write_bytes(data[: len(data) // 2])
    for folder, expected in ((truncated, "cannot decompress"), (tmp_path / "missing", "not a folder")):
        proc = magpie_in_process("benchmark", "--trace-dir", folder, cwd=tmp_path)
        assert proc.returncode == 2 and expected in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1
    with pytest.raises(TraceError, match="not valid JSON"):
        (tmp_path / "broken.json").write_text('{"traceEvents": [')
        load_trace(tmp_path / "broken.json")


def test_bad_window_and_top_k_are_one_line(tmp_path):
    for args, expected in (
        (["--start-pct", "60", "--end-pct", "40"], "--start-pct/--end-pct"),
        (["--top-k", "0"], "--top-k"),
    ):
        proc = magpie_in_process("benchmark", "--trace-dir", TRACES, *args, cwd=tmp_path)
        assert proc.returncode == 2 and expected in proc.stderr and proc.stderr.count("\n") == 1


def _op(name, dims, types, concrete=None):
    from magpie.traces.ingest import CpuOp

    return CpuOp(name, 0.0, 1.0, 1, 1, dims, types, concrete)


def test_perf_models_match_hand_counts():
    from magpie.traces.perf_models import causal_pairs, estimate

    bf16 = "c10::BFloat16"
    mm = estimate(_op("aten::mm", [[4, 512], [512, 8192]], [bf16, bf16]))
    assert mm.flops == 2 * 4 * 512 * 8192 and mm.bytes == (4 * 512 + 512 * 8192 + 4 * 8192) * 2
    assert mm.precision == "bf16_tensor"
    # TraceLens's parameters, in its names and order
    assert mm.params == {
        "M": 4,
        "N": 8192,
        "K": 512,
        "bias": False,
        "stride_A": None,
        "stride_B": None,
        "dtype_A_B": (bf16, bf16),
        "B": 1,
    }
    addmm = estimate(
        _op("aten::addmm", [[1024], [512, 4096], [4096, 1024], [], []], [bf16, bf16, bf16, "Scalar", "Scalar"])
    )
    assert addmm.flops == 2 * 512 * 1024 * 4096 + 512 * 1024
    qkv = [[4, 8, 96, 64], [4, 2, 96, 64], [4, 2, 96, 64]]
    flags = ["", "", "", "", "", "", "96", "96", "False", "0.", "True", "False", "0.125"]
    prefill = estimate(_op("aten::_cudnn_attention_forward", qkv + [[]] * 10, [bf16] * 3 + [""] * 10, flags))
    assert prefill.params["causal"] and prefill.flops == 2 * 4 * 8 * (96 * 97 // 2) * (64 + 64)
    assert causal_pairs(1, 112) == 112 and causal_pairs(4, 10) == 4 * 6 + 10  # decode sees every key so far
    mean = estimate(
        _op("aten::mean", [[4, 96, 512], [], [], []], ["float", "ScalarList", "Scalar", ""], ["", "[-1]", "True", ""])
    )
    assert mean.params["num_output_elems"] == 4 * 96 and mean.bytes == 4 * 96 * 512 * 4 + 4 * 96 * 4
    cat = estimate(_op("aten::cat", [[[1, 96, 32], [1, 96, 32]], []], ["TensorList", "Scalar"], ["", "-1"]))
    assert cat.bytes == 2 * 2 * 96 * 32 * 4
    assert estimate(_op("aten::mse_loss", [[4, 4], [4, 4]], ["float", "float"])) is None  # no model: said, not guessed


def test_kernel_roofline_simple_csv_has_tracelens_columns(tmp_path):
    from magpie.traces.roofline_table import COLUMNS as ROOF

    magpie_in_process("benchmark", "--trace-dir", first_three(tmp_path), "-o", tmp_path / "out", cwd=tmp_path, check=0)
    path = tmp_path / "out/tracelens/llama_decode_bf16_kernel_roofline_simple.csv"
    with open(path) as handle:
        rows = list(csv.DictReader(handle))
    assert (
        list(rows[0])
        == ROOF
        == [
            "source_category",
            "op_name",
            "param_signature",
            "params_json",
            "operation_count",
            "num_kernels",
            "kernel_time_ms_sum",
            "time_pct",
            "kernel_time_us_mean",
            "gflops",
            "data_moved_mb",
            "arithmetic_intensity_flops_per_byte",
            "achieved_tflops_mean",
            "achieved_tbps_mean",
            "compute_spec",
            "roofline_bound",
            "pct_roofline_mean",
            "roofline_time_us",
            "has_perf_model",
            "input_dims",
            "input_type",
        ]
    )
    expected_ms = (
        sum(
            e["dur"]
            for e in raw_events("llama_decode_bf16.json.gz")  # memcpy and memset count too
            if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and e.get("ph") == "X"
        )
        / 1000
    )
    assert sum(float(r["kernel_time_ms_sum"]) for r in rows) == pytest.approx(expected_ms, rel=1e-4)
    mm = next(r for r in rows if r["op_name"] == "aten::mm" and json.loads(r["input_dims"]) == [[4, 512], [512, 512]])
    assert float(mm["gflops"]) == pytest.approx(2 * 4 * 512 * 512 / 1e9, rel=1e-3)
    assert mm["compute_spec"] == "bf16_tensor" and mm["roofline_bound"] == "memory"
    assert 0 < float(mm["pct_roofline_mean"]) < 100
    unmodeled = [r for r in rows if r["has_perf_model"] == "False"]
    assert {r["op_name"] for r in unmodeled} <= {"aten::arange", "aten::gather"}
    proc = magpie_in_process("benchmark", "--trace-dir", TRACES, "--arch", "TPU9", cwd=tmp_path)
    assert proc.returncode == 2 and "--arch: unknown accelerator" in proc.stderr


def test_kernel_sources_resolved_ambiguous_library_unresolved(tmp_path, monkeypatch):
    from magpie.traces.sources import SourceIndex, resolve

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    repo = tmp_path / "repo"
    write_files = {
        "a.py": "import triton\n\n@triton.autotune(\n    configs=[],\n    key=['n'],\n)\n@triton.jit\n"
        "def twice(x):\n    pass\n",
        "b.py": "import triton\n@triton.jit\ndef twice(x):\n    pass\n\ndef not_a_kernel():\n    pass\n",
        "k.cu": "template <int N>\n__global__ void __launch_bounds__(256) tiled_add(float* x) {}\n"
        "__device__ float helper(float v) { return v; }\n",
        "tests/test_tiled.py": "def test_tiled_add():\n    assert 'tiled_add'\n",
    }
    for name, text in write_files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    index = SourceIndex([repo])
    assert index.files_read == 4 and "helper" not in index.by_symbol and "not_a_kernel" not in index.by_symbol
    found = resolve("void tiled_add<4>(float*)", index)
    assert found["state"] == "resolved" and found["file"].endswith("k.cu") and found["line"] == 2
    assert found["suggested_testcase"].endswith("test_tiled.py -k tiled_add")
    both = resolve("twice", index)
    assert both["state"] == "ambiguous" and len(both["candidates"]) == 2 and both["confidence"] == 0.5
    assert resolve("nvjet_sm90_tst_8x64_64x16_4x1_v_bz_TNN", index)["library"] == "cuBLAS"
    assert resolve("Cijk_Alik_Bljk_HHS_BH_MT128x128x32", index)["library"].startswith("Tensile")
    missing = resolve("mystery_kernel", index)
    assert missing["state"] == "unresolved" and "mystery_kernel" in missing["reason"] and "file" not in missing
    assert SourceIndex([repo]).files_read == 0  # indexed once, cached by content


def test_trace_kernels_mapped_to_this_repository(tmp_path):
    proc = magpie_in_process(
        "benchmark",
        "--trace-dir",
        first_three(tmp_path),
        "--top-k",
        "1000",
        "--find-kernel-sources",
        "--kernel-source-repos",
        FIXTURES.parents[1] / "bench",
        "-o",
        tmp_path / "o",
        "--json",
        cwd=tmp_path,
        check=0,
    )
    top = json.loads(proc.stdout)["top"]
    rows = {r["Name"]: r for r in top}
    rms = rows["_rms_kernel"]["source"]
    assert rms["state"] == "resolved" and rms["file"].endswith("bench/capture_traces.py") and rms["kind"] == "triton"
    assert {r["source"]["state"] for r in rows.values()} <= {"resolved", "library", "unresolved"}
    sources = json.loads((tmp_path / "o/gap_analysis/kernel_sources.json").read_text())
    assert len(sources["kernels"]) == len(top)
    proc = magpie_in_process("benchmark", "--trace-dir", TRACES, "--find-kernel-sources", cwd=tmp_path)
    assert proc.returncode == 2 and "--kernel-source-repos" in proc.stderr


@pytest.mark.parametrize("name", ALL)
def test_ops_tables_add_up_to_the_trace(name):
    from magpie.traces.perf_rows import trace_tables

    trace = load_trace(TRACES / name)
    _, tables = trace_tables(trace)
    # every GPU activity an op launched (kernels, memcpy, memset); a graph launch's kernels
    # overlap (programmatic dependent launch), and each launch counts the union of its kernels
    total_us = sum(a.dur for a in trace.gpu)
    replays: dict = {}
    for a in trace.gpu:
        if a.op is None and trace.launches[a.launch].name == "cudaGraphLaunch":
            replays.setdefault(a.launch, []).append((a.ts, a.ts + a.dur))
    for spans in replays.values():
        spans.sort()
        total_us -= sum(max(0.0, min(spans[i][1], spans[i + 1][1]) - spans[i + 1][0]) for i in range(len(spans) - 1))
    for table, key in (
        ("ops_summary", "total_direct_kernel_time_ms"),
        ("ops_summary_by_category", "total_direct_kernel_time_ms"),
    ):
        rows = tables[table]
        # each call's time comes from its timestamps (2**-10 µs resolution near 5e12 µs), as in TraceLens
        assert sum(r[key] for r in rows) == pytest.approx(total_us / 1000, rel=1e-4)
        assert rows[-1]["Cumulative Percentage (%)"] == pytest.approx(100, abs=0.01)
        assert [r[key] for r in rows] == sorted((r[key] for r in rows), reverse=True)
    # every activity in one perf row; one row per replayed kernel: their own durations
    unified = tables["unified_perf_summary"]
    assert sum(r["Kernel Time (µs)_sum"] for r in unified) == pytest.approx(sum(a.dur for a in trace.gpu), rel=1e-4)
    assert sum(r["Count"] for r in tables["ops_summary"]) == sum(
        r["operation_count"] for r in tables["ops_unique_args"]
    )


def test_ops_categories_on_real_traces():
    from magpie.traces.perf_rows import trace_tables

    def by_category(name):
        return trace_tables(load_trace(TRACES / name))[1]["ops_summary_by_category"]

    # TraceLens's categories: the attention kernels' op (_cudnn_attention_forward) is "other" (it
    # models the SDPA entry point above it), and so are kernels launched outside any op
    llama = {r["op category"] for r in by_category("llama_decode_bf16.json.gz")}
    assert llama == {"GEMM", "elementwise", "reduce", "other"}
    triton = {r["op category"]: r["Count"] for r in by_category("triton_rmsnorm_matmul.json.gz")}
    assert triton["other"] == 5 and triton["GEMM"] == 5
    train = {r["op category"] for r in by_category("train_step_mlp.json.gz")}
    assert "multi_tensor_apply" in train


def test_convolution_model_by_hand():
    from magpie.traces.perf_models import estimate

    bf16 = "c10::BFloat16"
    # 3x3, stride 1, padding 1: output 56x56; FLOPs 2*N*K*P*Q*C*R*S
    conv = estimate(
        _op(
            "aten::convolution",
            [[8, 64, 56, 56], [128, 64, 3, 3], [128], [], [], [], [], [], []],
            [bf16, bf16, bf16] + ["ScalarList"] * 3 + ["Scalar", "ScalarList", "Scalar"],
            ["", "", "", "[1, 1]", "[1, 1]", "[1, 1]", "False", "[0, 0]", "1"],
        )
    )
    assert conv.params["convNd"] == "conv2d" and conv.params["bias"] and conv.params["padding"] == (1, 1)
    assert conv.flops == 2 * 8 * 128 * 56 * 56 * 64 * 3 * 3  # a 56x56 output
    assert conv.bytes == (8 * 64 * 56 * 56 + 128 * 64 * 9 + 8 * 128 * 56 * 56 + 128) * 2
    strided = estimate(
        _op(
            "aten::cudnn_convolution",
            [[1, 32, 32, 32], [32, 1, 3, 3]],
            ["float", "float"],
            ["", "", "[0, 0]", "[2, 2]", "[1, 1]", "32", "False", "False", "True"],
        )
    )
    assert strided.params["stride"] == (2, 2) and strided.params["groups"] == 32
    assert strided.flops == 2 * 1 * 32 * 15 * 15 * 1 * 9  # a 15x15 output; depthwise: one input channel each


def test_steady_state_window_from_step_annotations(tmp_path):
    from magpie.traces.steady import steady_state_window

    trace = load_trace(TRACES / "llama_decode_bf16.json.gz")
    window, info = steady_state_window(trace)
    assert info["picked"] and info["family"] == "step_N_decode" and info["steps"] == 14
    decode = sorted((ts, ts + dur) for name, ts, dur in trace.gpu_annotations if name.endswith("_decode"))
    assert window.bounds(trace) == (decode[1][0], decode[-2][1])  # first and last decode steps left out
    prefill = next((ts, ts + dur) for name, ts, dur in trace.gpu_annotations if name.endswith("_prefill"))
    inside = [k for k in trace.kernels if window.bounds(trace)[0] <= k.ts <= window.bounds(trace)[1]]
    assert inside and not [k for k in inside if prefill[0] <= k.ts <= prefill[1]]
    assert window_total_us(trace, window) < window_total_us(trace, Window())
    none, why = steady_state_window(load_trace(TRACES / "train_step_mlp.json.gz"))
    assert none is None and "no numbered step annotations" in why["reason"]
    summary = json.loads(
        magpie_in_process(
            "benchmark",
            "--trace-dir",
            first_three(tmp_path),
            "--steady-state",
            "-o",
            tmp_path / "o",
            "--json",
            cwd=tmp_path,
            check=0,
        ).stdout
    )
    assert [p["picked"] for p in summary["window_picks"]] == [True, False, True]
    assert any("no steady state picked" in w for w in summary["warnings"])


def _modelled(name: str) -> dict:
    """Perf-model estimates of the real trace's ops, by op name and input dims."""
    from magpie.traces.ops_tables import signature_groups

    found = {}
    for group in signature_groups(load_trace(TRACES / name)):
        if group.est is not None:
            found[(group.op.name, json.dumps(group.op.input_dims))] = group.est
    return found


def test_convolution_models_on_a_real_trace():
    """Every convolution of the H200 conv net (plain, grouped, strided 1x1, transposed, 1-d run
    as 2-d by cuDNN) against a hand count; argument positions as the trace records them."""
    found = _modelled("conv_bf16.json.gz")
    convs = {dims: e for (name, dims), e in found.items() if "convolution" in name and name.startswith("aten::cudnn")}
    expected = {  # input dims -> FLOPs (the output's pixels times the work of each)
        (8, 32, 56, 56): 2 * 8 * 64 * 56 * 56 * 32 * 9,
        (8, 64, 56, 56, "g8"): 2 * 8 * 64 * 56 * 56 * 8 * 9,
        (8, 64, 56, 56, "1x1"): 2 * 8 * 128 * 28 * 28 * 64,
        (8, 128, 28, 28): 2 * 8 * 128 * 28 * 28 * 32 * 16,  # transposed: per input pixel
        (8, 64, 1, 1024): 2 * 8 * 64 * 1024 * 64 * 5,
    }
    got = {}
    for dims, estimate in convs.items():
        x, w = json.loads(dims)[:2]
        key = tuple(x) + (("g8",) if w[1] == 8 else ("1x1",) if w[2:] == [1, 1] else ())
        got[key] = estimate.flops
    assert got == expected
    transposed = next(e for (name, _), e in found.items() if name == "aten::cudnn_convolution_transpose")
    assert transposed.params["transposed_conv"] and transposed.precision == "bf16_tensor"


def test_scaled_mm_model_on_a_real_fp8_trace():
    found = _modelled("fp8_scaled_mm.json.gz")
    scaled = {dims: e for (name, dims), e in found.items() if name == "aten::_scaled_mm"}
    assert len(scaled) == 4  # two shapes, tensor-wise and row-wise scales
    for dims, estimate in scaled.items():
        (m, k), (_, n) = json.loads(dims)[:2]
        assert estimate.flops == 2 * m * n * k
        assert estimate.precision == "fp8_tensor"
        # one byte per fp8 operand element, bf16 out (out_dtype recorded as ScalarType 15), fp32 scales
        scales = sum(4 * math.prod(d) for d in json.loads(dims)[2:4])  # 0-d, or one per row / column
        assert estimate.bytes == m * k + k * n + 2 * m * n + scales


def test_steps_and_stages_from_vllm_step_annotations():
    from magpie.traces.stages import split_steps, stage_traces

    trace = load_trace(TRACES / "serving_steps_vllm_format.json.gz")
    steps, how = split_steps(trace)
    assert how["format"] == "vllm" and how["source"] == "gpu annotations"
    # the capture: 2 requests arrive at step 0, one at 5 and one at 11, beside running decodes
    assert "".join(s.stage[0] for s in steps) == "pdddd" + "pddddd" + "pdddddd"
    assert [s.stage for s in steps if s.detail["context_requests"]] == ["prefill", "prefilldecode", "prefilldecode"]
    views = stage_traces(trace, steps)
    assert {stage: (pick["steps"], pick["kept_steps"]) for stage, (_, _, pick) in views.items()} == {
        "prefill": (1, 1),
        "decode": (15, 13),
        "prefilldecode": (2, 2),
    }
    # an independent count: kernel events that start inside the kept steps' GPU annotations
    events = raw_events("serving_steps_vllm_format.json.gz")
    spans = sorted((e["ts"], e["ts"] + e["dur"], e["name"]) for e in events if e.get("cat") == "gpu_user_annotation")
    decode = [(s, e) for s, e, name in spans if name.startswith("execute_context_0(0)")][1:-1]
    expected = sum(
        e["dur"] for e in events if e.get("cat") == "kernel" and any(s <= e["ts"] <= end for s, end in decode)
    )
    assert views["decode"][2]["kernel_time_us"] == pytest.approx(expected)


@pytest.mark.parametrize(
    "name", ["serving_steps_vllm_format.json.gz", "llama_unannotated.json.gz", "graph_replay.json.gz"]
)
def test_a_stages_tables_from_its_traces_calls_are_those_of_the_stage_walked_anew(name):
    from magpie.traces.perf_rows import TraceCalls, trace_tables
    from magpie.traces.stages import split_steps, stage_traces

    trace = load_trace(TRACES / name)
    calls = TraceCalls.of(trace)
    trace_tables(trace, calls=calls)  # the trace's own tables first, as the report makes them
    for view, _, _ in stage_traces(trace, split_steps(trace)[0]).values():
        staged = calls.stage(view)
        assert staged.nesting.subtrees is calls.nesting.subtrees  # the trace's calls, not walked again
        assert repr(trace_tables(view, idle_calls=False, calls=staged)) == repr(trace_tables(view, idle_calls=False))


@pytest.mark.parametrize("name", ["llama_decode_bf16.json.gz", "graph_replay.json.gz"])
def test_a_stage_that_cuts_a_call_or_a_launch_is_walked_anew(name):
    import dataclasses

    from magpie.traces.perf_rows import TraceCalls, trace_tables

    trace = load_trace(TRACES / name)
    calls = TraceCalls.of(trace)
    # the second kernel of an op's call (llama), or of a graph launch's replay (each kernel its own call)
    launcher = {"llama_decode_bf16.json.gz": lambda a: a.op, "graph_replay.json.gz": lambda a: a.launch}[name]
    seen, cut = set(), None
    for activity in trace.gpu:
        key = launcher(activity)
        if key is not None and key in seen:
            cut = activity
            break
        seen.add(key)
    view = dataclasses.replace(trace, gpu=[a for a in trace.gpu if a is not cut])
    staged = calls.stage(view)
    assert staged.nesting.subtrees is not calls.nesting.subtrees
    assert repr(trace_tables(view, idle_calls=False, calls=staged)) == repr(trace_tables(view, idle_calls=False))


def test_steps_from_the_call_tree_when_nothing_is_annotated():
    from magpie.traces.stages import split_steps

    trace = load_trace(TRACES / "llama_unannotated.json.gz")
    assert not trace.annotations
    steps, how = split_steps(trace)
    # the capture: a prefill of 4 x 80 tokens, then 12 decode steps of 4 tokens
    assert how["method"] == "call tree" and how["anchor"] == "aten::embedding"
    assert [s.stage for s in steps] == ["prefill"] + ["decode"] * 12
    assert [s.detail["gemm_rows"] for s in steps[:2]] == [320, 4]
    launched = sum(k.dur for k in trace.kernels if k.launch is not None)
    assert sum(k.dur for k in trace.kernels if any(s.start <= k.ts <= s.end for s in steps)) == pytest.approx(launched)
    steps, how = split_steps(load_trace(TRACES / "train_step_mlp.json.gz"))
    assert steps == [] and "no top-level op repeats" in how["reason"]


def test_stage_words_and_step_formats():
    from magpie.traces.stages import STEP_FORMATS

    def stage(name):
        for pattern, classify in STEP_FORMATS.values():
            match = pattern.search(name)
            if match:
                return classify(match)[0]
        return "none"

    assert stage("execute_context_3(512)_generation_0(0)") == "prefill"
    assert stage("execute_context_0(0)_generation_8(8)") == "decode"
    assert stage("execute_context_1(77)_generation_8(8)") == "prefilldecode"
    assert stage("execute_context_0(0)_generation_0(0)") is None  # an idle step
    assert stage("step_7_decode") == "decode" and stage("EXTEND 12") == "prefill"
    assert stage("mixed-3") == "prefilldecode"
    assert stage("decoder_layer") == "none" and stage("prefill") == "none"  # a step needs its number


def test_inference_mode_writes_per_stage_outputs_and_the_tracelens_block(tmp_path):
    import shutil

    folder = tmp_path / "t"
    folder.mkdir()
    for name in ("serving_steps_vllm_format.json.gz", "train_step_mlp.json.gz"):
        shutil.copy(TRACES / name, folder / name)
    summary = json.loads(
        magpie_in_process(
            "benchmark",
            "--trace-dir",
            folder,
            "--analysis-mode",
            "inference",
            "-o",
            tmp_path / "o",
            "--json",
            cwd=tmp_path,
            check=0,
        ).stdout
    )
    from magpie.report.models import TraceSummary

    TraceSummary.model_validate(summary)  # the CLI's summary keeps the rule's contract
    block = summary["tracelens_analysis"]
    assert block["analysis_mode"] == "inference" and block["errors"] == []
    stages = block["per_stage"]["serving_steps_vllm_format"]
    assert set(stages) == {"prefill", "decode", "prefilldecode"}
    for info in stages.values():
        assert all(Path(f).is_file() for f in info["files"]) and info["reason"]
    decode = tmp_path / "o" / "tracelens" / "serving_steps_vllm_format" / "decode"
    with open(decode / "gap_analysis.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert sum(float(r["Self CUDA total (us)"]) for r in rows) <= stages["decode"]["kernel_time_us"] + 0.01
    timeline = {r["type"]: float(r["time ms"]) for r in csv.DictReader(open(decode / "gpu_timeline.csv"))}
    assert timeline["computation_time"] * 1000 == pytest.approx(stages["decode"]["kernel_time_us"], rel=1e-3)
    assert any("train_step_mlp" in w and "no steps found" in w for w in block["warnings"])
    assert all(Path(f).is_file() for f in block["outputs"])


def test_unique_args_and_family_sheets_with_tracelens_columns():
    from magpie.roofline.specs import lookup
    from magpie.traces.ops_tables import FAMILY_SHEET, PERF_FAMILIES, table_columns
    from magpie.traces.perf_rows import trace_tables

    trace = load_trace(TRACES / "conv_bf16.json.gz")
    _, tables = trace_tables(trace, lookup("H200"))  # with the peaks: the roofline columns too
    unique = tables["ops_unique_args"]
    assert sum(r["total_direct_kernel_time_sum"] for r in unique) == pytest.approx(
        sum(a.dur for a in trace.gpu), rel=1e-4
    )
    assert sum(sum(d["count"] for d in ast.literal_eval(r["kernel_details_summary"])) for r in unique) == len(trace.gpu)
    for row in tables["unified_perf_summary"]:
        assert row["Kernel Time (µs)_min"] <= row["Kernel Time (µs)_median"] <= row["Kernel Time (µs)_max"]
        assert row["Kernel Time (µs)_mean"] * row["operation_count"] == pytest.approx(
            row["Kernel Time (µs)_sum"], rel=1e-3
        )
    conv = tables["CONV_fwd"]
    # the op TraceLens models, with the cudnn_convolution (plain or transposed) inside it
    assert {r["name"] for r in conv} == {"aten::convolution"} and sum(r["name_count"] for r in conv) == 15
    columns = table_columns("CONV_fwd", conv)
    assert columns[0] == "name" and columns[-len(FAMILY_SHEET) :] == FAMILY_SHEET
    assert {"param: stride", "param: groups", "param: transposed_conv"} <= set(table_columns("CONV_fwd", conv))
    assert {r["name"] for r in tables["UnaryElementwise"]} == {"aten::clamp_min"}  # relu's kernel
    assert {r["name"] for r in tables["BinaryElementwise"]} == {"aten::add_"}  # the bias, inside the convolution
    gemm = trace_tables(load_trace(TRACES / "llama_decode_bf16.json.gz"))[1]["GEMM"]
    assert gemm and all({"param: M", "param: N", "param: K"} <= set(r) for r in gemm)
    # the operands' strides, in TraceLens's names, from the first call's Input Strides
    for r in gemm:
        strides = (
            ast.literal_eval(r["Input Strides_first"])[1:]
            if r["name"] == "aten::addmm"
            else ast.literal_eval(r["Input Strides_first"])
        )
        assert (r["param: stride_A"], r["param: stride_B"]) == tuple(map(tuple, strides[:2]))
    assert any(r["name"] == "aten::mm" and r["param: stride_A"] == (512, 1) for r in gemm)
    # cuBLAS's nvjet kernels name the transposes (TN: A transposed, B not)
    assert {r["param: transpose"] for r in gemm if r["name"] == "aten::mm"} == {(True, False)}
    assert conv[0]["param: input_stride"] == ast.literal_eval(conv[0]["Input Strides_first"])[0]
    assert tables["UnaryElementwise"][0]["param: stride_output"] is None  # clamp_min's output is no input
    assert set(tables) >= set(PERF_FAMILIES)


# What a trace's op tables hold: durations in 2**-10 µs steps, rates derived from them, few
# distinct values, magnitudes far apart, signs mixed.
TABLE_VALUES = st.one_of(
    st.integers(1, 200_000).map(lambda n: n / 1024),
    st.floats(0.5, 5e4).map(lambda d: 3.1e9 / d),
    st.sampled_from([1.5, 2.25, 7.0]),
    st.floats(1e-15, 1e15),
    st.floats(-1, 1),
)


@settings(max_examples=500)
@given(values=st.lists(TABLE_VALUES, min_size=2, max_size=400))
def test_standard_deviations_are_the_statistics_modules_to_the_last_bit(values):
    """The op tables' std columns come from integer sums over the distinct values, not from
    statistics.stdev and pstdev; their bits must be the same."""
    import statistics

    from magpie.traces.stats import population_std, sample_std

    mean = statistics.fmean(values)
    assert sample_std(values) == statistics.stdev(values)
    assert population_std(values, mean) == statistics.pstdev(values, mean)


def test_the_standard_deviations_of_a_constant_sample_are_zero():
    from magpie.traces.stats import population_std, sample_std

    assert sample_std([2.5] * 4) == 0.0 == population_std([2.5] * 4, 2.5)


@pytest.mark.parametrize("name", ALL)
def test_op_nesting_found_while_linking_is_the_stack_rule_over_the_ops_alone(name):
    """trace.op_parents comes from the sweep that links launches to ops; on every thread it must be
    what a stack over the ops alone gives (by start, a longer op first): each op's innermost
    enclosing op."""
    trace = load_trace(TRACES / name)
    ops, threads, expected = trace.cpu_ops, {}, {}
    for i, op in enumerate(ops):
        threads.setdefault((op.pid, op.tid), []).append(i)
    for indices in threads.values():
        indices.sort(key=lambda i: (ops[i].ts, -ops[i].dur))
        stack = []
        for i in indices:
            while stack and ops[stack[-1]].ts + ops[stack[-1]].dur < ops[i].ts:
                stack.pop()
            if stack:
                expected[i] = stack[-1]
            stack.append(i)
    assert trace.op_parents == expected and (expected or not ops)


def test_perf_rows_are_the_outermost_modelled_op_with_synthetic_ops_beside():
    """unified_perf_summary's rows are TraceLens's: the outermost op it models, with everything
    launched inside it; an op's own kernels beside children that are rows are
    '<op>-><kernel> (Synthetic Op)' calls; every activity is in one row. The family sheets list
    every call of their ops, nested ones and ones that launched nothing (not in a stage's view)."""
    from magpie.traces.perf_rows import trace_tables

    trace = load_trace(TRACES / "conv_bf16.json.gz")
    unified = trace_tables(trace)[1]["unified_perf_summary"]
    assert {r["name"] for r in unified} == {"aten::convolution", "aten::clamp_min"}  # bias adds inside
    trace = load_trace(TRACES / "train_step_mlp.json.gz")
    tables = trace_tables(trace)[1]
    names = {r["name"]: r for r in tables["unified_perf_summary"]}
    synthetic = [n for n in names if n.startswith("aten::mse_loss->") and n.endswith(" (Synthetic Op)")]
    assert len(synthetic) == 1 and "aten::mse_loss" not in names  # its mean is a row of its own
    assert names[synthetic[0]]["Input Dims"] == "((512, 1024), (512, 1024), ())"  # as TraceLens writes it
    assert names[synthetic[0]]["op category"] == "elementwise" and not names[synthetic[0]]["has_perf_model"]
    assert "aten::layer_norm" in names and "aten::native_layer_norm" not in names
    assert {r["name"] for r in tables["Normalization"]} >= {"aten::layer_norm", "aten::native_layer_norm"}
    idle = [r for r in tables["BinaryElementwise"] if r["Kernel Time (µs)_sum"] == 0]
    assert idle and idle[0]["name_count"] == 6 and idle[0].get("TB/s_mean") is None  # a CPU scalar's add_
    stage_view = trace_tables(trace, idle_calls=False)[1]
    assert not [r for r in stage_view["BinaryElementwise"] if r["Kernel Time (µs)_sum"] == 0]


def test_perf_rows_leave_out_collective_communication(tmp_path):
    """As TraceLens's: an op it does not model that launched NCCL kernels is no perf row, nor an
    NCCL kernel outside any op; nor are they kernel launchers in the op tables (TraceLens's
    default, checked against its outputs of the NCCL capture in test_traces_multirank.py)."""
    from magpie.traces.perf_rows import trace_tables

    def launch(ts, correlation, kernel):
        return [
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": "cudaLaunchKernel",
                "ts": ts,
                "dur": 2,
                "pid": 1,
                "tid": 1,
                "args": {"correlation": correlation},
            },
            {"ph": "X", "cat": "kernel", "name": kernel, "ts": ts + 5, "dur": 4, "args": {"correlation": correlation}},
        ]

    events = [
        {"ph": "X", "cat": "cpu_op", "name": "c10d::allreduce_", "ts": 0, "dur": 10, "pid": 1, "tid": 1},
        *launch(1, 1, "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage)"),
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": "aten::mm",
            "ts": 20,
            "dur": 10,
            "pid": 1,
            "tid": 1,
            "args": {"Input Dims": [[4, 8], [8, 16]], "Input type": ["float", "float"]},
        },
        *launch(21, 2, "nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNT"),
        *launch(40, 3, "ncclDevKernel_Broadcast_RING_LL(ncclDevKernelArgsStorage)"),
    ]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    tables = trace_tables(load_trace(path))[1]
    assert [r["name"] for r in tables["unified_perf_summary"]] == ["aten::mm"]
    assert [r["name"] for r in tables["ops_summary"]] == ["aten::mm"]
    assert [r["name"] for r in tables["ops_unique_args"]] == ["aten::mm"]


def test_signatures_split_by_strides_and_carry_process_thread_and_first_uid():
    """TraceLens's signature includes Input Strides and the process and thread: two calls alike
    but for their strides are two rows; ex_UID is the first call's index in traceEvents."""
    from magpie.traces.perf_rows import trace_tables

    trace = load_trace(TRACES / "serving_steps_vllm_format.json.gz")
    groups, tables = trace_tables(trace)
    muls = [g for g in groups if g.name == "aten::mul" and g.op.input_dims[:2] == [[2, 8, 1, 64], [1, 1, 1, 64]]]
    assert len(muls) == 2 and muls[0].op.strides != muls[1].op.strides
    for group in groups:
        if group.op is not None:
            first = min(
                i
                for i, op in enumerate(trace.cpu_ops)
                if op.name == group.name
                and op.strides == group.op.strides
                and op.input_dims == group.op.input_dims
                and op.concrete == group.op.concrete
                and op.input_types == group.op.input_types
                and (op.pid, op.tid) == (group.op.pid, group.op.tid)
            )
            assert group.uid == trace.op_uids[first]
    row = tables["ops_unique_args"][0]
    assert row["process_label"] == "CPU" and row["thread_name"].startswith("thread ")
    assert ast.literal_eval(row["Input Strides"]) == tuple(map(tuple, groups[0].op.strides))


def test_declared_trace_sets_build_as_rules_into_the_report(tmp_path):
    """[[traces]] in magpie.toml: analysed by the trace_analysis rule, shown in the build's report,
    rebuilt only when a trace changes; a missing folder is one line naming the field."""
    import shutil

    from conftest import write

    def build_json(cwd):
        return json.loads(magpie_in_process("build", "--json", cwd=cwd, check=0).stdout)

    (tmp_path / "traces").mkdir()
    for name in ("serving_steps_vllm_format.json.gz", "triton_rmsnorm_matmul.json.gz"):
        shutil.copy(TRACES / name, tmp_path / "traces" / name)
    write(
        tmp_path,
        {
            "magpie.toml": """
        [[traces]]
        id = "serving"
        dir = "traces"
        analysis_mode = "inference"
        top_k = 5
    """
        },
    )
    first = magpie_in_process("build", "--json", cwd=tmp_path, check=0)
    assert json.loads(first.stdout)["executed"] == ["trace_analysis:serving", "report"], first.stdout
    assert build_json(tmp_path)["executed"] == []
    published = tmp_path / "workspaces" / "reports" / "traces" / "serving"
    result = json.loads((published / "result.json").read_text())
    assert result["state"] == "SUCCESS" and len(result["summary"]["top"]) == 5
    outputs = result["summary"]["tracelens_analysis"]["outputs"]
    assert outputs and all((published / path).is_file() for path in outputs)  # relative to the artifact
    html = (tmp_path / "workspaces" / "reports" / "report.html").read_text()
    assert 'id="traces-serving"' in html and '<table class="stages">' in html
    assert "traces/serving/trace_report.html" in html
    shutil.copy(TRACES / "llama_unannotated.json.gz", tmp_path / "traces" / "extra.json.gz")
    assert build_json(tmp_path)["executed"] == ["trace_analysis:serving", "report"]
    write(
        tmp_path,
        {
            "magpie.toml": """
        [[traces]]
        id = "serving"
        dir = "no_such_folder"
    """
        },
    )
    proc = magpie_in_process("build", cwd=tmp_path, check=2)
    assert proc.stderr.strip().count("\n") == 0 and "traces[0].dir" in proc.stderr and "Traceback" not in proc.stderr
    for manifest, field in (
        (
            """
        [[traces]]
        id = "serving"
        dir = "traces"
        kernel_source_repos = ["no_such_repo"]
    """,
            "traces[0].kernel_source_repos",
        ),
        (
            """
        [[traces]]
        id = "serving"
        dir = "traces"

        [[traces]]
        id = "serving"
        dir = "traces"
    """,
            "'serving' is used twice",
        ),
    ):
        write(tmp_path, {"magpie.toml": manifest})
        proc = magpie_in_process("build", cwd=tmp_path, check=2)
        assert proc.stderr.strip().count("\n") == 0 and field in proc.stderr and "Traceback" not in proc.stderr


def test_graph_replays_link_to_their_graph_launch_and_are_grouped_by_kernel_kind():
    from magpie.traces.perf_rows import trace_tables
    from magpie.traces.stages import split_steps, stage_traces

    trace = load_trace(TRACES / "graph_replay.json.gz")
    replayed = [k for k in trace.kernels if k.launch is not None and trace.launches[k.launch].name == "cudaGraphLaunch"]
    assert len(replayed) == 24 and all(k.op is None for k in replayed)  # 6 replays of a 4-kernel graph
    assert trace.unlinked["kernels_without_launch"] == 0 and trace.unlinked["kernels_without_cpu_op"] == 24
    ops = {r["name"]: r for r in trace_tables(trace)[1]["ops_summary"]}
    assert ops["cudaGraphLaunch"]["Categories"] == "['other']" and ops["cudaGraphLaunch"]["Count"] == 6
    steps, _ = split_steps(trace)
    decode = stage_traces(trace, steps)["decode"][0]
    assert len(decode.kernels) == 16  # 4 of the 6 replayed steps kept, 4 kernels each


def test_traces_with_one_file_name_in_two_folders_keep_their_own_outputs(tmp_path):
    import shutil

    for rank, name in (("rank0", "llama_decode_bf16.json.gz"), ("rank1", "triton_rmsnorm_matmul.json.gz")):
        (tmp_path / "t" / rank).mkdir(parents=True)
        shutil.copy(TRACES / name, tmp_path / "t" / rank / "trace.json.gz")
    summary = json.loads(
        magpie_in_process(
            "benchmark", "--trace-dir", tmp_path / "t", "-o", tmp_path / "o", "--json", cwd=tmp_path, check=0
        ).stdout
    )
    assert [p["label"] for p in summary["pages"]] == ["rank0_trace", "rank1_trace"]
    for label in ("rank0_trace", "rank1_trace"):
        assert (tmp_path / "o" / "tracelens" / f"{label}_kernel_roofline_simple.csv").is_file()
        assert (tmp_path / "o" / "tracelens" / label / "ops_summary.csv").is_file()


def _gpu_free_copy(source: Path, target: Path) -> Path:
    """A CPU-only profile of the same run: the trace without its GPU side (no kernels, memcpy,
    memset, runtime calls or device properties), as ProfilerActivity.CPU alone records it."""
    doc = json.load(gzip.open(source))
    gpu_side = {"kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime", "cuda_driver", "ac2g", "gpu_user_annotation"}
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("cat") not in gpu_side]
    doc.pop("deviceProperties", None)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(doc))
    return target


def test_a_cpu_only_trace_warns_in_one_line_and_explains_in_the_summary(tmp_path):
    _gpu_free_copy(TRACES / "train_step_mlp.json.gz", tmp_path / "cpu" / "cpu_only.json")
    proc = magpie_in_process(
        "benchmark", "--trace-dir", tmp_path / "cpu", "-o", tmp_path / "out", cwd=tmp_path, check=0
    )
    warnings = [line for line in proc.stdout.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "cpu_only.json" in warnings[0] and "no GPU activity" in warnings[0]
    summary = json.loads((tmp_path / "out/gap_analysis/gap_analysis.json").read_text())
    assert summary["total_kernel_time_us"] == 0 and summary["top"] == []
    assert "no GPU kernels in any trace" in summary["explanation"] and "CPU-only" in summary["explanation"]


def test_a_trace_with_kernels_has_no_explanation_and_memcpy_alone_is_named(tmp_path):
    from magpie.traces.report import analyze_traces

    summary = analyze_traces(_one(tmp_path, "graph_replay"), tmp_path / "out")
    assert summary["explanation"] == "" and summary["bad_traces"] == []
    doc = json.load(gzip.open(TRACES / "train_step_mlp.json.gz"))
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("cat") != "kernel"]
    (tmp_path / "memset").mkdir()
    (tmp_path / "memset" / "t.json").write_text(json.dumps(doc))
    summary = analyze_traces(tmp_path / "memset", tmp_path / "out2")
    assert "only 1 memcpy/memset" in summary["explanation"]


def _one(tmp_path, name):
    import shutil

    folder = tmp_path / name
    folder.mkdir()
    shutil.copy(TRACES / f"{name}.json.gz", folder)
    return folder


def test_a_bad_rank_among_several_is_reported_and_skipped(tmp_path):
    folder = first_three(tmp_path)
    data = (TRACES / "train_step_mlp.json.gz").read_bytes()
    (folder / "rank3.json.gz").write_bytes(data[: len(data) // 2])  # truncated
    (folder / "rank4.json").write_text('{"traceEvents": [{"ph": "X"')  # corrupt
    proc = magpie_in_process(
        "benchmark", "--trace-dir", folder, "--top-k", "60", "-o", tmp_path / "out", cwd=tmp_path, check=0
    )
    warnings = [line for line in proc.stdout.splitlines() if line.startswith("warning: skipped a bad trace")]
    assert len(warnings) == 2
    assert any("rank3.json.gz" in w and "cannot decompress" in w for w in warnings)
    assert any("rank4.json" in w and "not valid JSON" in w for w in warnings)
    summary = json.loads((tmp_path / "out/gap_analysis/gap_analysis.json").read_text())
    assert len(summary["traces"]) == 3
    assert [Path(b["path"]).name for b in summary["bad_traces"]] == ["rank3.json.gz", "rank4.json"]
    # the console table of several ranks says whose each row is
    lines = proc.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if "% Total" in line)
    assert lines[header].split()[0] == "rank"
    top = summary["top"]
    assert len(top) == 60
    for line, row in zip(lines[header + 1 : header + 1 + len(top)], top, strict=True):
        assert line.split()[0] == row["Rank"]
    assert len({row["Rank"] for row in top}) > 1


def test_traces_claiming_one_rank_keep_their_own_rows_csvs_and_timelines(tmp_path):
    """Two captures of rank 0 and one of rank 1 in one folder: each keeps its rows in the combined
    table, its per-rank CSV and its timeline (labelled 0_0, 0_1: neither replaces the other), and
    the repeat is a warning."""
    from magpie.traces.report import analyze_traces

    data = json.load(gzip.open(TRACES / "train_step_mlp.json.gz"))
    for folder, rank in (("a", 0), ("b", 0), ("c", 1)):
        (tmp_path / "traces" / folder).mkdir(parents=True)
        (tmp_path / "traces" / folder / "trace.json").write_text(
            json.dumps({**data, "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 2}})
        )
    summary = analyze_traces(tmp_path / "traces", tmp_path / "out", top_k=1000)
    assert [t["rank"] for t in summary["traces"]] == ["0_0", "0_1", "1"]
    assert {row["Rank"] for row in summary["top"]} == {"0_0", "0_1", "1"}
    assert sum(row["% Total"] for row in summary["top"]) == pytest.approx(100, abs=0.1)
    for rank in ("0_0", "0_1", "1"):
        assert (tmp_path / f"out/gap_analysis/gap_analysis_rank{rank}.csv").is_file()
        assert (tmp_path / f"out/gpu_timeline_rank{rank}_dev0.csv").is_file()
    assert any(
        w.startswith("rank 0 is claimed by 2 traces") and w.endswith("labelled 0_0, 0_1") for w in summary["warnings"]
    )


def test_one_trace_prints_no_rank_column_and_all_bad_is_still_an_error(tmp_path):
    proc = magpie_in_process(
        "benchmark", "--trace-dir", _one(tmp_path, "conv_bf16"), "-o", tmp_path / "out", cwd=tmp_path, check=0
    )
    assert "rank" not in next(line for line in proc.stdout.splitlines() if "% Total" in line)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "a.json").write_text("{")
    (bad / "b.json").write_text('{"traceEvents": [')
    proc = magpie_in_process("benchmark", "--trace-dir", bad, cwd=tmp_path)
    assert proc.returncode == 2 and "a.json" in proc.stderr and "1 more bad" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_kernels_launched_outside_any_op_show_their_kernel_name(tmp_path):
    from magpie.traces.report import analyze_traces

    summary = analyze_traces(_one(tmp_path, "triton_rmsnorm_matmul"), tmp_path / "out")
    rms = next(r for r in summary["top"] if r["Name"] == "_rms_kernel")
    assert rms["CPU Op"] == "cuLaunchKernelEx->_rms_kernel"
    names = [row["name"] for page in summary["pages"] for row in page["ops"]]
    assert "cuLaunchKernelEx: _rms_kernel" in names
    with open(tmp_path / "out/tracelens/triton_rmsnorm_matmul/ops_summary.csv") as handle:
        assert "cuLaunchKernelEx" in {row["name"] for row in csv.DictReader(handle)}  # TraceLens's name kept
    summary = analyze_traces(_one(tmp_path, "graph_replay"), tmp_path / "out2")
    replayed = [r for r in summary["top"] if r["CPU Op"].startswith("cudaGraphLaunch->")]
    assert replayed and all(r["CPU Op"] == f"cudaGraphLaunch->{r['Normalized Name']}" for r in replayed)
    assert any(row["name"].startswith("cudaGraphLaunch: ") for page in summary["pages"] for row in page["ops"])


def test_streamed_decode_in_small_batches_matches_the_whole_document(tmp_path, monkeypatch):
    """Events read a few bytes at a time, cut between events only: a name holding '}, {' and
    nested args do not split an event, and keys after traceEvents (deviceProperties) are read."""
    import gzip as gz
    import json as js

    from magpie.traces import ingest

    events = [
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": "op}, {x",
            "pid": 1,
            "tid": 1,
            "ts": 10.0 * i,
            "dur": 5.0,
            "args": {
                "Input Dims": [[2, 3], []],
                "Input type": ["float", ""],
                "Input Strides": [[3, 1], []],
                "nested": [{"a": 1}, {"b": 2}],
            },
        }
        for i in range(40)
    ]
    events += [
        {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "python3"}},
        {"ph": "M", "name": "process_labels", "pid": 1, "tid": 0, "args": {"labels": "CPU"}},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "thread 1 (python3)"}},
    ]
    events += [
        {
            "ph": "X",
            "cat": "cuda_runtime",
            "name": "cudaLaunchKernel",
            "pid": 1,
            "tid": 1,
            "ts": 10.0 * i + 1,
            "dur": 1.0,
            "args": {"correlation": i},
        }
        for i in range(40)
    ]
    events += [
        {
            "ph": "X",
            "cat": "kernel",
            "name": "k]}, {",
            "pid": 0,
            "tid": 7,
            "ts": 10.0 * i + 2,
            "dur": 3.0,
            "args": {"correlation": i, "device": 0, "stream": 7},
        }
        for i in range(40)
    ]
    text = js.dumps(
        {
            "traceEvents": events,
            "deviceProperties": [{"name": "NVIDIA H200"}, {"name": "x"}],
            "distributedInfo": {"rank": 3},
        },
        indent=1,
    )
    path = tmp_path / "t.json.gz"
    path.write_bytes(gz.compress(text.encode()))
    monkeypatch.setattr(ingest, "_CHUNK", 97)
    streamed_documents, stream = [], ingest._stream
    monkeypatch.setattr(ingest, "_stream", lambda *a: streamed_documents.append(stream(*a)) or streamed_documents[-1])
    streamed = load_trace(path)
    assert streamed_documents[0] is not None  # read in batches, not whole
    monkeypatch.setattr(ingest, "_stream", lambda *_: None)  # the whole-document path
    whole = load_trace(path)
    assert (streamed.rank, streamed.device_name(), len(streamed.cpu_ops), len(streamed.gpu)) == (
        3,
        "NVIDIA H200",
        40,
        40,
    )
    assert streamed == whole
    assert streamed.gpu[5].op == 5 and streamed.cpu_ops[5].input_dims == [[2, 3], []]
    # strides shared like the other inputs; the event's index in traceEvents; the metadata events
    assert streamed.cpu_ops[5].strides == [[3, 1], []] and streamed.cpu_ops[5].strides is streamed.cpu_ops[6].strides
    assert streamed.op_uids[5] == 5 and streamed.launch_uids[2] == 45 and streamed.events == len(events)
    assert (streamed.process_names, streamed.process_labels, streamed.thread_names) == (
        {1: "python3"},
        {1: "CPU"},
        {(1, 1): "thread 1 (python3)"},
    )


def test_op_inputs_are_looked_up_together_and_each_distinct_text_decoded_once(tmp_path):
    """An op's four inputs are found by their joined texts: ops alike but for one input keep their
    own, and every op with the same text of an input shares its one decoded value."""
    events = [
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": "aten::mm",
            "pid": 1,
            "tid": 1,
            "ts": 10.0 * i,
            "dur": 5.0,
            "args": {
                "Input Dims": [[2, 3], [3, 4]],
                "Input type": ["float", "float"],
                "Input Strides": [[3, 1], [4, 1] if i % 2 else [1, 3]],
            },
        }
        for i in range(4)
    ]
    path = tmp_path / "ops.json"
    path.write_text(json.dumps({"traceEvents": events}))
    ops = load_trace(path).cpu_ops
    assert [op.strides[1] for op in ops] == [[1, 3], [4, 1], [1, 3], [4, 1]]
    assert ops[0].input_dims is ops[1].input_dims and ops[0].strides is ops[2].strides
    assert (ops[0].input_types, ops[0].concrete) == (["float", "float"], None)


def test_streamed_decode_of_a_broken_trace_says_what_the_whole_document_decode_says(tmp_path, monkeypatch):
    """Broken in the middle or cut short, read in small batches: the same error as reading it whole."""
    import json as js

    from magpie.traces import ingest

    events = [
        {
            "ph": "X",
            "cat": "kernel",
            "name": f"k{i}",
            "ts": float(i),
            "dur": 1.0,
            "pid": 0,
            "tid": 7,
            "args": {"correlation": i},
        }
        for i in range(200)
    ]
    text = js.dumps({"traceEvents": events}).encode()
    middle = len(text) // 2
    monkeypatch.setattr(ingest, "_CHUNK", 64)
    for name, broken in (("middle.json", text[:middle] + b"}}}" + text[middle + 3 :]), ("short.json", text[:middle])):
        path = tmp_path / name
        path.write_bytes(broken)
        with pytest.raises(TraceError) as streamed:
            load_trace(path)
        with pytest.raises(TraceError) as whole:
            ingest.decode(path)
        assert str(streamed.value) == str(whole.value)
