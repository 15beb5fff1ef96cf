"""Does the bound that calls made alone set on a batch's calls (`measurement.alone_bound`)
fail batches done together and leave honest ones alone?

Four projects on `relu(x) * 2` (the adversarial fixtures' spec), built `--repeats` times each
at the default timing (300 ms budget, 5 rounds), on 33x65 fp32 sets unless said:

- baseline `good` (eager relu): `batches_its_calls` (the worker's batch loop replaced by one
  operation over all of a batch's input sets), and honest ones: an identical copy, `many_ops`
  (the same relu in ten operations, about 4x slower), a TorchScript one, one through a lookup
  table and, with --compiled, a torch.compile'd one (its first call compiles for ~30 s); again
  on 8x8 sets (`good_8x8`: the one-operation relu, the copy and the ten operations);
- baseline `many_ops`: `batches_many_ops` (its ten operations done once over a whole batch),
  `batches_above_floor` (the same, then three small kernels a call into its slot, which a
  GPU's launch floor does not catch) and the plain relu, honestly about 4x faster; again on
  8x8 sets, where a call is all dispatch and doing a batch's calls together saves nearly all
  of it.

Per build and candidate: the timing's state, the bound's ratio to the batches' time (over 1.5
fails; between 1 and 1.5 the candidate is credited at the bound), its margin, how many pairs
it drew on and left out, the speedup credited and, where the bound lowered it, what its
batches alone read. On a GPU (--device cuda) the same,
with batches handed over one call at a time on the GPU, and the launch floor; the JSON keeps
each row's GPU batches and the baseline's beside it (what a baseline that reads slower beside
a candidate than in its own timing is made of).

Usage: python bench/calls_alone.py [--repeats 3] [--device cpu] [--compiled] [--projects a,b] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "adversarial"
HONEST = {
    "same": (FIXTURES / "good.py").read_text(),
    "scripted": "import torch\n\n\n@torch.jit.script\ndef kernel(x):\n    return torch.relu(x) * 2.0\n",
    "table": (
        "import torch\n\n_TABLE = torch.full((16384,), 2.0)\n\n\n"
        "def kernel(x):\n    return torch.relu(x) * _TABLE[:x.numel()].view_as(x)\n"
    ),
    "compiled": (
        "import torch\n\n\ndef _relu2(x):\n    return torch.relu(x) * 2.0\n\n\n"
        "kernel = torch.compile(_relu2, dynamic=False)\n"
    ),
}
PROJECTS = {  # name: baseline, shape, candidates
    "good": ("good", "[33, 65]", ["batches_its_calls", "same", "many_ops", "scripted", "table"]),
    "good_8x8": ("good", "[8, 8]", ["batches_its_calls", "same", "many_ops"]),
    "many_ops": ("many_ops", "[33, 65]", ["batches_many_ops", "batches_above_floor", "good"]),
    "many_ops_8x8": ("many_ops", "[8, 8]", ["batches_many_ops", "batches_above_floor", "good"]),
}


def write_project(root: Path, baseline: str, shape: str, candidates: list[str], device: str) -> None:
    for name in {baseline, "spec", *candidates}:
        if name in HONEST:
            (root / f"{name}.py").write_text(HONEST[name])
        else:
            shutil.copy(FIXTURES / f"{name}.py", root / f"{name}.py")
    tables = "".join(f'[[kernel.candidates]]\nid = "{n}"\nsource = "{n}.py"\n\n' for n in candidates)
    vouched = "vouched = true\n" if device != "cpu" else ""
    (root / "magpie.toml").write_text(
        f'[project]\nname = "alone"\ndevice = "{device}"\n\n[defaults]\ntimeout_s = 120\n\n'
        f"[defaults.timing]\nwarmup_ms = 5\nbudget_ms = 300\nrounds = 5\n{vouched}\n"
        f'[[kernel]]\nid = "relu2"\ntype = "pytorch"\nentry = "kernel"\n\n'
        f'[kernel.baseline]\nid = "{baseline}"\nsource = "{baseline}.py"\n\n'
        f'{tables}[[kernel.testcases]]\nspec = "spec.py"\nshapes = [{shape}]\n'
    )


def build(root: Path) -> dict:
    shutil.rmtree(root / "workspaces", ignore_errors=True)
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "magpie", "build", "-j", "2"], cwd=root, check=True, capture_output=True)
    wall = time.monotonic() - started
    report = json.loads((root / "workspaces/reports/relu2/compare_report.json").read_text())
    rows = {}
    for row in report["results"]:
        result = row.get("performance_result") or {}
        bound = result.get("alone_bound") or {}
        rows[row["implementation"]] = {
            "performance_state": row.get("performance_state"),
            "kinds": sorted({f["kind"] for f in row.get("failures") or [] if f.get("stage") == "timing"}),
            "median_us": result.get("median_us"),
            "speedup": (row.get("speedup") or {}).get("value"),
            "verdict": (row.get("speedup") or {}).get("verdict"),
            "mode": (row.get("timing_method") or {}).get("mode"),  # on a GPU: events or graph
            # what the speedup took: the statistic, and the baseline's median beside this candidate
            "statistic": (row.get("speedup") or {}).get("statistic"),
            "baseline_median_us": (row.get("baseline_result") or {}).get("median_us"),
            "flags": sorted({f["kind"] for f in row.get("flags") or []}),
            # on a GPU, every batch (round, calls, µs) and what a batch costs besides its calls: where
            # a baseline reads slower beside a candidate than in its own timing, which batches did
            "device_batches": result.get("device_batches"),
            "round_trip_us": result.get("round_trip_us"),
            "baseline_device_batches": (row.get("baseline_result") or {}).get("device_batches"),
            # where its calls alone bound it above its batches, what the batches alone would credit
            "batches_speedup": ((row.get("speedup") or {}).get("bounded_by_calls_alone") or {}).get("batches_value"),
            **{
                key: bound.get(key)
                for key in (
                    "ratio",
                    "lower_us",
                    "margin_us",
                    "difference_us",
                    "baseline_alone_us",
                    "pairs",
                    "left_out",
                    "calls_a_batch",
                )
            },
        }
    return {"build_s": round(wall, 2), "rows": rows}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--compiled", action="store_true", help="also a torch.compile'd relu (slow first call)")
    parser.add_argument("--projects", default=",".join(PROJECTS), help="which of " + ", ".join(PROJECTS))
    parser.add_argument("--json", help="write the figures here too")
    args = parser.parse_args()
    out = {"date": time.strftime("%Y-%m-%d %H:%M"), "cores": os.cpu_count(), "device": args.device, "projects": {}}
    for project in args.projects.split(","):
        baseline, shape, candidates = PROJECTS[project]
        candidates = candidates + (["compiled"] if args.compiled and project == "good" else [])
        root = Path(tempfile.mkdtemp(prefix="magpie-calls-alone-"))
        try:
            write_project(root, baseline, shape, candidates, args.device)
            out["projects"][project] = []
            for _ in range(args.repeats):
                out["projects"][project].append(build(root))
                if args.json:  # what is measured so far, should a time limit cut the rest
                    Path(args.json).write_text(json.dumps(out, indent=1))
        finally:
            shutil.rmtree(root, ignore_errors=True)
    for project, builds in out["projects"].items():
        baseline, shape, _ = PROJECTS[project]
        print(f"baseline {baseline}, {shape}")
        names = sorted({name for b in builds for name in b["rows"] if name != baseline})
        for name in names:
            rows = [b["rows"].get(name, {}) for b in builds]
            cells = [
                f"{r.get('performance_state')}/{'/'.join(r.get('kinds') or []) or '-'} "
                f"{r['median_us']} µs ratio {r['ratio']:.2f} margin {r['margin_us']:.2f} "
                f"pairs {r['pairs']}+{r['left_out']} out"
                + (f" {r['mode']}" if r.get("mode") else "")
                + (
                    f" credited {r['speedup']:.2f}x {r['verdict']} by the {r['statistic']}, the baseline "
                    f"{r['baseline_median_us']:.3g} µs beside it"
                    if r.get("speedup") is not None
                    else ""
                )
                + (f" flags {','.join(r['flags'])}" if r.get("flags") else "")
                + (f" (batches {r['batches_speedup']:.2f}x)" if r.get("batches_speedup") else "")
                if r.get("ratio") is not None
                else f"{r.get('performance_state')}/{'/'.join(r.get('kinds') or [])}"
                for r in rows
            ]
            print(f"  {name:18s} " + " | ".join(cells))
        print(f"  build s: {[b['build_s'] for b in builds]}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
