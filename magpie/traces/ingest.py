"""PyTorch profiler traces (Chrome JSON, plain or gzip) parsed once into lean tables.

One pass over the events sorts them into GPU activities (kernels, memcpy, memset), runtime
launches, CPU ops and annotations. Kernels are linked to the runtime call that launched
them by correlation id (CUDA and ROCm alike, graph launches included), and each launch to
the innermost CPU op around it on its thread. What cannot be linked is counted, not dropped.
"""

from __future__ import annotations

import gzip
from dataclasses import dataclass, field
from pathlib import Path

try:
    import orjson

    _loads = orjson.loads
except ImportError:  # pragma: no cover - orjson is a dependency; json is the fallback
    import json

    _loads = json.loads

GPU_CATEGORIES = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}
RUNTIME_CATEGORIES = ("cuda_runtime", "cuda_driver", "hip_runtime", "hip_driver")


class TraceError(ValueError):
    """A trace that cannot be read; str() names the file and the problem."""


class NotATrace(TraceError):
    """Valid JSON that is not a profiler trace (a config beside the traces, say)."""


@dataclass
class GpuActivity:
    name: str
    kind: str  # kernel | memcpy | memset
    ts: float  # microseconds
    dur: float
    device: int
    stream: int
    correlation: int | None
    launch: int | None = None  # index into Trace.launches
    op: int | None = None  # index into Trace.cpu_ops of the innermost op around the launch


@dataclass
class Launch:
    name: str
    ts: float
    dur: float
    pid: int
    tid: int
    correlation: int | None
    op: int | None = None


@dataclass
class CpuOp:
    name: str
    ts: float
    dur: float
    pid: int
    tid: int
    input_dims: list | None
    input_types: list | None


@dataclass
class Trace:
    path: str
    rank: int | None
    device_properties: list[dict]
    gpu: list[GpuActivity] = field(default_factory=list)
    launches: list[Launch] = field(default_factory=list)
    cpu_ops: list[CpuOp] = field(default_factory=list)
    annotations: list[tuple[str, float, float]] = field(default_factory=list)
    unlinked: dict[str, int] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)

    @property
    def kernels(self) -> list[GpuActivity]:
        return [a for a in self.gpu if a.kind == "kernel"]

    def device_name(self) -> str | None:
        props = self.device_properties[0] if self.device_properties else {}
        return props.get("name")


def _read(path: Path) -> bytes:
    try:
        raw = path.read_bytes()
        return gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
    except FileNotFoundError:
        raise TraceError(f"{path}: file not found") from None
    except (OSError, EOFError) as err:
        raise TraceError(f"{path}: cannot decompress ({err}); is the .gz file truncated?") from None


def decode(path: str | Path) -> dict:
    path = Path(path)
    try:
        data = _loads(_read(path))
    except ValueError as err:
        raise TraceError(f"{path}: not valid JSON ({str(err).splitlines()[0]}); truncated or not a trace?") from None
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise NotATrace(f"{path}: no 'traceEvents' list: not a PyTorch profiler (Chrome) trace")
    return data


def load_trace(path: str | Path) -> Trace:
    data = decode(path)
    trace = Trace(str(path), data.get("distributedInfo", {}).get("rank"), data.get("deviceProperties") or [])
    by_correlation: dict[int, int] = {}
    skipped: dict[str, int] = {}
    for event in data["traceEvents"]:
        if event.get("ph") != "X":
            continue
        cat = event.get("cat")
        args = event.get("args") or {}
        try:
            if cat in GPU_CATEGORIES:
                trace.gpu.append(GpuActivity(event["name"], GPU_CATEGORIES[cat], float(event["ts"]),
                                             float(event.get("dur", 0.0)), int(args.get("device", 0)),
                                             int(args.get("stream", 0)), args.get("correlation")))
            elif cat in RUNTIME_CATEGORIES:
                correlation = args.get("correlation")
                if correlation is not None:
                    by_correlation[correlation] = len(trace.launches)
                trace.launches.append(Launch(event["name"], float(event["ts"]), float(event.get("dur", 0.0)),
                                             event.get("pid", 0), event.get("tid", 0), correlation))
            elif cat == "cpu_op":
                trace.cpu_ops.append(CpuOp(event["name"], float(event["ts"]), float(event.get("dur", 0.0)),
                                           event.get("pid", 0), event.get("tid", 0), args.get("Input Dims"),
                                           args.get("Input type")))
            elif cat == "user_annotation":
                trace.annotations.append((event["name"], float(event["ts"]), float(event.get("dur", 0.0))))
        except (KeyError, TypeError, ValueError):
            skipped[cat or "?"] = skipped.get(cat or "?", 0) + 1
    trace.skipped = skipped
    _link(trace, by_correlation)
    return trace


def _link(trace: Trace, by_correlation: dict[int, int]) -> None:
    missing_launch = 0
    for activity in trace.gpu:
        index = by_correlation.get(activity.correlation) if activity.correlation is not None else None
        if index is None:
            missing_launch += activity.kind == "kernel"
        activity.launch = index
    # innermost CPU op containing each launch, per thread: one sweep over both, sorted by time
    streams: dict[tuple, list] = {}
    for i, op in enumerate(trace.cpu_ops):
        streams.setdefault((op.pid, op.tid), []).append((op.ts, 0, -op.dur, i))
    for i, launch in enumerate(trace.launches):
        streams.setdefault((launch.pid, launch.tid), []).append((launch.ts, 1, 0.0, i))
    for items in streams.values():
        items.sort()
        open_ops: list[int] = []
        for ts, kind, _, index in items:
            while open_ops and trace.cpu_ops[open_ops[-1]].ts + trace.cpu_ops[open_ops[-1]].dur < ts:
                open_ops.pop()
            if kind == 0:
                open_ops.append(index)
            elif open_ops:
                trace.launches[index].op = open_ops[-1]
    without_op = 0
    for activity in trace.gpu:
        if activity.launch is not None:
            activity.op = trace.launches[activity.launch].op
            without_op += activity.op is None and activity.kind == "kernel"
    trace.unlinked = {"kernels_without_launch": missing_launch, "kernels_without_cpu_op": without_op}


def trace_files(directory: str | Path) -> list[Path]:
    directory = Path(directory)
    if not directory.is_dir():
        raise TraceError(f"{directory}: not a folder (give --trace-dir the folder holding the traces)")
    files = sorted(p for p in directory.rglob("*") if p.name.endswith((".json", ".json.gz")))
    if not files:
        raise TraceError(f"{directory}: no .json or .json.gz trace files found")
    return files
