"""Why magpie's events timer reads the bf16 GEMM slower than do_bench and ncu (run on the
H200): the same GEMM under variants of the per-sample procedure, taking turns.
Usage: python bench/gemm_timer_variants.py OUT.json
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import torch
import triton.testing

from magpie.harness.timing import CudaTimer, nvml_snapshot

N = 4096


def main(argv: list[str]) -> int:
    a = torch.randn(N, N, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(N, N, device="cuda", dtype=torch.bfloat16)
    fn = lambda: a @ b  # noqa: E731
    timer = CudaTimer("cuda")
    dirty = torch.empty(4 * timer.l2_bytes // 4, dtype=torch.int32, device="cuda")

    def run(flush, sync_every: int, budget_s: float = 0.3, idle_s: float = 0.0) -> list[float]:
        samples, pending = [], []
        deadline = time.perf_counter() + budget_s
        while time.perf_counter() < deadline:
            if idle_s:
                time.sleep(idle_s)
            flush()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            pending.append((start, end))
            if len(pending) >= sync_every:
                torch.cuda.synchronize()
                samples += [s.elapsed_time(e) * 1000 for s, e in pending]
                pending = []
        torch.cuda.synchronize()
        samples += [s.elapsed_time(e) * 1000 for s, e in pending]
        return samples

    variants = {
        "magpie timer (read flush, sync each)": lambda: timer.measure(lambda: fn(), [()], 300, 100_000, 0, "events"),
        "read flush, sync each": lambda: run(timer._flush_l2, 1),
        "read flush, sync every 50": lambda: run(timer._flush_l2, 50),
        "write flush, sync each": lambda: run(dirty.zero_, 1),
        "no flush, sync each": lambda: run(lambda: None, 1),
        "no flush, sync every 50 (back to back)": lambda: run(lambda: None, 50),
        "no flush, sync each, 1 ms idle before each": lambda: run(lambda: None, 1, idle_s=0.001),
        "read flush, sync each, 1 ms idle before each": lambda: run(timer._flush_l2, 1, idle_s=0.001),
        "do_bench": None,
    }
    results = {name: [] for name in variants}
    for _ in range(3):
        for name, variant in variants.items():
            if variant is None:
                value = triton.testing.do_bench(fn, warmup=50, rep=300, return_mode="median") * 1000
            else:
                samples = [s / 1000 for s in variant()] if name.startswith("magpie") else variant()
                value = statistics.median(samples)
            results[name].append({"median_us": value, "nvml": nvml_snapshot(0)})
    print(json.dumps({k: [round(r["median_us"], 1) for r in v] for k, v in results.items()}, indent=1))
    with open(argv[0], "w") as handle:
        json.dump(results, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
