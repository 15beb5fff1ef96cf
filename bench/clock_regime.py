"""Clock regime of a power-limited GEMM on a GPU (issue 37.8): a bf16 8192^3 GEMM timed by magpie
(a build of the GEMM and an identical copy: vouched batches, the default) and, in this process,
by triton's do_bench (its default 100 ms loop and a 300 ms one, cold and after 3 s of back-to-back
GEMMs) and by isolated bursts (one GEMM after 10 ms idle, CUDA events), each with NVML's clocks
over its measurement (`magpie.harness.clocks`). What it shows: where each method sits between
boost and the power limit, and so what a "burst" timing (magpie's) reads against a sustained loop.

Usage: python bench/clock_regime.py OUT.json   (on a machine with an NVIDIA GPU)
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import triton.testing

from magpie.harness.clocks import ClockSampler

N = 8192
SUSTAIN_S = 3.0
BURSTS = 50
BURST_IDLE_S = 0.01

PROJECT = """
[project]
name = "clock-regime"
device = "cuda"

[defaults]
trials = 1
timeout_s = 600

[[kernel]]
id = "gemm"
type = "pytorch"
entry = "gemm"
rtol = 1e-2
atol = 1.0

[kernel.baseline]
id = "torch"
source = "gemm.py"

[[kernel.candidates]]
id = "copy"
source = "gemm_copy.py"

[[kernel.testcases]]
spec = "spec.py"
shapes = [[{n}, {n}]]
dtypes = ["bfloat16"]
"""
GEMM = "def gemm(a, b):\n    return a @ b\n"
SPEC = """import torch


def make_inputs(shape, dtype, generator):
    m, k = shape
    a = torch.randn(m, k, generator=generator, dtype=torch.float32).to(dtype)
    b = torch.randn(k, m, generator=generator, dtype=torch.float32).to(dtype)
    return a, b


def reference(a, b):
    return (a.float() @ b.float()).to(a.dtype)
"""


def sampler() -> ClockSampler:
    return ClockSampler.for_device("cuda:0", 0, f"GPU-{torch.cuda.get_device_properties(0).uuid}")


def magpie_build() -> dict:
    """The GEMM and its copy built by magpie: each row's median, its clocks, the copy's speedup."""
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        (root / "magpie.toml").write_text(PROJECT.format(n=N))
        (root / "gemm.py").write_text(GEMM)
        (root / "gemm_copy.py").write_text(GEMM)
        (root / "spec.py").write_text(SPEC)
        started = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-m", "magpie", "build", "--json"], cwd=root, capture_output=True, text=True
        )
        took = time.monotonic() - started
        report_path = root / "workspaces/reports/gemm/compare_report.json"
        if not report_path.exists():
            return {"error": proc.stderr[-4000:] or proc.stdout[-4000:], "exit": proc.returncode}
        report = json.loads(report_path.read_text())
    rows = {}
    for row in report["results"]:
        perf, beside = row.get("performance_result") or {}, row.get("baseline_result") or {}
        rows[row["implementation"]] = {
            "performance_state": row["performance_state"],
            "errors": row["errors"],
            "median_us": perf.get("median_us"),
            "p20_us": perf.get("p20_us"),
            "p80_us": perf.get("p80_us"),
            "n": perf.get("n"),
            "method": perf.get("method"),
            "baseline_beside_median_us": beside.get("median_us"),
            "speedup": row.get("speedup"),
            "clocks": perf.get("clocks"),
        }
    return {"build_s": round(took, 1), "exit": proc.returncode, "rows": rows}


def do_bench(fn, rep_ms: int) -> dict:
    with sampler() as clocks:
        ms = triton.testing.do_bench(fn, warmup=25, rep=rep_ms, return_mode="median")
    return {"median_us": ms * 1000, "rep_ms": rep_ms, "clocks": clocks.regime()}


def bursts(fn) -> dict:
    """One GEMM at a time after BURST_IDLE_S idle, timed by CUDA events: the regime of short batches."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    with sampler() as clocks:
        for _ in range(BURSTS):
            time.sleep(BURST_IDLE_S)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1000)
    return {"median_us": statistics.median(times), "calls": BURSTS, "idle_s": BURST_IDLE_S, "clocks": clocks.regime()}


def sustain(fn) -> dict:
    """GEMMs back to back for SUSTAIN_S: the clock the power limit settles it at."""
    with sampler() as clocks:
        end = time.monotonic() + SUSTAIN_S
        while time.monotonic() < end:
            for _ in range(20):
                fn()
            torch.cuda.synchronize()
    return {"seconds": SUSTAIN_S, "clocks": clocks.regime()}


def main(out: Path) -> None:
    result: dict = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "gemm": f"bf16 {N}^3"}
    result["magpie"] = magpie_build()
    a = torch.randn(N, N, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(N, N, device="cuda", dtype=torch.bfloat16)

    def fn():
        return a @ b

    fn()
    torch.cuda.synchronize()
    time.sleep(2.0)  # the board cools from the build
    result["bursts"] = bursts(fn)
    result["do_bench_100ms"] = do_bench(fn, 100)
    time.sleep(2.0)
    result["do_bench_300ms"] = do_bench(fn, 300)
    result["sustained_warmup"] = sustain(fn)
    result["do_bench_300ms_after_sustained"] = do_bench(fn, 300)
    result["bursts_after_sustained"] = bursts(fn)
    magpie_us = (result["magpie"].get("rows", {}).get("torch") or {}).get("median_us")
    if magpie_us:
        result["do_bench_300ms_over_magpie"] = result["do_bench_300ms"]["median_us"] / magpie_us
    out.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v.get("median_us") if isinstance(v, dict) else v for k, v in result.items()}, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
