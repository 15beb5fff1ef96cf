"""What the analyze and compare verbs share: their flags, and the options made of them for
the library calls (execution/oneshot.py)."""

from __future__ import annotations

import sys

from magpie.execution.oneshot import JOBS_CAP


def add_common(p, paths_help: str) -> None:
    p.add_argument("paths", nargs="*", help=paths_help)
    p.add_argument("--kernel-config", metavar="YAML", help="Magpie-style YAML (kernel: or kernels:)")
    p.add_argument("--type", choices=("pytorch", "triton", "cuda", "hip"), help="kernel type of the sources")
    p.add_argument("--entry", help="callable in the source to evaluate (default: ModelNew/Model class)")
    p.add_argument("--testcase", metavar="CMD", help="command whose exit code decides correctness")
    p.add_argument("--spec", metavar="FILE", help="Python reference spec (make_inputs/reference, or KernelBench)")
    p.add_argument("--shapes", default="", help="shapes for --spec, e.g. 64x1024,37x1000")
    p.add_argument(
        "--timed-shapes",
        default="",
        metavar="SHAPES",
        help="shapes to time, among --shapes (a speedup each and their geometric mean; default: the first)",
    )
    p.add_argument("--dtypes", default="float32", help="dtypes for --spec, comma separated (default: float32)")
    p.add_argument("--rtol", type=float, help="relative tolerance (default 1e-5)")
    p.add_argument("--atol", type=float, help="absolute tolerance (default 1e-6)")
    p.add_argument("--no-perf", action="store_true", help="correctness only, no timing")
    p.add_argument(
        "--trust-code",
        action="store_true",
        help="run the code without a sandbox where the host allows none (only code you trust)",
    )
    p.add_argument("--no-profile", action="store_true", help="no hardware counters (ncu/rocprofv3) on a GPU")
    p.add_argument("--budget-ms", type=float, default=300.0, help="timed milliseconds per implementation")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per evaluation step")
    p.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N")
    p.add_argument("-o", "--output-dir", default="magpie_results", help="reports and artifact store go here")
    p.add_argument(
        "-j",
        "--jobs",
        type=int,
        help=f"independent tasks in parallel (default: one per implementation, at least 2, at most "
        f"the CPU count and {JOBS_CAP}); checks share the device, measurements hold it alone",
    )


def options_from(args):
    from magpie.execution.oneshot import OneShotOptions

    return OneShotOptions(
        paths=args.paths,
        kernel_config=args.kernel_config,
        type=args.type,
        entry=args.entry,
        testcase=args.testcase,
        spec=args.spec,
        shapes=args.shapes,
        timed_shapes=args.timed_shapes,
        dtypes=args.dtypes,
        rtol=args.rtol,
        atol=args.atol,
        no_perf=args.no_perf,
        trust_code=args.trust_code,
        no_profile=args.no_profile,
        budget_ms=args.budget_ms,
        timeout=args.timeout,
        device=args.device,
        output_dir=args.output_dir,
        jobs=args.jobs,
    )


def progress(verb: str):
    """The build's progress lines on stderr (a bar on a terminal)."""
    from magpie.execution.progress import Progress

    return Progress(sys.stderr, bar=sys.stderr.isatty(), title=f"magpie {verb}")
