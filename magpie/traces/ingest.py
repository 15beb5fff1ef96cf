"""PyTorch profiler traces (Chrome JSON, plain or gzip) parsed once into lean tables.

One pass over the events sorts them into GPU activities (kernels, memcpy, memset), runtime
launches, CPU ops and annotations. Kernels are linked to the runtime call that launched
them by correlation id (CUDA and ROCm alike, graph launches included), and each launch to
the innermost CPU op around it on its thread. What cannot be linked is counted, not dropped.
"""

from __future__ import annotations

import gc
import gzip
from dataclasses import dataclass, field
from pathlib import Path

from typing import Any, Optional, Union

import msgspec


# Typed decoding reads only the fields the analysis uses, straight into small structs:
# several times faster than decoding to dicts, and a fraction of the memory.
class _Args(msgspec.Struct):
    correlation: Optional[int] = None
    device: Optional[int] = None
    stream: Optional[int] = None
    input_dims: Optional[Any] = msgspec.field(default=None, name="Input Dims")
    input_type: Optional[Any] = msgspec.field(default=None, name="Input type")
    concrete: Optional[Any] = msgspec.field(default=None, name="Concrete Inputs")


class _Event(msgspec.Struct):
    ph: str = ""
    cat: Optional[str] = None
    name: str = ""
    ts: Union[float, str, None] = None
    dur: Union[float, str, None] = None
    pid: Union[int, str, None] = None
    tid: Union[int, str, None] = None
    args: Optional[_Args] = None


class _Document(msgspec.Struct):
    traceEvents: list[_Event]
    deviceProperties: Optional[list[dict]] = None
    distributedInfo: Optional[dict] = None


_DECODER = msgspec.json.Decoder(_Document)

GPU_CATEGORIES = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}
RUNTIME_CATEGORIES = ("cuda_runtime", "cuda_driver", "hip_runtime", "hip_driver")


class TraceError(ValueError):
    """A trace that cannot be read; str() names the file and the problem."""


class NotATrace(TraceError):
    """Valid JSON that is not a profiler trace (a config beside the traces, say)."""


@dataclass(slots=True)
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
    python: int | None = None  # index into Trace.python_calls, where no op is around the launch


@dataclass(slots=True)
class Launch:
    name: str
    ts: float
    dur: float
    pid: int
    tid: int
    correlation: int | None
    op: int | None = None
    python: int | None = None


@dataclass(slots=True)
class PythonCall:
    """A python_function span (traces recorded with with_stack=True)."""

    name: str
    ts: float
    dur: float
    pid: int
    tid: int


@dataclass(slots=True)
class CpuOp:
    name: str
    ts: float
    dur: float
    pid: int
    tid: int
    input_dims: list | None
    input_types: list | None
    concrete: list | None = None


@dataclass
class Trace:
    path: str
    rank: int | None
    device_properties: list[dict]
    gpu: list[GpuActivity] = field(default_factory=list)
    launches: list[Launch] = field(default_factory=list)
    cpu_ops: list[CpuOp] = field(default_factory=list)
    python_calls: list[PythonCall] = field(default_factory=list)
    annotations: list[tuple[str, float, float]] = field(default_factory=list)
    gpu_annotations: list[tuple[str, float, float]] = field(default_factory=list)
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


def decode(path: str | Path) -> _Document:
    path = Path(path)
    raw = _read(path)
    try:
        return _DECODER.decode(raw)
    except msgspec.ValidationError as err:
        raise NotATrace(f"{path}: not a PyTorch profiler (Chrome) trace ({err})") from None
    except msgspec.DecodeError as err:
        raise TraceError(f"{path}: not valid JSON ({str(err).splitlines()[0]}); truncated or not a trace?") from None


_EMPTY_ARGS = _Args()


def load_trace(path: str | Path) -> Trace:
    # Millions of small objects and no cycles among them: the cyclic collector would only
    # rescan them again and again while they are made.
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _load(path)
    finally:
        if collecting:
            gc.enable()


def _load(path: str | Path) -> Trace:
    data = decode(path)
    trace = Trace(str(path), (data.distributedInfo or {}).get("rank"), data.deviceProperties or [])
    by_correlation: dict[int, int] = {}
    skipped: dict[str, int] = {}
    gpu, launches, cpu_ops = trace.gpu, trace.launches, trace.cpu_ops
    for event in data.traceEvents:
        if event.ph != "X":
            continue
        cat = event.cat
        args = event.args or _EMPTY_ARGS
        try:
            ts, dur = float(event.ts), float(event.dur or 0.0)
            if cat in GPU_CATEGORIES:
                gpu.append(GpuActivity(event.name, GPU_CATEGORIES[cat], ts, dur, args.device or 0, args.stream or 0,
                                       args.correlation))
            elif cat in RUNTIME_CATEGORIES:
                if args.correlation is not None:
                    by_correlation[args.correlation] = len(launches)
                launches.append(Launch(event.name, ts, dur, event.pid, event.tid, args.correlation))
            elif cat == "cpu_op":
                cpu_ops.append(CpuOp(event.name, ts, dur, event.pid, event.tid, args.input_dims, args.input_type,
                                     args.concrete))
            elif cat == "python_function":
                trace.python_calls.append(PythonCall(event.name, ts, dur, event.pid, event.tid))
            elif cat == "user_annotation":
                trace.annotations.append((event.name, ts, dur))
            elif cat == "gpu_user_annotation":
                trace.gpu_annotations.append((event.name, ts, dur))
        except (TypeError, ValueError):
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
    for index, op in _innermost(trace.cpu_ops, trace.launches):
        trace.launches[index].op = op
    # a launch outside any aten op (a Triton launcher, a graph replay) is attributed to the
    # innermost Python function around it, where the trace recorded them
    orphans = [i for i, launch in enumerate(trace.launches) if launch.op is None]
    if trace.python_calls and orphans:
        for at, call in _innermost(trace.python_calls, [trace.launches[i] for i in orphans]):
            trace.launches[orphans[at]].python = call
    without_op = 0
    for activity in trace.gpu:
        if activity.launch is not None:
            launch = trace.launches[activity.launch]
            activity.op, activity.python = launch.op, launch.python
            without_op += activity.op is None and activity.kind == "kernel"
    trace.unlinked = {"kernels_without_launch": missing_launch, "kernels_without_cpu_op": without_op}


def _innermost(spans: list, points: list):
    """(point index, index of the innermost span around it on its thread) for each point
    inside one: one sweep per thread over both, sorted by time."""
    streams: dict[tuple, list] = {}
    for i, span in enumerate(spans):
        streams.setdefault((span.pid, span.tid), []).append((span.ts, 0, -span.dur, i))
    for i, point in enumerate(points):
        streams.setdefault((point.pid, point.tid), []).append((point.ts, 1, 0.0, i))
    for items in streams.values():
        items.sort()
        open_spans: list[int] = []
        for ts, kind, _, index in items:
            while open_spans and spans[open_spans[-1]].ts + spans[open_spans[-1]].dur < ts:
                open_spans.pop()
            if kind == 0:
                open_spans.append(index)
            elif open_spans:
                yield index, open_spans[-1]


def trace_files(directory: str | Path) -> list[Path]:
    directory = Path(directory)
    if not directory.is_dir():
        raise TraceError(f"{directory}: not a folder (give --trace-dir the folder holding the traces)")
    files = sorted(p for p in directory.rglob("*") if p.name.endswith((".json", ".json.gz")))
    if not files:
        raise TraceError(f"{directory}: no .json or .json.gz trace files found")
    return files
