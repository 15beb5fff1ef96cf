"""GPU timing fidelity (run on the H200): magpie's CUDA timer against ncu's
gpu__time_duration and triton.testing.do_bench for the same kernels, in one run.

- bandwidth-bound kernels (x * 2 + y over 64 Mi and 256 Mi floats) and GEMMs (bf16 4096^3,
  bf16 4096x4096x2048, fp32 2048^3 on the SIMT pipes), all well over 50 µs: medians side by
  side, and magpie's repeat CV;
- a 1-element kernel: magpie's chosen mode against CUDA-graph replay and plain events;
- wall time of `magpie compare` on 8 Triton candidates against their timing budgets.
Usage: python bench/gpu_fidelity.py --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import torch
import triton
import triton.testing

from magpie.harness.timing import GRAPH_THRESHOLD_US, CudaTimer, nvml_snapshot
from magpie.roofline.ncu import TENSOR, parse_raw_csv

N_ELEMENTS = 64 * 2**20
LARGE_ELEMENTS = 256 * 2**20
GEMM_N = 4096
ROUNDS = 3


def kernels():
    x = torch.randn(N_ELEMENTS, device="cuda")
    y = torch.randn(N_ELEMENTS, device="cuda")
    a = torch.randn(GEMM_N, GEMM_N, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(GEMM_N, GEMM_N, device="cuda", dtype=torch.bfloat16)
    one = torch.randn(1, device="cuda")
    big_x = torch.randn(LARGE_ELEMENTS, device="cuda")
    big_y = torch.randn(LARGE_ELEMENTS, device="cuda")
    # Off the power limit: a short-K tensor-core GEMM and one on the SIMT pipes (TF32 off).
    short_a = torch.randn(GEMM_N, GEMM_N // 2, device="cuda", dtype=torch.bfloat16)
    short_b = torch.randn(GEMM_N // 2, GEMM_N, device="cuda", dtype=torch.bfloat16)
    f32 = torch.randn(GEMM_N // 2, GEMM_N // 2, device="cuda")
    torch.backends.cuda.matmul.allow_tf32 = False
    return {
        "bandwidth (x*2+y, 64Mi fp32)": (lambda: torch.add(y, x, alpha=2.0), 3 * 4 * N_ELEMENTS, 0),
        "bandwidth large (x*2+y, 256Mi fp32)": (lambda: torch.add(big_y, big_x, alpha=2.0), 3 * 4 * LARGE_ELEMENTS, 0),
        "gemm (bf16 4096^3)": (lambda: a @ b, 3 * 2 * GEMM_N**2, 2 * GEMM_N**3),
        "gemm short-k (bf16 4096x4096x2048)": (lambda: short_a @ short_b, 2 * (GEMM_N**2 + GEMM_N**2), GEMM_N**3),
        "gemm fp32 (2048^3, SIMT)": (lambda: f32 @ f32, 3 * 4 * (GEMM_N // 2) ** 2, 2 * (GEMM_N // 2) ** 3),
        "one element (x+1)": (lambda: one + 1, 8, 1),
    }


def magpie_median_us(timer: CudaTimer, fn, mode: str, budget_ms: float = 300) -> tuple[float, list[int]]:
    timer.warmup(lambda: fn(), [()], 50)
    samples = timer.measure(lambda: fn(), [()], budget_ms, 100_000, 0, mode=mode)
    return statistics.median(samples) / 1000, samples


def ncu_median_us(name: str, out: Path) -> tuple[float | None, float | None]:
    script = out / "ncu_target.py"
    script.write_text(
        textwrap.dedent(f"""
        import sys, torch
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from gpu_fidelity import kernels
        fn = kernels()[{name!r}][0]
        fn(); torch.cuda.synchronize()
        torch.cuda.nvtx.range_push("magpie_profile")
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()
    """)
    )
    proc = subprocess.run(
        [
            "ncu",
            "--csv",
            "--page",
            "raw",
            "--clock-control",
            "none",
            "--nvtx",
            "--nvtx-include",
            "magpie_profile/",
            "--metrics",
            ",".join(["gpu__time_duration.sum", *TENSOR["bf16_tensor"]]),
            sys.executable,
            str(script),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    (out / f"ncu_{abs(hash(name))}.csv").write_text(proc.stdout)
    try:
        rows = parse_raw_csv(proc.stdout)
    except ValueError:
        print(proc.stderr[-2000:])
        return None, None
    durations = [
        r["metrics"]["gpu__time_duration.sum"] / 1000 for r in rows if "gpu__time_duration.sum" in r["metrics"]
    ]
    tensor_ops = [sum(r["metrics"].get(n, 0.0) for n in TENSOR["bf16_tensor"]) for r in rows]
    return (statistics.median(durations) if durations else None), (statistics.median(tensor_ops) if rows else None)


def write_compare8(root: Path) -> list[str]:
    """The 8-candidate project: x * 2 + y in PyTorch (the baseline) and as Triton kernels of 8
    block sizes; returns the candidates' file names."""
    shutil.rmtree(root, ignore_errors=True)  # a machine kept warm between calls keeps /tmp: no stale store or cache
    root.mkdir(parents=True)
    (root / "spec.py").write_text(
        textwrap.dedent("""
        import torch
        def make_inputs(shape, dtype, generator):
            return tuple(torch.randn(shape, generator=generator, dtype=dtype) for _ in range(2))
        def reference(x, y):
            return x * 2 + y
    """)
    )
    (root / "torch_ref.py").write_text("def f(x, y):\n    return x * 2 + y\n")
    files = []
    for block in [128, 256, 512, 1024, 2048, 4096, 8192, 16384]:
        path = root / f"triton_b{block}.py"
        path.write_text(
            textwrap.dedent(f"""
            import torch, triton, triton.language as tl
            @triton.jit
            def _k(x, y, o, n, B: tl.constexpr):
                off = tl.program_id(0) * B + tl.arange(0, B)
                m = off < n
                tl.store(o + off, tl.load(x + off, mask=m) * 2 + tl.load(y + off, mask=m), mask=m)
            def f(x, y):
                o = torch.empty_like(x)
                _k[(triton.cdiv(x.numel(), {block}),)](x, y, o, x.numel(), B={block})
                return o
        """)
        )
        files.append(path.name)
    return files


