"""The timer's integrity check on honest kernels from about 1 µs to 100 ms (run on a GPU).

Builds one magpie project of honest kernels, each a size point timed through the real path
(evaluator, sandboxed workers, interleaved rounds, the wall-clock cross-check) at the default
budget: an elementwise scale-add as PyTorch (two kernels), Triton and CUDA C++ over 2^10 to
2^28 floats; bf16 GEMMs through torch.mm from 2048 to 16384; fp32 GEMMs against a naive
CUDA C++ one (2048 and 4096: the 100 ms end); Python loops of 200 and 4,000 small PyTorch
ops (launch-bound). With `--swap`, every kernel under about 2 ms is timed in the mode its
probe would not choose (graph where auto picks events, and the reverse), so both modes
cover the range.

Writes SWEEP.json: per row, the verdict, the mode and why, the median, and the wall-clock
account that the integrity check judged (`wall_account`); tests/test_timer_sweep.py replays
the check on the committed copy (tests/fixtures/h200/timer_sweep.json).
Usage: python bench/timer_sweep.py OUT.json [--swap] [--vouched] [--only PREFIXES] [--jobs N]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ELEMENTWISE_LOG2 = (10, 14, 18, 20, 21, 22, 23, 24, 26, 28)
BF16_GEMM = (2048, 4096, 8192, 16384)
FP32_GEMM = (2048, 4096)
LOOPS = (200, 4000)

SCALE_ADD_SPEC = """
import torch


def make_inputs(shape, dtype, generator):
    return (torch.randn(shape, generator=generator, dtype=torch.float32).to(dtype),)


def reference(x):
    return (x.double() * 2.0 + 1.0).to(x.dtype)
"""
SCALE_ADD_TORCH = """
import torch


def kernel(x):
    return torch.mul(x, 2.0).add_(1.0)
"""
SCALE_ADD_TRITON = """
import torch
import triton
import triton.language as tl


@triton.jit
def _scale_add(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(y_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * 2.0 + 1.0, mask=mask)


def kernel(x):
    y = torch.empty_like(x)
    n = x.numel()
    _scale_add[(triton.cdiv(n, 1024),)](x, y, n, BLOCK=1024)
    return y
"""
SCALE_ADD_CUDA = """
#include <cstdint>
#include <cuda_runtime.h>

__global__ void scale_add_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
    int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    if (i < n) y[i] = x[i] * 2.0f + 1.0f;
}

extern "C" int kernel(const float* x, float* y, int64_t n, cudaStream_t stream) {
    scale_add_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(x, y, n);
    return static_cast<int>(cudaGetLastError());
}
"""
GEMM_SPEC = """
import torch


def make_inputs(shape, dtype, generator):
    m, n, k = shape
    a = torch.randn(m, k, generator=generator, dtype=torch.float32) / k ** 0.5
    b = torch.randn(k, n, generator=generator, dtype=torch.float32)
    return (a.to(dtype), b.to(dtype))


def reference(a, b):
    return (a.double() @ b.double()).to(a.dtype)
"""
GEMM_TORCH = """
import torch

torch.backends.cuda.matmul.allow_tf32 = False


def kernel(a, b):
    return torch.mm(a, b)
"""
GEMM_TORCH_MATMUL = """
import torch

torch.backends.cuda.matmul.allow_tf32 = False


def kernel(a, b):
    return a @ b
"""
GEMM_NAIVE_CUDA = """
#include <cstdint>
#include <cuda_runtime.h>

// One thread per output element, no tiling: an honest, slow GEMM.
__global__ void naive_gemm(const float* a, const float* b, float* c, int64_t m, int64_t n, int64_t k) {
    int64_t row = blockIdx.y * static_cast<int64_t>(blockDim.y) + threadIdx.y;
    int64_t col = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    if (row >= m || col >= n) return;
    float total = 0.f;
    for (int64_t i = 0; i < k; ++i) total += a[row * k + i] * b[i * n + col];
    c[row * n + col] = total;
}

extern "C" int kernel(const float* a, const float* b, float* c, int64_t m, int64_t k, int64_t k2, int64_t n,
                      cudaStream_t stream) {
    dim3 block(16, 16);
    dim3 grid(static_cast<unsigned>((n + 15) / 16), static_cast<unsigned>((m + 15) / 16));
    naive_gemm<<<grid, block, 0, stream>>>(a, b, c, m, n, k);
    return static_cast<int>(cudaGetLastError());
}
"""
LOOP_SPEC = """
import torch


def make_inputs(shape, dtype, generator):
    return (torch.rand(shape, generator=generator, dtype=torch.float32).to(dtype),)


def reference(x):
    y = x.double()
    for _ in range({steps}):
        y = y * 0.999 + 0.001
    return y.to(x.dtype)
"""
LOOP_TORCH = """
def kernel(x):
    y = x
    for _ in range({steps}):
        y = y * 0.999 + 0.001
    return y
