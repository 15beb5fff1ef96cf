"""magpie benchmark: serving benchmarks (a later issue) and, now, gap analysis of existing traces."""

from __future__ import annotations

import json
import os
from pathlib import Path

from magpie.errors import UserError


def add_parser(sub) -> None:
    p = sub.add_parser("benchmark", help="analyze PyTorch profiler traces (--trace-dir): where GPU time goes",
                       description="Gap analysis of existing PyTorch profiler traces (Chrome JSON, .json or "
                                   ".json.gz, one file per rank): the kernels that take the GPU time in a window, "
                                   "by total contribution, with the CPU op and input shapes that launched them, and "
                                   "a GPU timeline per device. Writes gap_analysis/gap_analysis.csv (+ per rank), "
                                   "gap_analysis/gap_analysis.json and gpu_timeline.csv.")
    p.add_argument("--trace-dir", required=False, metavar="DIR", help="folder of trace files")
    p.add_argument("--top-k", type=int, default=20, help="kernels to report (default: %(default)s)")
    p.add_argument("--start-pct", type=float, default=0.0, help="window start, percent of the GPU span")
    p.add_argument("--end-pct", type=float, default=100.0, help="window end, percent of the GPU span")
    p.add_argument("--steady-state", action="store_true",
                   help="window each trace to its repeating steps (numbered annotations), first and last left out")
    p.add_argument("--analysis-mode", choices=("pytorch", "inference"), default="pytorch",
                   help="pytorch: the whole-trace report; inference: also split serving traces into steps and "
                        "stages (prefill, decode, prefilldecode) from the engine's step annotations (vLLM's "
                        "execute_context_..._generation_...; a stage word beside a step number) or the call tree's "
                        "repetition, with per-stage outputs under tracelens/<trace>/<stage>/ (default: %(default)s)")
    p.add_argument("--include-category", default="", help="only these categories, comma separated "
                                                           "(gemm, attention, norm, softmax, reduction, copy, "
                                                           "elementwise, communication, memcpy, memset, other)")
    p.add_argument("--exclude-category", default="", help="leave out these categories, comma separated")
    p.add_argument("--min-duration-us", type=float, default=0.0, help="leave out kernels shorter on average")
    p.add_argument("--arch", help="accelerator for the roofline when the trace does not name one "
                                   "(H100, H200, B200, A100, MI300X, MI325X, MI355X)")
    p.add_argument("--find-kernel-sources", action="store_true",
                   help="map each top kernel to its source (Triton @triton.jit, CUDA/HIP __global__) or library")
    p.add_argument("--kernel-source-repos", nargs="+", default=[], metavar="PATH",
                   help="repositories to index for --find-kernel-sources")
    p.add_argument("-o", "--output-dir", default="magpie_results", help="where the analysis is written")
    p.add_argument("--json", action="store_true", help="print the JSON summary")
    p.set_defaults(run=run)


def _categories(text: str) -> set[str] | None:
    return {c.strip() for c in text.split(",") if c.strip()} or None


def run(args) -> int:
    from magpie.traces.gap import Window
    from magpie.traces.ingest import TraceError
    from magpie.traces.report import analyze_traces

    if not args.trace_dir:
        raise UserError("benchmarking a serving engine is not built yet; analyze existing traces with --trace-dir DIR")
    if not 0 <= args.start_pct < args.end_pct <= 100:
        raise UserError("--start-pct/--end-pct: need 0 <= start < end <= 100")
    if args.top_k < 1:
        raise UserError("--top-k: must be at least 1")
    if args.find_kernel_sources and not args.kernel_source_repos:
        raise UserError("--find-kernel-sources: give the repositories to search with --kernel-source-repos PATH...")
    missing = [r for r in args.kernel_source_repos if not os.path.isdir(r)]
    if missing:
        raise UserError(f"--kernel-source-repos: not a folder: {missing[0]}")
    if args.arch:
        from magpie.roofline.specs import ARCHES, lookup

        if lookup(args.arch) is None:
            raise UserError(f"--arch: unknown accelerator {args.arch!r} (known: {', '.join(a.name for a in ARCHES)})")
    try:
        summary = analyze_traces(args.trace_dir, args.output_dir, top_k=args.top_k,
                                 window=Window(args.start_pct, args.end_pct),
                                 include=_categories(args.include_category), exclude=_categories(args.exclude_category),
                                 min_duration_us=args.min_duration_us, arch_name=args.arch,
                                 source_repos=args.kernel_source_repos if args.find_kernel_sources else None,
                                 steady_state=args.steady_state, analysis_mode=args.analysis_mode)
    except TraceError as err:
        raise UserError(str(err)) from None
    if args.json:
        print(json.dumps(summary, indent=1))
        return 0
    total = summary["total_kernel_time_us"]
    where = "the steady-state windows" if args.steady_state else f"the window [{args.start_pct:g}%, {args.end_pct:g}%]"
    print(f"{len(summary['traces'])} trace(s), {total / 1000:.2f} ms of kernel time in {where}")
    for pick in summary["window_picks"]:
        if pick["picked"]:
            print(f"steady state of {pick['trace']}: {pick['reason']}")
    print(f"{'% Total':>8} {'total us':>10} {'calls':>6} {'category':12} name")
    for row in summary["top"]:
        source = f"  [{row['Source State']}: {row['Source']}]" if "Source State" in row else ""
        print(f"{row['% Total']:8.2f} {row['Self CUDA total (us)']:10.1f} {row['Calls']:6d} {row['Category']:12} "
              f"{row['Normalized Name'][:80]}{source}")
    for label, stages in summary["tracelens_analysis"]["per_stage"].items():
        for stage, info in stages.items():
            print(f"{label} {stage}: {info['kept_steps']} of {info['steps']} steps, "
                  f"{info['kernel_time_us'] / 1000:.2f} ms of kernel time -> {Path(info['files'][0]).parent}")
    for warning in summary["warnings"]:
        print(f"warning: {warning}")
    print(f"written: {summary['outputs']['gap_analysis']}")
    return 0
