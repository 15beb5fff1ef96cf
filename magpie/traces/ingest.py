"""PyTorch profiler traces (Chrome JSON, plain or gzip) parsed once into lean tables.

One pass over the events sorts them into GPU activities (kernels, memcpy, memset), runtime
launches, CPU ops and annotations. Kernels are linked to the runtime call that launched
them by correlation id (CUDA and ROCm alike, graph launches included), and each launch to
the innermost CPU op around it on its thread. What cannot be linked is counted, not dropped.
"""

from __future__ import annotations

import gc
import gzip
import re
from array import array
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import chain, count, repeat
from operator import attrgetter, neg
from pathlib import Path

import msgspec

# Typed decoding reads only the fields the analysis uses, straight into small structs kept out
# of the cyclic collector (gc=False: they hold no cycles): several times faster than decoding to
# dicts, and a fraction of the memory. An op's inputs stay raw JSON at first: they repeat from
# call to call, so each distinct one is decoded once and shared by every op that has it.
_NULL = msgspec.Raw(b"null")


class _Args(msgspec.Struct, gc=False):
    correlation: int | None = None
    device: int | None = None
    stream: int | None = None
    input_dims: msgspec.Raw = msgspec.field(default=_NULL, name="Input Dims")
    input_type: msgspec.Raw = msgspec.field(default=_NULL, name="Input type")
    concrete: msgspec.Raw = msgspec.field(default=_NULL, name="Concrete Inputs")
    strides: msgspec.Raw = msgspec.field(default=_NULL, name="Input Strides")
    # a metadata event's value (process_name, thread_name: "name"; process_labels: "labels"), raw:
    # decoded only for those events, so no other event's args can fail the batch
    name: msgspec.Raw = _NULL
    labels: msgspec.Raw = _NULL
    # a collective's kernel says which collective it ran (what else it says, _CollectiveArgs reads:
    # each field here costs every event's decoding, so they are read in a second pass, only of a
    # trace that has collectives)
    collective: str | None = msgspec.field(default=None, name="Collective name")


class _Event(msgspec.Struct, gc=False):
    ph: str = ""
    cat: str | None = None
    name: str = ""
    ts: float | str | None = None
    dur: float | str | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    args: _Args | None = None


class _Document(msgspec.Struct):
    traceEvents: list[_Event]
    deviceProperties: list[dict] | None = None
    distributedInfo: dict | None = None


class _CollectiveArgs(msgspec.Struct, gc=False):
    collective: str | None = msgspec.field(default=None, name="Collective name")
    group: msgspec.Raw = msgspec.field(default=_NULL, name="Process Group Name")
    group_ranks: msgspec.Raw = msgspec.field(default=_NULL, name="Process Group Ranks")
    group_size: msgspec.Raw = msgspec.field(default=_NULL, name="Group size")
    dtype: msgspec.Raw = _NULL
    in_nelems: msgspec.Raw = msgspec.field(default=_NULL, name="In msg nelems")
    out_nelems: msgspec.Raw = msgspec.field(default=_NULL, name="Out msg nelems")
    in_split: msgspec.Raw = msgspec.field(default=_NULL, name="In split size")
    out_split: msgspec.Raw = msgspec.field(default=_NULL, name="Out split size")


class _CollectiveEvent(msgspec.Struct, gc=False):
    ph: str = ""
    cat: str | None = None
    ts: float | str | None = None
    dur: float | str | None = None
    args: _CollectiveArgs | None = None


class _CollectiveDocument(msgspec.Struct):
    traceEvents: list[_CollectiveEvent]


_DECODER = msgspec.json.Decoder(_Document)
_EVENTS = msgspec.json.Decoder(list[_Event])
_COLLECTIVE_DECODER = msgspec.json.Decoder(_CollectiveDocument)
_COLLECTIVE_EVENTS = msgspec.json.Decoder(list[_CollectiveEvent])
_VALUE = msgspec.json.Decoder()

