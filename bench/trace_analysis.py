"""Trace analysis speed and memory, as a ratio to a decode floor: a real H200 trace
(tests/fixtures/traces/h200) tiled into a ~35 MB, ~100k-event trace and a 10x larger one, each
analysed by `magpie benchmark --trace-dir` as a whole process (CPU time (user + system), wall time,
peak RSS), in rounds interleaved with two floors of the same file, each a whole process too: a bare
`msgspec.json.decode` of it (untyped: every event a dict) and a scan (decoded to a struct that keeps
no field: the JSON parse alone). Load hits a round's runs alike, so the ratios (each round's, then
their median) move less than the times. `--phases` also times, in this process, where the analysis's
CPU goes: decode (msgspec's typed decode of the events), records (events to magpie's records),
index (linking, each trace's calls and op tree), tables (op tables, perf rows, gap rows, timeline,
roofline, stages), write (CSV/JSON text, files, the page). The magpie analysed with is the one
importable from the working directory: run it from another checkout to measure that one.
A trace over 1 GB (`--copies 400`: 3.2 GB) is analysed once, without floors.
Usage: python bench/trace_analysis.py [--copies 4 40] [--modes pytorch inference] [--phases]
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import importlib
import inspect
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

import msgspec

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


ROUNDS = 3  # the machine is noisy: each figure is the median of this many interleaved rounds

# The floors, each a process of its own as the analysis is: the untyped decode builds every event
# as Python objects; the scan decodes into a struct without fields, so msgspec parses and skips.
UNTYPED = "import msgspec, sys; msgspec.json.decode(open(sys.argv[1], 'rb').read())"
SCAN = (
    "import msgspec, sys\n"
    "class Skipped(msgspec.Struct): pass\n"
    "class Document(msgspec.Struct): traceEvents: list[Skipped] = []\n"
    "msgspec.json.decode(open(sys.argv[1], 'rb').read(), type=Document)"
)


class _Skipped(msgspec.Struct):
    pass


class _Scanned(msgspec.Struct):
    """The scan floor's document in process: every event parsed, none kept."""

    traceEvents: list[_Skipped] = []


def run_once(command: list[str]) -> dict:
    """Wall seconds, CPU seconds (user + system) and peak RSS (MB) of one whole process."""
    start = time.perf_counter()
    proc = subprocess.run(["/usr/bin/time", "-v", *command], capture_output=True, text=True, check=True)
    wall = time.perf_counter() - start
    cpu = sum(
        float(re.search(rf"{kind} time \(seconds\): ([\d.]+)", proc.stderr).group(1)) for kind in ("User", "System")
    )
    peak_kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr).group(1))
    return {"wall_s": wall, "cpu_s": cpu, "peak_mb": peak_kb / 1024}


# Above this size a trace is analysed once, and not decoded untyped whole (that alone would
# take several times the machine's memory).
LARGE_BYTES = 1 << 30


def measure(directory: Path, mode: str) -> dict:
    """Rounds of (untyped decode, scan, analysis), each figure's median, and the median of each
    round's ratio of the analysis's CPU time to each floor's."""
    trace = next(directory.glob("*.json"))
    large = trace.stat().st_size > LARGE_BYTES
    analysis = [sys.executable, "-m", "magpie", "benchmark", "--trace-dir", str(directory), "--analysis-mode", mode]
    rounds = []
    for i in range(1 if large else ROUNDS):
        floors = (
            {}
            if large
            else {
                name: run_once([sys.executable, "-c", code, str(trace)])
                for name, code in (("untyped", UNTYPED), ("scan", SCAN))
            }
        )
        # outputs beside the trace folder, not in it: a later run would read their JSON as candidate traces
        rounds.append({"analysis": run_once([*analysis, "-o", str(directory.parent / f"out-{mode}-{i}")]), **floors})
    result = {
        name: {key: statistics.median(r[name][key] for r in rounds) for key in ("wall_s", "cpu_s", "peak_mb")}
        for name in rounds[0]
    }
    result["analysis"]["cpu_range"] = (
        min(r["analysis"]["cpu_s"] for r in rounds),
        max(r["analysis"]["cpu_s"] for r in rounds),
    )
    for floor in ("untyped", "scan"):
        if floor in result:
            result[f"ratio_{floor}"] = statistics.median(r["analysis"]["cpu_s"] / r[floor]["cpu_s"] for r in rounds)
    result["rounds"] = len(rounds)
    return result


# Where each function the analysis calls counts its CPU time (the innermost timed call wins: a
# phase's time excludes the timed calls inside it).
PHASES = {
    "decode": [("magpie.traces.ingest", "_stream"), ("magpie.traces.ingest", "decode")],
    "records": [("magpie.traces.ingest._Builder", "take"), ("magpie.traces.ingest._Builder", "take_collectives")],
    "index": [
        ("magpie.traces.ingest", "_link"),
        ("magpie.traces.perf_rows.TraceCalls", "of"),
        ("magpie.traces.perf_rows.TraceCalls", "stage"),
    ],
    "tables": [
        ("magpie.traces.report", name)
        for name in (
            "trace_tables",
            "gap_rows",
            "gpu_timeline",
            "roofline_rows",
            "coll_analysis",
            "split_steps",
            "stage_traces",
            "steady_state_window",
        )
    ],
    "write": [("magpie.traces.report", name) for name in ("_csv", "atomic_write", "render_trace_report")]
    + [("magpie.traces.report.json", "dumps")],
}


