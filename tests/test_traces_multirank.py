"""Multi-rank trace analysis on real two-rank captures of bench/capture_traces.py's
tp2_collectives: with NCCL on the 2-GPU H200 host (tests/fixtures/traces/h200_nccl_tp2, its
README.md and capture_info.json beside the traces), and on the CPU, where it falls back to gloo
(tests/fixtures/traces/cpu_gloo_tp2). Gloo's collectives are CPU ops and annotations, not GPU
activity: there, the ranks, their collectives and their per-rank outputs; on the NCCL capture,
also the collective timeline, the communication rows of each rank and TraceLens's own outputs of
the same traces (tests/fixtures/tracelens_nccl_tp2)."""

import csv
import gzip
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import tomllib
from conftest import FIXTURES, REPO, magpie_in_process
from test_tracelens_parity import MAGPIE_IS_RIGHT, diff_file

from magpie.traces.gap import COLUMNS
from magpie.traces.ingest import load_trace
from magpie.traces.kernels import normalize
from magpie.traces.report import analyze_traces

GLOO = FIXTURES / "traces" / "cpu_gloo_tp2"
RANKS = ["gloo_tp2_rank0.json.gz", "gloo_tp2_rank1.json.gz"]
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
COLLECTIVES = ("c10d::_allgather_base_", "c10d::allreduce_", "c10d::_reduce_scatter_base_")


def _shape(path: Path) -> dict:
    """What a rank's trace is made of, timings aside: its distributed facts, op and annotation names."""
    doc = json.load(gzip.open(path))
    trace = load_trace(path)
    return {
        "distributed": {k: doc["distributedInfo"][k] for k in ("backend", "rank", "world_size")},
        "multicast_off": doc["multicast_off"],
        "ops": Counter(op.name for op in trace.cpu_ops),
        "annotations": Counter(name for name, *_ in trace.annotations),
    }


def test_each_rank_traced_its_steps_and_collectives():
    for rank, name in enumerate(RANKS):
        trace, shape = load_trace(GLOO / name), _shape(GLOO / name)
        assert trace.rank == rank and trace.gpu == [] and trace.device_properties == []
        assert shape["distributed"] == {"backend": "gloo", "rank": rank, "world_size": 2}
        assert shape["multicast_off"] == MULTICAST_OFF
        assert [shape["ops"][op] for op in COLLECTIVES] == [4, 4, 4]  # one of each per step
        assert shape["ops"]["aten::mm"] == 12
        # gloo runs a reduce_scatter as an all_reduce: two all_reduce annotations a step
        annotations = shape["annotations"]
        assert (annotations["gloo:all_gather"], annotations["gloo:all_reduce"]) == (4, 8)
        assert sorted(n for n in annotations if n.startswith("step_")) == [f"step_{i}" for i in range(4)]


def test_two_ranks_are_analysed_each_with_its_own_outputs(tmp_path):
    proc = magpie_in_process("benchmark", "--trace-dir", GLOO, "-o", tmp_path / "out", cwd=tmp_path, check=0)
    out = tmp_path / "out"
    summary = json.loads((out / "gap_analysis" / "gap_analysis.json").read_text())
    assert [(Path(t["path"]).name, t["rank"]) for t in summary["traces"]] == [(RANKS[0], "0"), (RANKS[1], "1")]
    assert summary["bad_traces"] == [] and summary["top"] == [] and summary["gpu_timeline"] == {"0": {}, "1": {}}
    warnings = [line for line in proc.stdout.splitlines() if line.startswith("warning:")]
    for name in RANKS:
        assert sum(name in w and "no GPU activity" in w for w in warnings) == 1
    assert not list(out.glob("gpu_timeline*.csv"))
    for rank, name in enumerate(RANKS):
        with open(out / "gap_analysis" / f"gap_analysis_rank{rank}.csv") as handle:
            assert next(csv.reader(handle)) == COLUMNS and next(handle, None) is None
        label = name.removesuffix(".json.gz")
        assert (out / "tracelens" / f"{label}_kernel_roofline_simple.csv").is_file()
        assert (out / "tracelens" / label / "ops_summary.csv").is_file()
        with open(out / "tracelens" / label / "GEMM.csv") as handle:
            gemms = {(r["param: M"], r["param: N"], r["param: K"]): r["name_count"] for r in csv.DictReader(handle)}
        # the rank's shard of the up and down projections (ffn 1024 over 2 ranks) and the whole gate
        assert gemms == {("64", "512", "256"): "4", ("64", "256", "512"): "4", ("64", "256", "256"): "4"}


