"""magpie kernel from-trace: a kernel declared from a workload's trace, its spec made from the
recorded signatures of one op (`traces/to_spec.py`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from magpie.errors import UserError


def add_parser(sub) -> None:
    p = sub.add_parser(
        "kernel",
        help="declare kernels from a workload (kernel from-trace)",
        description="Declare kernels from what a workload ran.",
    )
    verbs = p.add_subparsers(dest="kernel_verb", metavar="VERB", required=True)
    t = verbs.add_parser(
        "from-trace",
        help="a spec of one op's top signatures in a profiler trace",
        description="Without --op: the trace's ops by share of its GPU time (what speeding each up can save "
        "of the whole), and whether each can be made into a spec, or why not. With --op: a spec whose "
        "testcases are the op's top signatures by that share (the recorded shapes, dtypes and strides; "
        "the reference is the recorded op; tolerances by dtype), a baseline calling the recorded op, and "
        "the [[kernel]] table to add to magpie.toml.",
    )
    t.add_argument("trace", help="a PyTorch profiler trace (.json or .json.gz)")
    t.add_argument("--op", help="the op, as the trace names it (aten::mm)")
    t.add_argument("--top", type=int, default=3, help="signatures to take, by share of the workload (default 3)")
    t.add_argument("-o", "--out", help="folder for spec.py and baseline.py (default kernels/<op>)")
    t.add_argument("--json", action="store_true", help="print what was found (and written) as JSON")
    t.set_defaults(run=run)


def run(args) -> int:
    from magpie.traces import to_spec

    if args.top < 1:
        raise UserError(f"--top {args.top}: take at least one signature")
    groups, workload_us = to_spec.workload_ops(args.trace)
    if not args.op:
        rows = to_spec.op_table(groups, workload_us)
        if args.json:
            print(json.dumps({"trace": args.trace, "gpu_time_us": workload_us, "ops": rows}, indent=1))
            return 0
        print(f"{args.trace}: {workload_us:.1f} µs of GPU time; ops by share of it")
        print(f"{'share':>7}  {'total µs':>10}  {'calls':>6}  {'sigs':>4}  op: spec")
        for row in rows:
            print(
                f"{row['share'] * 100:6.2f}%  {row['total_us']:10.1f}  {row['calls']:6d}  {row['signatures']:4d}  "
                f"{row['op']}: {row['spec']}"
            )
        return 0
    signatures = to_spec.top_signatures(groups, workload_us, args.op, args.top)
    folder = Path(args.out or f"kernels/{to_spec.kernel_id(args.op)}")
    if folder.is_absolute() or ".." in folder.parts:
        raise UserError(f"-o {folder}: give a folder inside the project, relative to it (it goes into magpie.toml)")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "spec.py").write_text(to_spec.spec_text(args.op, args.trace, signatures))
        (folder / "baseline.py").write_text(to_spec.baseline_text(args.op, signatures))
    except OSError as err:
        raise UserError(f"{folder}: cannot be written: {err.strerror}") from None
    table = to_spec.kernel_toml(args.op, folder.as_posix(), signatures)
    if args.json:
        print(
            json.dumps(
                {
                    "op": args.op,
                    "trace": args.trace,
                    "gpu_time_us": workload_us,
                    "spec": (folder / "spec.py").as_posix(),
                    "baseline": (folder / "baseline.py").as_posix(),
                    "kernel_toml": table,
                    "signatures": [
                        {
                            "share": s.share,
                            "calls": s.calls,
                            "total_us": s.total_us,
                            "sizes": s.sizes,
                            "dtype": s.dtype,
                            "inputs": [
                                {
                                    "dims": [s.sizes[i] for i in a["tensor"]],
                                    "dtype": a["dtype"],
                                    "strides": a["strides"],
                                }
                                for a in s.arguments
                                if "tensor" in a
                            ],
                        }
                        for s in signatures
                    ],
                },
                indent=1,
            )
        )
        return 0
    print(f"{args.op}: {len(signatures)} signature(s) of {args.trace}, by share of its GPU time:", file=sys.stderr)
    for s in signatures:
        shapes = ", ".join(
            "×".join(str(s.sizes[i]) for i in a["tensor"]) + f" {a['dtype']}" for a in s.arguments if "tensor" in a
        )
        print(f"  {s.share * 100:5.1f}%  {s.calls:5d} calls  {shapes}", file=sys.stderr)
    print(f"wrote {folder / 'spec.py'} and {folder / 'baseline.py'}; add to magpie.toml:\n", file=sys.stderr)
    print(table, end="")
    return 0