def _resolve(dotted: str):
    """A module, or a class in one, by its dotted name."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[cut:]:
            found = getattr(found, attribute)
        return found
    raise ModuleNotFoundError(dotted)


_SPENT: dict[str, float] = {}  # CPU seconds per phase, from the timers once installed
_OPEN: list[str] = []  # the phases of the timed calls under way, innermost last


def _timed(phase: str, function):
    def wrapper(*args, **kwargs):
        _OPEN.append(phase)
        start = time.process_time()
        try:
            return function(*args, **kwargs)
        finally:
            elapsed = time.process_time() - start
            _OPEN.pop()
            _SPENT[phase] = _SPENT.get(phase, 0.0) + elapsed
            if _OPEN:  # not the enclosing phase's time
                _SPENT[_OPEN[-1]] = _SPENT.get(_OPEN[-1], 0.0) - elapsed

    wrapper.timed = True
    return wrapper


def _install_timers() -> None:
    """Each function of PHASES wrapped in a timer of its phase (once per process)."""
    for phase, places in PHASES.items():
        for where, name in places:
            owner = _resolve(where)
            found = inspect.getattr_static(owner, name)
            function = found.__func__ if isinstance(found, classmethod) else found
            if getattr(function, "timed", False):
                continue
            wrapped = _timed(phase, function)
            setattr(owner, name, classmethod(wrapped) if isinstance(found, classmethod) else wrapped)


def phases(directory: Path, mode: str, repeats: int = 3) -> dict[str, float]:
    """CPU seconds per phase of `analyze_traces` in this process (best of `repeats`), the rest as
    "other"; the floors' in-process decode of the same file beside them."""
    from magpie.traces import report

    _install_timers()
    best: dict[str, float] | None = None
    for i in range(repeats):
        _SPENT.clear()
        start = time.process_time()
        report.analyze_traces(directory, directory.parent / f"out-phases-{mode}-{i}", analysis_mode=mode)
        run = {**_SPENT, "total": time.process_time() - start}
        run["other"] = run["total"] - sum(v for k, v in run.items() if k != "total")
        if best is None or run["total"] < best["total"]:
            best = run
    trace = next(directory.glob("*.json")).read_bytes()
    for name, decode in (
        ("scan floor", lambda: msgspec.json.decode(trace, type=_Scanned)),
        ("untyped floor", lambda: msgspec.json.decode(trace)),
    ):
        times = []
        for _ in range(repeats):
            start = time.process_time()
            decode()
            times.append(time.process_time() - start)
        best[name] = min(times)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, nargs="+", default=[4, 40], help="how many times the trace is tiled")
    parser.add_argument("--modes", nargs="+", default=["pytorch", "inference"], choices=["pytorch", "inference"])
    parser.add_argument("--phases", action="store_true", help="also time the analysis's phases in this process")
    args = parser.parse_args()
    rows, breakdowns = [], []
    for copies in args.copies:
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp) / "traces"
            folder.mkdir()
            path = folder / "trace.json"
            events = write_tiled(copies, path)
            size_mb = path.stat().st_size / 1e6
            for mode in args.modes:
                rows.append((copies, mode, events, size_mb, measure(folder, mode)))
                if args.phases and path.stat().st_size <= LARGE_BYTES:
                    breakdowns.append((copies, mode, phases(folder, mode)))
    print(
        f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} cores, load "
        f"{os.getloadavg()[0]:.1f}; Python {platform.python_version()}, msgspec {msgspec.__version__}; "
        f"{datetime.date.today()}\n"
    )
    print(
        "| trace | analysis mode | events | size MB | analysis CPU s (range) | wall s | peak RSS MB "
        "| bare decode CPU s | × bare decode | scan CPU s | × scan |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for copies, mode, events, size, r in rows:
        a = r["analysis"]
        low, high = a["cpu_range"]
        cpu = f"{a['cpu_s']:.2f} ({low:.2f}-{high:.2f})" if r["rounds"] > 1 else f"{a['cpu_s']:.2f} (one run)"
        floors = " | ".join(
            f"{r[floor]['cpu_s']:.2f} | {r[f'ratio_{floor}']:.2f}" if floor in r else "- | -"
            for floor in ("untyped", "scan")
        )
        print(
            f"| llama decode tiled x{copies} | {mode} | {events:,} | {size:.0f} | {cpu} | {a['wall_s']:.2f} "
            f"| {a['peak_mb']:.0f} | {floors} |"
        )
    if breakdowns:
        names = ["decode", "records", "index", "tables", "write", "other", "total", "scan floor", "untyped floor"]
        print("\nCPU s per phase, in process (best of 3):\n")
        print("| trace | mode | " + " | ".join(names) + " |")
        print("|---|---|" + "---:|" * len(names))
        for copies, mode, best in breakdowns:
            print(f"| x{copies} | {mode} | " + " | ".join(f"{best.get(n, 0.0):.3f}" for n in names) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