GPU_CATEGORIES = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}
# a collective kernel's record, in TraceLens's names
COLLECTIVE_FIELDS = (
    "Process Group Name",
    "Process Group Ranks",
    "Collective name",
    "Group size",
    "dtype",
    "In msg nelems",
    "Out msg nelems",
    "In split size",
    "Out split size",
)
RUNTIME_CATEGORIES = ("cuda_runtime", "cuda_driver", "hip_runtime", "hip_driver")


class TraceError(ValueError):
    """A trace that cannot be read; str() names the file and the problem."""


class NotATrace(TraceError):
    """Valid JSON that is not a profiler trace (a config beside the traces, say)."""


# One record per event the analysis keeps, untracked by the cyclic collector like the decoded
# events (none of them holds a cycle): a million of them no longer make each collection walk them.
class GpuActivity(msgspec.Struct, gc=False):
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


class Launch(msgspec.Struct, gc=False):
    name: str
    ts: float
    dur: float
    pid: int
    tid: int
    correlation: int | None
    op: int | None = None
    python: int | None = None


class PythonCall(msgspec.Struct, gc=False):
    """A python_function span (traces recorded with with_stack=True)."""

    name: str
    ts: float
    dur: float
    pid: int
    tid: int


class CpuOp(msgspec.Struct, gc=False):
    name: str
    ts: float
    dur: float
    pid: int
    tid: int
    input_dims: list | None
    input_types: list | None
    concrete: list | None = None
    strides: list | None = None  # "Input Strides", shared like the other inputs


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
    # the metadata events: pid -> process_name / process_labels, (pid, tid) -> thread_name
    process_names: dict = field(default_factory=dict)
    process_labels: dict = field(default_factory=dict)
    thread_names: dict = field(default_factory=dict)
    events: int = 0  # how many events traceEvents held
    # each CPU op's and each launch's index in traceEvents (TraceLens's UID), beside the tables:
    # machine integers, not an int object per event
    op_uids: array = field(default_factory=lambda: array("q"))
    launch_uids: array = field(default_factory=lambda: array("q"))
    # each nested CPU op's enclosing op on its thread (indices into cpu_ops), found in the sweep
    # that links launches to ops; a stage view keeps the whole trace's
    op_parents: dict[int, int] = field(default_factory=dict)
    # each collective kernel with what PyTorch recorded of its collective (COLLECTIVE_FIELDS)
    collectives: list[tuple[GpuActivity, tuple]] = field(default_factory=list)

    @property
    def kernels(self) -> list[GpuActivity]:
        return [a for a in self.gpu if a.kind == "kernel"]

    def device_name(self) -> str | None:
        """The name of the GPU the trace's work ran on: a rank's trace lists every GPU its process
        could see (rank 1 of two: GPUs 0 and 1), its own is the one its activity names."""
        if not self.device_properties:
            return None
        ran_on = self.gpu[0].device if self.gpu else None
        props = next((p for p in self.device_properties if p.get("id") == ran_on), self.device_properties[0])
        return props.get("name")


def _unreadable(path: Path, err: BaseException) -> TraceError:
    return TraceError(f"{path}: cannot decompress ({err}); is the .gz file truncated?")


def _read(path: Path) -> bytes:
    try:
        raw = path.read_bytes()
        return gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
    except FileNotFoundError:
        raise TraceError(f"{path}: file not found") from None
    except (OSError, EOFError) as err:
        raise _unreadable(path, err) from None


def decode(path: str | Path) -> _Document:
    path = Path(path)
    raw = _read(path)
    try:
        return _DECODER.decode(raw)
    except msgspec.ValidationError as err:
        raise NotATrace(f"{path}: not a PyTorch profiler (Chrome) trace ({err})") from None
    except msgspec.DecodeError as err:
        raise TraceError(f"{path}: not valid JSON ({str(err).splitlines()[0]}); truncated or not a trace?") from None


_CHUNK = 1 << 20  # decompressed bytes read (and events decoded) at a time
_HEAD_LIMIT = 64 << 20  # no "traceEvents" key in this much: not a trace laid out as profilers write them
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_AFTER_EVENT = re.compile(rb"\s*([,\]])")
_TRAILING = re.compile(r"trailing characters \(byte (\d+)\)")
_AT_BYTE = re.compile(r"\(byte (\d+)\)")


