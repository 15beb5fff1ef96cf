"""Multi-rank trace analysis on a real two-rank capture: bench/capture_traces.py's
tp2_collectives run on the CPU, where it falls back to gloo (tests/fixtures/traces/cpu_gloo_tp2,
capture_info.json beside the traces). Gloo's collectives are CPU ops and annotations, not GPU
activity: the collective timeline counts communication kernels by name (nccl, rccl, all_reduce...),
so what it makes of them waits for the same program's NCCL capture on the 2-GPU host; here, the
ranks, their collectives and their per-rank outputs."""

import csv
import gzip
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

from conftest import FIXTURES, REPO, magpie
from magpie.traces.gap import COLUMNS
from magpie.traces.ingest import load_trace

GLOO = FIXTURES / "traces" / "cpu_gloo_tp2"
RANKS = ["gloo_tp2_rank0.json.gz", "gloo_tp2_rank1.json.gz"]
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
COLLECTIVES = ("c10d::_allgather_base_", "c10d::allreduce_", "c10d::_reduce_scatter_base_")


def _shape(path: Path) -> dict:
    """What a rank's trace is made of, timings aside: its distributed facts, op and annotation names."""
    doc = json.load(gzip.open(path))
    trace = load_trace(path)
    return {"distributed": {k: doc["distributedInfo"][k] for k in ("backend", "rank", "world_size")},
            "multicast_off": doc["multicast_off"], "ops": Counter(op.name for op in trace.cpu_ops),
            "annotations": Counter(name for name, *_ in trace.annotations)}


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
    proc = magpie("benchmark", "--trace-dir", GLOO, "-o", tmp_path / "out", cwd=tmp_path, check=0)
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
    subprocess.run([sys.executable, "bench/capture_traces.py", str(tmp_path), "tp2_collectives"], cwd=REPO,
                   check=True, capture_output=True, timeout=300, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["capture_info.json", *RANKS]
    assert json.loads((tmp_path / "capture_info.json").read_text())["captures"] == ["tp2_collectives"]
    for name in RANKS:
        assert _shape(tmp_path / name) == _shape(GLOO / name)