def test_the_capture_writes_what_is_committed(tmp_path):
    """The fixture is what bench/capture_traces.py writes where it finds no two GPUs."""
    subprocess.run(
        [sys.executable, "bench/capture_traces.py", str(tmp_path), "tp2_collectives"],
        cwd=REPO,
        check=True,
        capture_output=True,
        timeout=300,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["capture_info.json", *RANKS]
    assert json.loads((tmp_path / "capture_info.json").read_text())["captures"] == ["tp2_collectives"]
    for name in RANKS:
        assert _shape(tmp_path / name) == _shape(GLOO / name)


NCCL = FIXTURES / "traces" / "h200_nccl_tp2"
NCCL_RANKS = ["nccl_tp2_rank0.json.gz", "nccl_tp2_rank1.json.gz"]
TRACELENS_NCCL = FIXTURES / "tracelens_nccl_tp2"
# per rank and step: the sequence shards gathered, the partial sums all-reduced, the gated sums reduce-scattered
NCCL_KERNELS = {
    "ncclDevKernel_AllGather_RING_LL": 4,
    "ncclDevKernel_AllReduce_Sum_bf16_RING_LL": 4,
    "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL": 4,
}


def _timeline(path: Path) -> dict[str, float]:
    with open(path) as handle:
        return {row["type"]: float(row["time ms"]) for row in csv.DictReader(handle)}


@pytest.fixture(scope="module")
def nccl_run(tmp_path_factory):
    """`magpie benchmark --trace-dir` on the NCCL capture: its console output and its output folder."""
    root = tmp_path_factory.mktemp("nccl")
    proc = magpie_in_process("benchmark", "--trace-dir", NCCL, "-o", root / "out", cwd=root, check=0)
    return proc.stdout, root / "out"


def test_each_nccl_rank_ran_its_collectives_on_its_own_gpu():
    for rank, name in enumerate(NCCL_RANKS):
        doc, trace = json.load(gzip.open(NCCL / name)), load_trace(NCCL / name)
        assert {k: doc["distributedInfo"][k] for k in ("backend", "rank", "world_size")} == {
            "backend": "nccl",
            "rank": rank,
            "world_size": 2,
        }
        assert doc["multicast_off"] == MULTICAST_OFF and trace.rank == rank
        # each rank's process saw both GPUs and ran on its own
        assert [p["id"] for p in trace.device_properties] == [0, 1]
        assert {a.device for a in trace.gpu} == {rank} and trace.device_name() == "NVIDIA H200"
        kernels = Counter(normalize(k.name) for k in trace.kernels)
        assert len(trace.kernels) == 44
        assert {k: n for k, n in kernels.items() if k.startswith("ncclDevKernel_")} == NCCL_KERNELS


def test_nccl_ranks_get_a_timeline_each_with_their_communication(nccl_run):
    _, out = nccl_run
    summary = json.loads((out / "gap_analysis" / "gap_analysis.json").read_text())
    assert [(Path(t["path"]).name, t["rank"], t["device"]) for t in summary["traces"]] == [
        (NCCL_RANKS[0], "0", "NVIDIA H200"),
        (NCCL_RANKS[1], "1", "NVIDIA H200"),
    ]
    assert summary["bad_traces"] == [] and summary["explanation"] == ""
    # nothing to warn of but the capture's record beside the traces
    [warning] = summary["warnings"]
    assert warning.startswith(f"skipped {NCCL / 'capture_info.json'}: not a PyTorch profiler")
    # one timeline per rank, of the GPU it ran on; no aggregate timeline of both
    assert sorted(p.name for p in out.glob("gpu_timeline*.csv")) == [
        "gpu_timeline_rank0_dev0.csv",
        "gpu_timeline_rank1_dev1.csv",
    ]
    assert {rank: list(devices) for rank, devices in summary["gpu_timeline"].items()} == {"0": ["0"], "1": ["1"]}
    timelines = [_timeline(out / f"gpu_timeline_rank{r}_dev{r}.csv") for r in (0, 1)]
    for t in timelines:
        assert t["total_comm_time"] > 0 and t["exposed_comm_time"] <= t["total_comm_time"]
        assert t["total_memcpy_time"] == 0
        assert t["busy_time"] == pytest.approx(t["computation_time"] + t["exposed_comm_time"])
    # rank 0's all_reduce overlaps the gate matmul (about 29 µs over the four steps); rank 1's
    # ended before its matmul started
    assert timelines[0]["total_comm_time"] - timelines[0]["exposed_comm_time"] == pytest.approx(0.0289, abs=1e-4)
    assert timelines[1]["exposed_comm_time"] == timelines[1]["total_comm_time"]
    # rank 0 waited 1.3 s in its first all_gather for rank 1, whose profiler started that much later
    assert timelines[0]["exposed_comm_time"] > 1300 and timelines[1]["exposed_comm_time"] < 1


def test_nccl_kernels_are_each_ranks_communication_rows_and_no_op_table_row(nccl_run):
    _, out = nccl_run
    for rank, name in enumerate(NCCL_RANKS):
        with open(out / "gap_analysis" / f"gap_analysis_rank{rank}.csv") as handle:
            rows = list(csv.DictReader(handle))
        communication = {r["Normalized Name"]: int(r["Calls"]) for r in rows if r["Category"] == "communication"}
        assert communication == NCCL_KERNELS and {r["Rank"] for r in rows} == {str(rank)}
        tables = out / "tracelens" / name.removesuffix(".json.gz")
        for table in ("unified_perf_summary", "ops_summary", "ops_unique_args"):
            with open(tables / f"{table}.csv") as handle:
                names = {r["name"] for r in csv.DictReader(handle)}
            # TraceLens counts no NCCL kernel as an op's: collectives are in the timeline and the gap table
            assert "aten::mm" in names and not names & {"record_param_comms", "c10d::allreduce_"}, table
    with open(out / "gap_analysis" / "gap_analysis.csv") as handle:
        top = [r for r in csv.DictReader(handle) if r["Category"] == "communication"]
    assert sorted((r["Rank"], r["Normalized Name"]) for r in top) == sorted(
        (str(rank), kernel) for rank in (0, 1) for kernel in NCCL_KERNELS
    )


def test_the_console_and_the_page_say_whose_each_row_is(nccl_run):
    stdout, out = nccl_run
    lines = stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if "% Total" in line)
    assert lines[header].split()[0] == "rank"
    rows = [line.split() for line in lines[header + 1 :] if line[:4].strip() in ("0", "1")]
    assert {row[0] for row in rows} == {"0", "1"}
    assert ["0", "communication", "ncclDevKernel_AllGather_RING_LL"] == [rows[0][0], rows[0][4], rows[0][5]]
    page = (out / "trace_report.html").read_text()
    top = page[page.index("Top kernels across traces") :]
    assert "<th>rank</th><th>kernel</th>" in top
    assert '<td class="num">1</td><td>ncclDevKernel_AllGather_RING_LL</td>' in top


