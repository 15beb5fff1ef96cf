"""Do magpie's speedup intervals hold across runs? And how long from an edit to a verdict?
(run on a GPU)

The 8-candidate Triton compare of bench/gpu_fidelity.py, repeated N times with the zygote
kept warm, each run into an emptied artifact store (every candidate timed again, by the
workers the run before parked). For each run
and candidate: does the run's 95% interval contain the median of the other runs' point
estimates? Honest intervals do so in about 90% or more of the cases. The same runs show
whether a kept-warm repeat inflates any candidate's median (its medians across runs).

Then, with the zygote still warm, one candidate's source is edited (a comment: its kernel
stays the same, but its compiler cache, keyed by the file's content, starts empty, and so
does its worker) and the last run's project built again: the wall
time from the edit to the new verdict, against that candidate's timing budget (the
candidate and its baseline, each budget_ms), and the tasks that rebuild ran, with where each
spent its time.
Usage: python bench/interval_coverage.py OUT.json [--runs 10] [--device cpu] [--edits N]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_fidelity import compare_run, write_compare8  # noqa: E402

BUDGET_MS = 300
SHAPE = "16777216"


def coverage(runs: list[dict]) -> dict:
    """Per candidate, how many runs' intervals contain the median of the other runs' estimates."""
    names = sorted(
        {
            name
            for run in runs
            for name, row in run["rows"].items()
            if (row["speedup"] or {}).get("verdict") not in (None, "baseline")
        }
    )
    checks, held, misses = 0, 0, []
    for name in names:
        values = [
            (i, run["rows"][name]["speedup"])
            for i, run in enumerate(runs)
            if (run["rows"].get(name) or {}).get("speedup")
        ]
        if len(values) < 2:  # no other run to hold
            continue
        for i, speedup in values:
            others = statistics.median(s["value"] for j, s in values if j != i)
            checks += 1
            if speedup["ci_low"] <= others <= speedup["ci_high"]:
                held += 1
            else:
                misses.append(
                    {
                        "candidate": name,
                        "run": i,
                        "interval": [speedup["ci_low"], speedup["ci_high"]],
                        "others_median": others,
                    }
                )
    return {"checks": checks, "held": held, "coverage": held / checks if checks else None, "misses": misses}


def compiled_since(unix: float) -> list[dict]:
    """The files written into implementations' compiler caches since `unix` (the edited
    candidate's new cache: its driver utilities seeded, its kernel and launcher compiled),
    each with when, from then."""
    from magpie.paths import cache_root

    compiled = cache_root() / "compiled"
    found = []
    for path in compiled.glob("*/*/**/*"):
        if not path.is_file():
            continue
        info = path.stat()
        if info.st_mtime >= unix:
            found.append(
                {
                    "file": path.relative_to(compiled).as_posix()[-90:],
                    "t": round(info.st_mtime - unix, 3),
                    "bytes": info.st_size,
                }
            )
    return sorted(found, key=lambda f: f["t"])[:80]


def write_partial(out: str, **parts) -> None:
    """What is measured so far, so that a run cut off by a time limit leaves its figures."""
    Path(out).write_text(json.dumps({"budget_ms": BUDGET_MS, "partial": True, **parts}, indent=1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--edits", type=int, default=1, help="edits of the candidate, each timed (the median reported)")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="magpie-coverage-"))
    try:
        return measure(args, root)
    finally:  # the runs' stores and Triton caches: hundreds of MB a set
        shutil.rmtree(root, ignore_errors=True)


def measure(args, root: Path) -> int:
    files = write_compare8(root)
    env = {**os.environ, "TRITON_CACHE_DIR": str(root / "triton_cache"), "MAGPIE_KEEP_WARM_S": "120"}
    shape = SHAPE if args.device.startswith("cuda") else "4096"
    warm_up = compare_run(root, files, BUDGET_MS, "out", env, args.device, shape)  # zygote, JIT caches
    runs = []
    for i in range(args.runs):
        # every artifact built again, into the same workspace: its workers, whose sandboxes
        # hide that workspace, serve the next run
        shutil.rmtree(root / "out" / "workspace" / "store")
        run = compare_run(root, files, BUDGET_MS, "out", env, args.device, shape)
        if "error" in run:
            print(run["error"])
            return 1
        runs.append(
            {
                k: run[k]
                for k in (
                    "wall_s",
                    "rows",
                    "timeline_s",
                    "timing_phases_s",
                    "timing_measurement_steps_s",
                    "timing_round_parts_s",
                    "device_held_alone_s",
                    "tasks",
                )
            }
        )
        print(f"run {i}: {run['wall_s']:.1f} s", flush=True)
        write_partial(args.out, runs=runs, start_run_wall_s=warm_up.get("wall_s"))
    edited = root / files[3]
    walls, traced = [], []
    for edit in range(args.edits):
        # every other edit with the command's own timeline (bench/main_timeline.py), not counted
        trace = root / f"main_timeline_{edit}.json" if edit % 2 else None
        started_unix = time.time()
        started = time.monotonic()
        edited.write_text(edited.read_text() + f"# edit {edit}: the kernel is the same\n")
        run = compare_run(root, files, BUDGET_MS, "out", env, args.device, shape, started_unix, trace)
        wall = time.monotonic() - started
        if trace is None:
            walls.append(wall)
            again = run
        else:
            traced.append(
                {
                    "wall_s": wall,
                    "timeline_s": run.get("timeline_s"),
                    "error": run.get("error"),
                    "main": json.loads(trace.read_text()) if trace.exists() else None,
                    "compiled": compiled_since(started_unix),
                }
            )
        write_partial(
            args.out, runs=runs, start_run_wall_s=warm_up.get("wall_s"), edit_walls_s=walls, traced_edits=traced
        )
    edit_to_verdict = statistics.median(walls)
    budget_s = 2 * BUDGET_MS / 1000
    medians = {name: [run["rows"][name]["median_us"] for run in runs] for name in runs[0]["rows"]}
    result = {
        "budget_ms": BUDGET_MS,
        "shape": shape,
        "runs": runs,
        "start_run_wall_s": warm_up.get("wall_s"),
        "coverage": coverage(runs),
        "medians_us": medians,
        "median_spread": {name: (max(v) - min(v)) / statistics.median(v) for name, v in medians.items() if all(v)},
        "edit_to_verdict": {
            "candidate": files[3],
            "wall_s": edit_to_verdict,
            "walls_s": walls,
            "timing_budget_s": budget_s,
            "ratio": edit_to_verdict / budget_s,
            "target_s": 1.5 * budget_s + 1,
            "tasks_run": sorted(again.get("tasks", {})),
            "tasks": again.get("tasks"),
            "timeline_s": again.get("timeline_s"),
            "error": again.get("error"),
            "traced": traced,
        },
    }
    Path(args.out).write_text(json.dumps(result, indent=1))
    cov = result["coverage"]
    if cov["checks"]:
        print(f"coverage {cov['held']}/{cov['checks']} = {cov['coverage']:.2f}")
    for name, values in medians.items():
        print(f"{name:>18} medians {' '.join(f'{v:.1f}' for v in values)}")
    steps = runs[-1]["timing_measurement_steps_s"]
    print(
        "the last run's timing jobs, summed (s): "
        + ", ".join(f"{step} {seconds:.2f}" for step, seconds in steps.items())
        + "; the rounds: "
        + ", ".join(f"{part} {seconds:.2f}" for part, seconds in runs[-1]["timing_round_parts_s"].items())
    )
    e = result["edit_to_verdict"]
    print(
        f"edit to verdict {e['wall_s']:.2f} s, median of {' '.join(f'{w:.2f}' for w in e['walls_s'])} (budget {budget_s:.1f} s, target {e['target_s']:.1f} s), "
        f"ran: {', '.join(e['tasks_run'])}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