def _chunks(path: Path):
    try:
        with path.open("rb") as probe:
            zipped = probe.read(2) == b"\x1f\x8b"
        stream = gzip.open(path, "rb") if zipped else path.open("rb")
    except FileNotFoundError:
        raise TraceError(f"{path}: file not found") from None
    except OSError as err:
        raise _unreadable(path, err) from None
    with stream:
        while True:
            try:
                chunk = stream.read(_CHUNK)
            except (OSError, EOFError) as err:
                raise _unreadable(path, err) from None
            if not chunk:
                return
            yield chunk


def _stream(path: Path, take: Callable[[list], None], decoder: msgspec.json.Decoder = _EVENTS) -> _Document | None:
    """Decompress and decode the trace a few MB at a time, handing each batch of events to take
    and returning the rest of the document (its traceEvents empty): the whole text and the whole
    list of events never sit in memory at once. A batch ends after an event followed by ',' or
    ']', and is decoded as '[' + batch + ']': a cut inside a string or a nested object cannot
    decode, so a batch that does is exactly those events. None where the text is not laid out
    as a trace (no traceEvents array near the top) or does not decode: then decode() reads it
    whole and says what is wrong."""
    chunks = _chunks(path)
    head = bytearray()
    for chunk in chunks:
        head += chunk
        found = _EVENTS_KEY.search(head, max(0, len(head) - len(chunk) - 64))
        if found:
            break
        if len(head) > _HEAD_LIMIT:
            return None
    else:
        return None
    prefix, pending = bytes(head[: found.start()]), bytes(head[found.end() :])
    del head
    tail = None
    more = True
    while tail is None:
        close = pending.rfind(b"}")
        after = _AFTER_EVENT.match(pending, close + 1) if close >= 0 else None
        while close >= 0 and after is None:
            close = pending.rfind(b"}", 0, close)
            after = _AFTER_EVENT.match(pending, close + 1) if close >= 0 else None
        if after is not None:
            piece = b"".join((b"[", memoryview(pending)[: close + 1], b"]"))  # one copy, not two
            try:
                events = decoder.decode(piece)
            except msgspec.DecodeError as err:
                # the array ended inside the batch, the rest of the document behind it
                ended = _TRAILING.search(str(err))
                events = None
                wrong = _AT_BYTE.search(str(err))
                if not ended and wrong and int(wrong.group(1)) < len(piece) - 2:
                    return None  # wrong before the cut, not at it: decode() reads it whole and says where
                if ended:
                    end = piece.rindex(b"]", 0, int(ended.group(1))) + 1  # msgspec counts past the character
                    try:
                        events = decoder.decode(piece[:end])
                    except (msgspec.DecodeError, msgspec.ValidationError):
                        return None
                    take(events)
                    tail = pending[end - 1 :]
                    break
            except msgspec.ValidationError:
                return None
            del piece
            if events is not None:
                take(events)
                del events
                if after.group(1) == b"]":
                    tail = pending[after.end() :]
                    break
                pending = pending[after.end() :]
                continue
        elif pending.lstrip()[:1] == b"]":
            tail = pending.lstrip()[1:]
            break
        if not more:
            return None
        chunk = next(chunks, b"")
        more = bool(chunk)
        pending += chunk
    rest = b"".join([tail, *chunks])
    try:
        document = _DECODER.decode(prefix + b'"traceEvents": []' + rest)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    return document if not document.traceEvents else None


_EMPTY_ARGS = _Args()