def test_nccl_outputs_match_tracelens(tmp_path, monkeypatch):
    """Each rank's TraceLens-named files diffed against what TraceLens wrote for the same trace,
    its collective analysis included. TraceLens, given one file, numbers its rank 0; magpie's
    `rank` column is the trace's own."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "no-calibration"))  # the published peaks, as TraceLens's
    analyze_traces(NCCL, tmp_path / "out", arch_name="H200")
    for rank, name in enumerate(NCCL_RANKS):
        label = name.removesuffix(".json.gz")
        ours = {p.stem: p for p in (tmp_path / "out" / "tracelens" / label).glob("*.csv")}  # gpu_timeline's too
        theirs = {p.name.removesuffix(".csv.gz"): p for p in (TRACELENS_NCCL / label).glob("*.csv.gz")}
        assert sorted(ours) == sorted(theirs)
        diffs = [
            d
            for table in sorted(theirs)
            for d in diff_file(label, table, ours[table], theirs[table])
            if not any(known.match(d) for known in MAGPIE_IS_RIGHT)
        ]
        assert [(d.file, d.column, d.ours, d.theirs) for d in diffs] == [
            ("coll_analysis", "rank", str(rank), "0")
        ] * 3 * rank, "\n".join(map(str, diffs))
        with open(tmp_path / "out" / "tracelens" / label / "coll_analysis.csv") as handle:
            collectives = {
                r["Collective name"]: (
                    r["rank"],
                    r["In msg size (MB)_first"],
                    r["Out msg size (MB)_first"],
                    r["operation_count"],
                )
                for r in csv.DictReader(handle)
            }
        # bf16 shards of 512 x 4096 gathered into 1024 x 4096, and 1024 x 4096 partial sums reduced
        assert collectives == {
            "_allgather_base": (str(rank), "4.0", "8.0", "4"),
            "allreduce": (str(rank), "8.0", "8.0", "4"),
            "_reduce_scatter_base": (str(rank), "8.0", "4.0", "4"),
        }


def test_each_collective_kernel_has_its_own_record_read_in_batches_or_whole(monkeypatch):
    """What PyTorch recorded of each collective is read in a second pass (only of a trace with
    collectives); batch by batch or whole, each record is its own kernel's."""
    from magpie.traces import ingest

    monkeypatch.setattr(ingest, "_CHUNK", 4096)
    streamed = load_trace(NCCL / NCCL_RANKS[0])
    monkeypatch.setattr(ingest, "_stream", lambda *_: None)  # the whole-document path
    whole = load_trace(NCCL / NCCL_RANKS[0])
    assert streamed.collectives == whole.collectives and len(streamed.collectives) == 12
    kernel_of = {"_allgather_base": "AllGather", "allreduce": "AllReduce", "_reduce_scatter_base": "ReduceScatter"}
    for kernel, record in streamed.collectives:
        assert f"ncclDevKernel_{kernel_of[record[2]]}_" in kernel.name
        assert record[:2] == ("0", "[0, 1]") and record[3:5] == (2, "BFloat16")
    assert load_trace(FIXTURES / "traces" / "h200" / "train_step_mlp.json.gz").collectives == []


