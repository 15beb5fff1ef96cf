"""Trace analysis speed and memory: a real H200 trace (tests/fixtures/traces/h200) tiled
into a ~35 MB, ~100k-event trace and a 10x larger one, each analysed by `magpie benchmark
--trace-dir` as a whole process (wall time, CPU time and peak RSS: medians of 3 runs, with the
range of the wall times; on a shared machine the CPU time moves less with the load); the JSON
decode alone is timed beside it as the floor. The magpie analysed with is the one importable from
the working directory: run it from another checkout to measure that one with the same traces.
A trace over 1 GB (`--copies 400`: 3.2 GB) is analysed once and not decoded untyped.
Usage: python bench/trace_analysis.py [--copies 4 40] [--modes pytorch inference]
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[1] / "tests/fixtures/traces/h200/llama_decode_bf16.json.gz"


def write_tiled(copies: int, path: Path) -> int:
    """The source trace's events `copies` times over in time, written to `path` one event at
    a time (a 3 GB trace never held whole); returns the number of events."""
    data = json.load(gzip.open(SOURCE))
    events = data.pop("traceEvents")
    timed = [e for e in events if "ts" in e]
    span = max(float(e["ts"]) + float(e.get("dur", 0)) for e in timed) - min(float(e["ts"]) for e in timed)
    written = 0
    with open(path, "w") as out:
        out.write('{"traceEvents": [')
        for copy in range(copies):
            shift = copy * (span + 1000)
            for event in events:
                if "ts" not in event:
                    if copy:
                        continue
                    clone = event
                else:
                    clone = dict(event, ts=float(event["ts"]) + shift)
                    args = event.get("args")
                    if args and "correlation" in args:
                        clone["args"] = dict(args, correlation=args["correlation"] + copy * 10_000_000)
                    if "id" in event and event.get("cat") == "ac2g":
                        clone["id"] = event["id"] + copy * 10_000_000
                out.write((", " if written else "") + json.dumps(clone))
                written += 1
        rest = json.dumps(data)[1:-1]
        out.write("]" + (", " + rest if rest else "") + "}")
    return written


REPEATS = 3  # the machine is noisy: each figure is the median of this many runs


def run_once(directory: Path, mode: str, out: Path) -> tuple[float, float, int]:
    """Wall seconds, CPU seconds (user + system) and peak RSS in kB of one whole process."""
    start = time.perf_counter()
    proc = subprocess.run(["/usr/bin/time", "-v", sys.executable, "-m", "magpie", "benchmark", "--trace-dir",
                           str(directory), "--analysis-mode", mode, "-o", str(out)],
                          capture_output=True, text=True, check=True)
    wall = time.perf_counter() - start
    cpu = sum(float(re.search(rf"{kind} time \(seconds\): ([\d.]+)", proc.stderr).group(1))
              for kind in ("User", "System"))
    return wall, cpu, int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr).group(1))


# Above this size a trace is analysed once, and not decoded untyped whole (that alone would
# take several times the machine's memory).
LARGE_BYTES = 1 << 30


def measure(directory: Path, mode: str) -> dict:
    trace = next(directory.glob("*.json"))
    large = trace.stat().st_size > LARGE_BYTES
    # outputs beside the trace folder, not in it: a later run would read their JSON as candidate traces
    runs = [run_once(directory, mode, directory.parent / f"out-{mode}-{i}") for i in range(1 if large else REPEATS)]
    walls = [r[0] for r in runs]
    wall, cpu, peak_kb = (statistics.median(r[k] for r in runs) for k in range(3))
    decode = None
    if not large:
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", f"import orjson; orjson.loads(open({str(trace)!r}, 'rb').read())"],
                       check=True)  # the untyped decode of the whole document, for scale
        decode = time.perf_counter() - start
    return {"wall_s": wall, "wall_range": (min(walls), max(walls)), "cpu_s": cpu, "peak_mb": peak_kb / 1024,
            "decode_process_s": decode, "runs": len(runs)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, nargs="+", default=[4, 40], help="how many times the trace is tiled")
    parser.add_argument("--modes", nargs="+", default=["pytorch", "inference"], choices=["pytorch", "inference"])
    args = parser.parse_args()
    rows = []
    for copies in args.copies:
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp) / "traces"
            folder.mkdir()
            path = folder / "trace.json"
            events = write_tiled(copies, path)
            size_mb = path.stat().st_size / 1e6
            for mode in args.modes:
                rows.append((copies, mode, events, size_mb, measure(folder, mode)))
    print(f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}; {datetime.date.today()}\n")
    print("| trace | analysis mode | events | size MB | `magpie benchmark --trace-dir` s (range) | CPU s "
          "| peak RSS MB | orjson decode alone (process) s |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for copies, mode, events, size, r in rows:
        low, high = r["wall_range"]
        wall = f"{r['wall_s']:.2f} ({low:.2f}-{high:.2f})" if r["runs"] > 1 else f"{r['wall_s']:.2f} (one run)"
        decode = f"{r['decode_process_s']:.2f}" if r["decode_process_s"] is not None else "-"
        print(f"| llama decode tiled x{copies} | {mode} | {events:,} | {size:.0f} | {wall} | {r['cpu_s']:.2f} "
              f"| {r['peak_mb']:.0f} | {decode} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