def throughput(out: Path, device: str = "cuda") -> dict:
    """On the CPU (a smoke test of this script: Triton interpreted) the vectors are small."""
    root = out / "compare8"
    files = write_compare8(root)
    budget_ms = 300
    # First with an empty Triton cache (every kernel compiled), then again into a fresh
    # artifact store with that cache warm: the difference is compile and JIT time.
    # Then twice with MAGPIE_KEEP_WARM_S: the first starts a zygote that outlives it, the
    # second (the same candidates, a fresh store) finds it, and its parked processes, warm.
    env = {**os.environ, "TRITON_CACHE_DIR": str(root / "triton_cache")}
    kept = {**env, "MAGPIE_KEEP_WARM_S": "60"}
    plan = {"cold": env, "warm": env, "kept_first": kept, "kept_again": kept}
    shape = "16777216" if device.startswith("cuda") else "4096"
    runs = {
        name: compare_run(root, files, budget_ms, f"out_{name}", run_env, device, shape)
        for name, run_env in plan.items()
    }
    if any("error" in run for run in runs.values()):
        return runs
    budgets_s = runs["warm"]["timing_budgets_s"]
    return {
        "budget_ms": budget_ms,
        "timing_budgets_s": budgets_s,
        **{f"wall_{name}_s": run["wall_s"] for name, run in runs.items()},
        "compile_jit_s": runs["cold"]["wall_s"] - runs["warm"]["wall_s"],
        "ratio_warm": runs["warm"]["wall_s"] / budgets_s,
        "ratio_kept_again": runs["kept_again"]["wall_s"] / budgets_s,
        "runs": runs,
    }


