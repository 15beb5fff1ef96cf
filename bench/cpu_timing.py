"""CPU timing from outside the worker (harness/batches.py): how close it reads to the same
kernel timed in a process of its own, what its speedups say for work of known ratios, and
whether a busy machine moves them.

A project of four implementations of one kernel (2 * a @ b, 192x192 fp32): the baseline (two
products), an identical copy (1x), one product (about 2x) and four (about 0.5x). Each
is built `--repeats` times on a quiet machine and again with as many CPU hogs as cores; the
reference is torch.utils.benchmark's blocked autorange in a fresh process, threads=1.

Usage: python bench/cpu_timing.py [--repeats 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SPEC = """
import torch


def make_inputs(shape, dtype, generator):
    return (torch.randn(shape, generator=generator), torch.randn(shape, generator=generator))


def reference(a, b):
    return 2 * (a @ b)
"""
# the same result from two products (the baseline and its copy), one (half the work) and four
KERNELS = {
    "baseline": "def kernel(a, b):\n    return a @ b + a @ b\n",
    "same": "def kernel(a, b):\n    return a @ b + a @ b\n",
    "half": "def kernel(a, b):\n    return 2 * (a @ b)\n",
    "twice": "def kernel(a, b):\n    return (a @ b + a @ b + a @ b + a @ b) / 2\n",
}
SHAPE = [192, 192]


def write_project(root: Path) -> None:
    (root / "spec.py").write_text(SPEC)
    for name, body in KERNELS.items():
        (root / f"{name}.py").write_text("import torch\n\n\n" + body)
    candidates = "".join(
        f'[[kernel.candidates]]\nid = "{n}"\nsource = "{n}.py"\n\n' for n in KERNELS if n != "baseline"
    )
    (root / "magpie.toml").write_text(f"""[project]
name = "cpu_timing"
device = "cpu"

[defaults]
trials = 1

[defaults.timing]
warmup_ms = 20
budget_ms = 300
rounds = 5

[[kernel]]
id = "chain"
type = "pytorch"
entry = "kernel"

[kernel.baseline]
id = "baseline"
source = "baseline.py"

{candidates}[[kernel.testcases]]
spec = "spec.py"
shapes = [{SHAPE}]
rtol = 1e-4
atol = 1e-3
""")


def in_process_us(root: Path, name: str) -> float:
    code = f"""
import sys, torch, torch.utils.benchmark as tb
torch.set_num_threads(1)
sys.path.insert(0, {str(root)!r})
from {name} import kernel
g = torch.Generator().manual_seed(0)
a, b = torch.randn({SHAPE}, generator=g), torch.randn({SHAPE}, generator=g)
m = tb.Timer("kernel(a, b)", globals={{"kernel": kernel, "a": a, "b": b}}).blocked_autorange(min_run_time=1.0)
print(m.median * 1e6)
"""
    return float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)


def build(root: Path) -> tuple[dict, float]:
    shutil.rmtree(root / "workspaces", ignore_errors=True)
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "magpie", "build", "-j", "1"], cwd=root, check=True, capture_output=True)
    wall = time.monotonic() - started
    report = json.loads((root / "workspaces/reports/chain/compare_report.json").read_text())
    return {row["implementation"]: row for row in report["results"]}, wall


def run(root: Path, repeats: int, hogs: int) -> dict:
    hogs_running = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(hogs)]
    try:
        runs = []
        for _ in range(repeats):
            rows, wall = build(root)
            runs.append(
                {
                    "build_s": round(wall, 2),
                    "rows": {
                        name: {
                            "median_us": row["performance_result"]["median_us"],
                            "speedup": (row.get("speedup") or {}).get("value"),
                            "ci": [(row.get("speedup") or {}).get("ci_low"), (row.get("speedup") or {}).get("ci_high")],
                            "verdict": (row.get("speedup") or {}).get("verdict"),
                            "calls": row["performance_result"].get("calls"),
                            "batches": row["performance_result"].get("batches"),
                        }
                        for name, row in rows.items()
                        if row.get("performance_result")
                    },
                }
            )
        return {"hogs": hogs, "runs": runs}
    finally:
        for hog in hogs_running:
            hog.kill()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="write the figures here too")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="magpie-cpu-timing-"))
    try:
        write_project(root)
        reference = {name: in_process_us(root, name) for name in KERNELS}
        out = {
            "date": time.strftime("%Y-%m-%d"),
            "cores": os.cpu_count(),
            "reference_us": reference,
            "quiet": run(root, args.repeats, 0),
            "busy": run(root, args.repeats, os.cpu_count() or 1),
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)
    for label in ("quiet", "busy"):
        print(f"{label} ({out[label]['hogs']} CPU hogs)")
        for name in KERNELS:
            medians = [r["rows"][name]["median_us"] for r in out[label]["runs"]]
            speedups = [r["rows"][name]["speedup"] for r in out[label]["runs"]]
            verdicts = [r["rows"][name]["verdict"] for r in out[label]["runs"]]
            print(
                f"  {name:9s} magpie {statistics.median(medians):9.1f} µs (in-process {reference[name]:9.1f})  "
                f"speedups {', '.join(f'{s:.3f}' for s in speedups if s)}  {verdicts}"
            )
        print(f"  build s: {[r['build_s'] for r in out[label]['runs']]}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