"""


def kernel_block(
    kid: str,
    ktype: str,
    baseline: tuple,
    candidates: list,
    spec: str,
    shape: list,
    dtype: str,
    rtol: float,
    atol: float,
    mode: str | None,
) -> str:
    def impl(section, iid, itype, source):
        return f'[{section}]\nid = "{iid}"\ntype = "{itype}"\nsource = "{source}"\n'

    text = f'[[kernel]]\nid = "{kid}"\ntype = "{ktype}"\nentry = "kernel"\nrtol = {rtol}\natol = {atol}\n'
    if mode:
        text += f'[kernel.timing]\nmode = "{mode}"\n'
    text += impl("kernel.baseline", *baseline)
    for candidate in candidates:
        text += impl("[kernel.candidates]", *candidate)
    text += f'[[kernel.testcases]]\nspec = "{spec}"\nshapes = [{shape}]\ndtypes = ["{dtype}"]\n\n'
    return text


def write_project(root: Path, swap: bool, vouched: bool = False, only: tuple[str, ...] = ()) -> None:
    files = {
        "scale_add/spec.py": SCALE_ADD_SPEC,
        "scale_add/torch_impl.py": SCALE_ADD_TORCH,
        "scale_add/triton_impl.py": SCALE_ADD_TRITON,
        "scale_add/cuda_impl.cu": SCALE_ADD_CUDA,
        "gemm/spec.py": GEMM_SPEC,
        "gemm/torch_mm.py": GEMM_TORCH,
        "gemm/torch_matmul.py": GEMM_TORCH_MATMUL,
        "gemm/naive.cu": GEMM_NAIVE_CUDA,
    }
    for steps in LOOPS:
        files[f"loop{steps}/spec.py"] = LOOP_SPEC.format(steps=steps)
        files[f"loop{steps}/a.py"] = LOOP_TORCH.format(steps=steps)
        files[f"loop{steps}/b.py"] = LOOP_TORCH.format(steps=steps)
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(textwrap.dedent(text).lstrip())

    def swapped(auto_graph: bool) -> str | None:
        return ("events" if auto_graph else "graph") if swap else None

    blocks = []
    for log2 in ELEMENTWISE_LOG2:
        if swap and log2 > 26:
            continue  # over 2 ms as 20-call graphs: the swapped sweep keeps to what a graph would time
        blocks.append(
            kernel_block(
                f"scale_add_2p{log2}",
                "pytorch",
                ("torch", "pytorch", "scale_add/torch_impl.py"),
                [("triton", "triton", "scale_add/triton_impl.py"), ("cuda", "cuda", "scale_add/cuda_impl.cu")],
                "scale_add/spec.py",
                f"[{2**log2}]",
                "float32",
                1e-6,
                1e-6,
                swapped(log2 <= 21),
            )
        )
    for size in BF16_GEMM:
        if swap and size > 8192:
            continue
        blocks.append(
            kernel_block(
                f"gemm_bf16_{size}",
                "pytorch",
                ("mm", "pytorch", "gemm/torch_mm.py"),
                [("matmul", "pytorch", "gemm/torch_matmul.py")],
                "gemm/spec.py",
                f"[{size}, {size}, {size}]",
                "bfloat16",
                2e-2,
                2e-2,
                swapped(False),
            )
        )
    for size in FP32_GEMM:
        if swap:
            continue  # 5-100 ms a call
        blocks.append(
            kernel_block(
                f"gemm_fp32_{size}",
                "pytorch",
                ("mm", "pytorch", "gemm/torch_mm.py"),
                [("naive", "cuda", "gemm/naive.cu")],
                "gemm/spec.py",
                f"[{size}, {size}, {size}]",
                "float32",
                1e-3,
                1e-3,
                None,
            )
        )
    for steps in LOOPS:
        if swap and steps > 200:
            continue
        blocks.append(
            kernel_block(
                f"loop{steps}",
                "pytorch",
                ("a", "pytorch", f"loop{steps}/a.py"),
                [("b", "pytorch", f"loop{steps}/b.py")],
                f"loop{steps}/spec.py",
                "[4096]",
                "float32",
                1e-3,
                1e-3,
                swapped(False),
            )
        )
    if only:
        blocks = [b for b in blocks if any(b.startswith(f'[[kernel]]\nid = "{prefix}') for prefix in only)]
    header = (
        '[project]\nname = "timer-sweep"\ndevice = "cuda"\n\n[defaults]\ntrials = 1\ntimeout_s = 300\n\n'
        f"[defaults.timing]\nvouched = {str(vouched).lower()}\n\n"
        '[[rule]]\nname = "profile"\ndevices = []\n\n'
    )  # counters are not what this measures
    (root / "magpie.toml").write_text(header + "\n".join(blocks))


def summarise(role: dict | None) -> dict | None:
    if not role:
        return None
    keys = (
        "median_us",
        "p20_us",
        "p80_us",
        "n",
        "unexplained_us_per_call",
        "unexplained_limit_us",
        "wall_coverage",
        "wall_account",
        # vouched measurements (`--vouched`): how the evaluator's clock was read
        "calls",
        "round_trip_us",
        "calibration_us",
        "harness_us_per_call",
        "batch_phases",
        "device_batches",
    )
    return {
        **{k: role.get(k) for k in keys},
        "mode": (role.get("timer_info") or {}).get("mode"),
        "rounds": [
            {k: info.get(k) for k in ("loop_wall_ms", "request_wall_ms")} for info in role.get("rounds_info") or []
        ],
        "host_wall_median_us": (role.get("timer_info") or {}).get("host_wall_median_us"),
    }


def collect_store(root: Path) -> list[dict]:
    """Rows from the timing results in the store: what a build cut off before its reports had
    measured (every timed implementation passed its correctness first)."""
    rows = []
    for path in sorted((root / "workspaces/store").glob("*/*/result.json")):
        result = json.loads(path.read_text())
        if not result.get("task", "").startswith("timing:"):
            continue
        kernel, implementation = result["task"].split(":", 1)[1].split("/", 1)
        rows.append(
            {
                "kernel": kernel,
                "implementation": implementation,
                "is_baseline": "speedup" not in result,
                "correctness_state": "SUCCESS",
                "performance_state": result["performance_state"],
                "errors": result["errors"],
                "warnings": result["warnings"],
                "timing_method": result.get("timing_method"),
                "candidate": summarise(result.get("performance_result")),
                "baseline": summarise(result.get("baseline_result")),
                "speedup": result.get("speedup"),
            }
        )
    return sorted(rows, key=lambda r: (r["kernel"], r["implementation"]))


def collect(root: Path) -> list[dict]:
    rows = []
    for path in sorted((root / "workspaces/reports").glob("*/compare_report.json")):
        report = json.loads(path.read_text())
        for row in report["results"]:
            rows.append(
                {
                    "kernel": report["kernel"],
                    "implementation": row["implementation"],
                    "is_baseline": row["is_baseline"],
                    "correctness_state": row["correctness_state"],
                    "performance_state": row["performance_state"],
                    "errors": row["errors"],
                    "warnings": row["warnings"],
                    "timing_method": row.get("timing_method"),
                    "candidate": summarise(row.get("performance_result")),
                    "baseline": summarise(row.get("baseline_result")),
                    "speedup": row.get("speedup"),
                }
            )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--swap", action="store_true", help="time each kernel in the mode auto would not choose")
    parser.add_argument("--vouched", action="store_true", help="time with timing.vouched (the evaluator's clock)")
    parser.add_argument("--jobs", type=int, default=8)
    parser.add_argument("--timeout", type=float, default=280, help="seconds; the rows built by then are kept")
    parser.add_argument("--only", default="", help="comma-separated kernel id prefixes (scale_add_2p2,gemm_bf16)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="magpie-sweep-") as tmp:
        root = Path(tmp)
        write_project(root, args.swap, args.vouched, tuple(p for p in args.only.split(",") if p))
        if os.environ.get("SWEEP_DRY_RUN"):  # the graph it would build, on any machine
            return subprocess.run([sys.executable, "-m", "magpie", "build", "-n"], cwd=root).returncode
        started = time.monotonic()
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "magpie", "build", "--plain", "-j", str(args.jobs)],
                cwd=root,
                capture_output=True,
                text=True,
                timeout=args.timeout,
            )
        except subprocess.TimeoutExpired as err:
            proc = subprocess.CompletedProcess(err.cmd, -9, err.stdout or "", err.stderr or "")
        wall = time.monotonic() - started
        rows = collect(root) or collect_store(root)
    false = [r for r in rows if r["correctness_state"] == "SUCCESS" and r["performance_state"] != "SUCCESS"]
    Path(args.out).write_text(
        json.dumps(
            {
                "swap": args.swap,
                "vouched": args.vouched,
                "build_wall_s": round(wall, 1),
                "build_exit": proc.returncode,
                "rows": rows,
            },
            indent=1,
        )
    )
    for r in rows:
        c = r["candidate"] or {}
        print(
            f"{r['kernel']:>18} {r['implementation']:>8} {r['correctness_state']:>8} {r['performance_state']:>8} "
            f"{c.get('mode') or '-':>6} {c.get('median_us') or 0:>12.2f} µs  unexplained "
            f"{c.get('unexplained_us_per_call') or 0:8.2f}/{c.get('unexplained_limit_us') or 0:8.2f}  "
            f"{'; '.join(r['errors'])[:160]}"
        )
    print(f"build exit {proc.returncode} in {wall:.0f} s; {len(false)} correct rows not timed")
    if proc.returncode:
        print(str(proc.stdout)[-3000:], str(proc.stderr)[-3000:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