def test_a_rank_is_the_gpu_it_ran_on_though_its_process_saw_others(tmp_path):
    """On a host of mixed GPUs, rank 1's trace names GPU 0 first: its device, peaks and per-stage
    timelines are GPU 1's."""
    doc = json.load(gzip.open(NCCL / NCCL_RANKS[1]))
    doc["deviceProperties"][0]["name"] = "NVIDIA H100 80GB HBM3"
    folder = tmp_path / "traces"
    folder.mkdir()
    with gzip.open(folder / NCCL_RANKS[1], "wt") as handle:
        json.dump(doc, handle)
    summary = analyze_traces(folder, tmp_path / "out", analysis_mode="inference")
    assert summary["traces"][0]["device"] == "NVIDIA H200"
    assert summary["outputs"]["kernel_roofline_simple"][0]["arch"] == "H200"
    stage = tmp_path / "out" / "tracelens" / "nccl_tp2_rank1" / "decode"
    assert (stage / "gpu_timeline.csv").is_file() and not list(stage.glob("gpu_timeline_dev*.csv"))


def test_the_nccl_capture_is_in_no_declared_trace_set():
    """The H200 trace set (magpie.toml, the TraceLens parity and report tests) is tests/fixtures/traces/h200:
    the two ranks in it, or in a folder above them that a set reads (recursively), would be extra
    traces without a TraceLens reference."""
    declared = [(REPO / t["dir"]).resolve() for t in tomllib.loads((REPO / "magpie.toml").read_text())["traces"]]
    assert FIXTURES / "traces" / "h200" in declared
    assert not [d for d in declared if d == NCCL or d in NCCL.parents]
    assert not list((FIXTURES / "traces" / "h200").rglob("nccl_*"))