def compare_run(
    root: Path,
    files: list[str],
    budget_ms: int,
    out_name: str,
    env: dict,
    device: str,
    shape: str,
    start_unix: float | None = None,
    main_timeline: Path | None = None,
) -> dict:
    """One `magpie compare` of the files; `start_unix`: when the wait for its verdict began
    (an edit's), else now; `main_timeline`: where bench/main_timeline.py writes the command
    process's own timeline."""
    start_unix = start_unix or time.time()
    start = time.monotonic() - (time.time() - start_unix)
    command = [sys.executable, "-m", "magpie"]
    if main_timeline is not None:
        command = [sys.executable, str(Path(__file__).with_name("main_timeline.py")), str(main_timeline), "--"]
        env = {**env, "MAGPIE_TIMELINE_T0": repr(start_unix)}
    proc = subprocess.run(
        [
            *command,
            "compare",
            "torch_ref.py",
            *files,
            "--type",
            "triton",
            "--entry",
            "f",
            "--spec",
            "spec.py",
            "--shapes",
            shape,
            "--budget-ms",
            str(budget_ms),
            "--device",
            device,
            "--no-profile",
            "--json",
            "-o",
            out_name,
        ],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=1200,
        env=env,
    )
    wall = time.monotonic() - start
    if proc.returncode != 0:
        return {"error": proc.stderr[-1500:]}
    report = json.loads(proc.stdout)
    seconds = {"correctness": 0.0, "timing": 0.0}
    others: dict[str, list[float]] = {}  # every other task this command ran: its span
    phases: dict[str, float] = {}
    steps: dict[str, float] = {}  # of the timing tasks' vouched measurements, summed
    round_parts: dict[str, float] = {}  # the same of their rounds
    tasks: dict[str, dict] = {}
    for result in (root / out_name / "workspace/store").glob("*/*/result.json"):
        data = json.loads(result.read_text())
        rule = data.get("task", "").split(":")[0]
        # A store built into before (an edit's rebuild) holds earlier builds' artifacts too:
        # only what this command ran counts.
        if data.get("task_started_unix", 0) < start_unix:
            continue
        if rule not in seconds:
            began = data["task_started_unix"] - start_unix
            others[data["task"]] = [round(began, 3), round(began + data["task_seconds"], 3)]
            continue
        seconds[rule] += data["task_seconds"]
        tasks[data["task"]] = {
            k: data.get(k)
            for k in (
                "task_seconds",
                "phases_s",
                "measurement_steps_s",
                "round_parts_s",
                "first_call_steps_s",
                "worker_steps_s",
                "worker_loads_s",
                "evaluator_start_s",
                "evaluator_park_s",
                "workers_adopted",
                "device_held_s",
            )
        }
        began = data["task_started_unix"] - start_unix
        tasks[data["task"]]["span_s"] = [round(began, 3), round(began + data["task_seconds"], 3)]
        if rule == "timing":
            for phase, value in (data.get("phases_s") or {}).items():
                phases[phase] = phases.get(phase, 0.0) + value
            for step, value in (data.get("measurement_steps_s") or {}).items():
                steps[step] = steps.get(step, 0.0) + value
            for part, value in (data.get("round_parts_s") or {}).items():
                round_parts[part] = round_parts.get(part, 0.0) + value
    timed = len([r for r in report["results"] if r["performance_result"]])
    # Each candidate is timed with the baseline beside it (2 budgets), the baseline alone once.
    budgets_s = (2 * (timed - 1) + 1) * budget_ms / 1000
    held = sum(t["device_held_s"] or 0.0 for t in tasks.values() if t.get("device_held_s") is not None)
    spans = {rule: [t["span_s"] for name, t in tasks.items() if name.startswith(rule)] for rule in seconds}
    # When the build reached each stage, from the command's start.
    timeline = {
        "first_correctness_start": min(s[0] for s in spans["correctness"]),
        "last_correctness_end": max(s[1] for s in spans["correctness"]),
        "first_timing_start": min(s[0] for s in spans["timing"]),
        "last_timing_end": max(s[1] for s in spans["timing"]),
        "exit": wall,
        **{f"{task}_span": span for task, span in others.items()},
    }
    return {
        "wall_s": wall,
        "timeline_s": timeline,
        "timing_tasks_s": seconds["timing"],
        "correctness_tasks_s": seconds["correctness"],
        "timing_phases_s": phases,
        "timing_measurement_steps_s": steps,
        "timing_round_parts_s": round_parts,
        "timing_budgets_s": budgets_s,
        "device_held_alone_s": held,
        "timed": timed,
        "ranking": report["ranking"][:3],
        "tasks": tasks,
        "rows": {
            r["implementation"]: {
                "speedup": r.get("speedup"),
                "performance_state": r["performance_state"],
                "median_us": (r.get("performance_result") or {}).get("median_us"),
                "baseline_median_us": (r.get("baseline_result") or {}).get("median_us"),
                "errors": r["errors"],
                "warnings": r["warnings"],
            }
            for r in report["results"]
        },
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=".")
    parser.add_argument("--parts", default="timers,throughput")
    parser.add_argument("--only", default="", help="time only kernels whose name contains this")
    parser.add_argument("--device", default="cuda", help="cpu: a smoke test of the throughput part")
    args = parser.parse_args()
    parts = args.parts.split(",")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    timer = CudaTimer("cuda") if "timers" in parts else None
    device_name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    results = {
        "device": device_name,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "kernels": {},
    }
    for name, (fn, _nbytes, flops) in kernels().items() if "timers" in parts else ():
        if args.only and not any(part in name for part in args.only.split(",")):
            continue
        timer.warmup(fn, [()], 50)
        probe = timer.probe(fn, [()])
        mode = "graph" if probe < GRAPH_THRESHOLD_US else "events"
        # The tools take turns (magpie, do_bench, magpie, ...) so that a change of clock or
        # power state lands on both; ncu runs before and after in processes of its own.
        ncu_before, tensor_ops = ncu_median_us(name, out)
        rounds = []
        for _ in range(ROUNDS):
            medians = [magpie_median_us(timer, fn, mode)[0] for _ in range(3)]
            magpie_nvml = nvml_snapshot(0)
            do_bench_us = triton.testing.do_bench(fn, warmup=50, rep=300, return_mode="median") * 1000
            rounds.append(
                {
                    "magpie_medians_us": medians,
                    "magpie_nvml": magpie_nvml,
                    "do_bench_us": do_bench_us,
                    "do_bench_nvml": nvml_snapshot(0),
                }
            )
        ncu_after, _ = ncu_median_us(name, out)
        magpie_all = [m for r in rounds for m in r["magpie_medians_us"]]
        row = {
            "mode": mode,
            "magpie_median_us": statistics.median(magpie_all),
            "magpie_repeat_cv": statistics.pstdev(magpie_all) / statistics.fmean(magpie_all),
            "do_bench_median_us": statistics.median(r["do_bench_us"] for r in rounds),
            "ncu_runs_us": [ncu_before, ncu_after],
            "rounds": rounds,
        }
        ncu_runs = [v for v in (ncu_before, ncu_after) if v is not None]
        row["ncu_median_us"] = statistics.median(ncu_runs) if ncu_runs else None
        row["ncu_bf16_tensor_ops_per_call"] = tensor_ops
        row["probe_us"] = probe
        if probe < 50 or "one element" in name:
            other = "events" if mode == "graph" else "graph"
            row[f"{other}_median_us"] = magpie_median_us(timer, fn, other)[0]
            row["do_bench_cudagraph_median_us"] = (
                triton.testing.do_bench_cudagraph(fn, rep=300, return_mode="median") * 1000
            )
        row["flops_per_call"] = flops
        results["kernels"][name] = row
        (out / "fidelity.json").write_text(json.dumps(results, indent=1))
    if "throughput" in parts:
        results["compare_8_triton"] = throughput(out, args.device)
    (out / f"fidelity-{args.parts.replace(',', '-')}.json").write_text(json.dumps(results, indent=1))
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