@contextmanager
def collector_paused():
    """The cyclic collector off meanwhile, then as it was: a trace's millions of small objects,
    and the analysis's tables of them, hold no cycles, and the collector would only rescan them
    again and again while they are made."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


@collector_paused()
def load_trace(path: str | Path) -> Trace:
    return _load(path)


class _Decoded(dict):
    """Raw JSON text -> its value, decoded the first time it is asked for."""

    def __missing__(self, text: bytes):
        value = self[text] = _VALUE.decode(text)
        return value


class _OpInputs(dict):
    """An op's four raw inputs (Input Dims, Input type, Concrete Inputs, Input Strides) joined by
    NUL, which no JSON text holds -> their values, each distinct text decoded once: one lookup
    per op, not one per input."""

    def __init__(self) -> None:
        super().__init__()
        self.decoded = _Decoded()

    def __missing__(self, text: bytes):
        value = self[text] = tuple(self.decoded[part] for part in text.split(b"\0"))
        return value


def _tupled(value):
    return tuple(map(_tupled, value)) if isinstance(value, list) else value


class _Builder:
    """The trace's tables, filled one batch of decoded events at a time. Names, thread ids and
    op inputs repeat across millions of events: each distinct one is kept once."""

    def __init__(self) -> None:
        self.gpu: list[GpuActivity] = []
        self.launches: list[Launch] = []
        self.cpu_ops: list[CpuOp] = []
        self.python_calls: list[PythonCall] = []
        self.annotations: list[tuple[str, float, float]] = []
        self.gpu_annotations: list[tuple[str, float, float]] = []
        self.by_correlation: dict[int, int] = {}
        self.skipped: dict[str, int] = {}
        self.names: dict = {}
        self.inputs = _OpInputs()
        self.seen = 0  # events taken so far: the next one's index in traceEvents
        self.op_uids = array("q")
        self.launch_uids = array("q")
        self.process_names: dict = {}
        self.process_labels: dict = {}
        self.thread_names: dict = {}
        self.collective_kernels: list[GpuActivity] = []
        self.collectives: list[tuple[GpuActivity, tuple]] = []

    def _metadata(self, event: _Event) -> None:
        args = event.args or _EMPTY_ARGS
        kind = event.name
        try:
            if kind == "process_name":
                self.process_names[event.pid] = _VALUE.decode(args.name)
            elif kind == "process_labels":
                self.process_labels[event.pid] = _VALUE.decode(args.labels)
            elif kind == "thread_name":
                self.thread_names[(event.pid, event.tid)] = _VALUE.decode(args.name)
        except msgspec.DecodeError:
            self.skipped["metadata"] = self.skipped.get("metadata", 0) + 1

    def take_collectives(self, events: list[_CollectiveEvent]) -> None:
        """The second pass: each collective kernel's record (COLLECTIVE_FIELDS), in the order the
        first pass met them; a list as a tuple, as TraceLens groups it."""
        kernels = self.collective_kernels
        for event in events:
            args = event.args
            if event.ph != "X" or event.cat != "kernel" or args is None or args.collective is None:
                continue
            try:  # the first pass's test of a kernel, so that the two meet the same ones
                float(event.ts), float(event.dur or 0.0)
            except (TypeError, ValueError):
                continue
            kernel = kernels[len(self.collectives)]
            try:
                values = [
                    _VALUE.decode(raw)
                    for raw in (
                        args.group,
                        args.group_ranks,
                        args.group_size,
                        args.dtype,
                        args.in_nelems,
                        args.out_nelems,
                        args.in_split,
                        args.out_split,
                    )
                ]
            except msgspec.DecodeError:
                self.skipped["collective"] = self.skipped.get("collective", 0) + 1
                values = [None] * 8
            values.insert(2, args.collective)
            self.collectives.append((kernel, tuple(map(_tupled, values))))

    def take(self, events: list[_Event]) -> None:
        gpu, launches, cpu_ops, by_correlation = self.gpu, self.launches, self.cpu_ops, self.by_correlation
        skipped, same, inputs, join = self.skipped, self.names.setdefault, self.inputs, b"\0".join
        op_uids, launch_uids = self.op_uids, self.launch_uids
        first = self.seen
        self.seen += len(events)
        for uid, event in enumerate(events, first):
            if event.ph != "X":
                if event.ph == "M":
                    self._metadata(event)
                continue
            cat = event.cat
            args = event.args or _EMPTY_ARGS
            try:
                ts, dur = float(event.ts), float(event.dur or 0.0)
                name = same(event.name, event.name)
                if cat == "cpu_op":  # the most frequent first; the categories exclude each other
                    pid, tid = event.pid, event.tid
                    raw_inputs = join((args.input_dims, args.input_type, args.concrete, args.strides))
                    cpu_ops.append(CpuOp(name, ts, dur, same(pid, pid), same(tid, tid), *inputs[raw_inputs]))
                    op_uids.append(uid)
                elif cat in GPU_CATEGORIES:
                    gpu.append(
                        GpuActivity(
                            name, GPU_CATEGORIES[cat], ts, dur, args.device or 0, args.stream or 0, args.correlation
                        )
                    )
                    if args.collective is not None and cat == "kernel":
                        self.collective_kernels.append(gpu[-1])
                elif cat in RUNTIME_CATEGORIES:
                    pid, tid = event.pid, event.tid
                    if args.correlation is not None:
                        by_correlation[args.correlation] = len(launches)
                    launches.append(Launch(name, ts, dur, same(pid, pid), same(tid, tid), args.correlation))
                    launch_uids.append(uid)
                elif cat == "python_function":
                    pid, tid = event.pid, event.tid
                    self.python_calls.append(PythonCall(name, ts, dur, same(pid, pid), same(tid, tid)))
                elif cat == "user_annotation":
                    self.annotations.append((name, ts, dur))
                elif cat == "gpu_user_annotation":
                    self.gpu_annotations.append((name, ts, dur))
            except (TypeError, ValueError):
                skipped[cat or "?"] = skipped.get(cat or "?", 0) + 1


def _load(path: str | Path) -> Trace:
    built = _Builder()
    data = _stream(Path(path), built.take)
    streamed = data is not None
    if not streamed:  # not laid out as profilers write traces: read whole (and told what is wrong)
        built = _Builder()
        data = decode(path)
        built.take(data.traceEvents)
        data.traceEvents = []
    if built.collective_kernels:
        if streamed:
            _stream(Path(path), built.take_collectives, _COLLECTIVE_EVENTS)
        else:
            built.take_collectives(_COLLECTIVE_DECODER.decode(_read(Path(path))).traceEvents)
    trace = Trace(
        str(path),
        (data.distributedInfo or {}).get("rank"),
        data.deviceProperties or [],
        built.gpu,
        built.launches,
        built.cpu_ops,
        built.python_calls,
        built.annotations,
        built.gpu_annotations,
        skipped=built.skipped,
        process_names=built.process_names,
        process_labels=built.process_labels,
        thread_names=built.thread_names,
        events=built.seen,
        op_uids=built.op_uids,
        launch_uids=built.launch_uids,
        collectives=built.collectives,
    )
    _link(trace, built.by_correlation)
    return trace


def _link(trace: Trace, by_correlation: dict[int, int]) -> None:
    missing_launch = 0
    for activity in trace.gpu:
        index = by_correlation.get(activity.correlation) if activity.correlation is not None else None
        if index is None:
            missing_launch += activity.kind == "kernel"
        activity.launch = index
    for index, op in _innermost(trace.cpu_ops, trace.launches, trace.op_parents):
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


_THREAD, _START, _DURATION = attrgetter("pid", "tid"), attrgetter("ts"), attrgetter("dur")


def _innermost(spans: list, points: list, nesting: dict[int, int] | None = None):
    """(point index, index of the innermost span around it on its thread) for each point
    inside one: one sweep per thread over both, sorted by time (a span before a point at the
    same time, a longer span before a shorter one). With `nesting`, each span nested in another
    gets its innermost enclosing span there."""
    streams: dict[tuple, list] = {}
    # the sort items made by zip and map, not one Python step per field (600k ops and launches at 1M events)
    for thread, item in chain(
        zip(map(_THREAD, spans), zip(map(_START, spans), repeat(0), map(neg, map(_DURATION, spans)), count())),
        zip(map(_THREAD, points), zip(map(_START, points), repeat(1), repeat(0.0), count())),
    ):
        streams.setdefault(thread, []).append(item)
    for items in streams.values():
        items.sort()
        open_spans: list[int] = []
        ends: list[float] = []  # where each open span ends (ts - -dur is ts + dur, to the last bit)
        for ts, kind, negative_dur, index in items:
            while ends and ends[-1] < ts:
                ends.pop()
                open_spans.pop()
            if kind == 0:
                if nesting is not None and open_spans:
                    nesting[index] = open_spans[-1]
                open_spans.append(index)
                ends.append(ts - negative_dur)
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
