"""Timing the evaluator vouches for (on the CPU; on a GPU where `timing.vouched` asks, in
device memory, `DeviceRegion`): batches of calls on input sets the worker has never seen,
whose outputs land where the evaluator reads them.

A timer inside the worker's process can be replaced by the code it times, and nothing seen
from outside bounds how fast the work inside went unless the number of calls is proven too.
So the number that ranks is the evaluator's own clock over a request, divided by the calls
it asked for, and the calls are proven by their outputs:

- a `Region`, a file in the worker's scratch folder, holds one batch's input sets and a slot
  for every call's outputs; the worker maps it once (`WorkerViews`), the evaluator reads and
  writes it with pread/pwrite only (a worker that shrank the file could make a mapping fault
  in the judge's process);
- before each batch, with the worker stopped, the evaluator writes input sets of new seeds
  (new values on every call: nothing kept from an earlier call helps) and fills the output
  slots with NaN; the worker calls the implementation once per set, in order, copying each
  output into its slot (`run_batch`); once it answers it is stopped again before a byte is
  read: an output computed after the answer is never seen;
- every output slot must have been written (no NaN left) and a sample of the calls, chosen
  after the answer, must match the reference, with their input sets unchanged.

Per call: what the batch took, over its calls, less what the same loop costs the evaluator
around a call that does nothing (`HarnessPrice`, the copy of one output included).
What it took, with one torch thread (the default): the CPU time the kernel counted for every
process of the worker, each by its CPU clock (every thread it has had, ended ones included)
and the children it reaped (`TreeTimes`), which no waiting stretches and no code in the worker
can lower but by doing less; with more threads, the wall time from the request until
the worker has stopped, less the time the kernel reports that its calling thread and the
evaluator waited for a CPU while none of its threads ran (`busy_wall_ns`). The worker's own
handling of the request (tens of µs) stays in, spread over a batch of milliseconds.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import math
import os
import random
import time
from collections.abc import Sequence
from pathlib import Path

from magpie.harness.checks import as_tuple
from magpie.supervision import scratch
from magpie.supervision.process import descendants

ALIGN = 64
# A batch's input sets and outputs fit in this; a set larger than it is timed one call a batch.
REGION_BYTES = 128 << 20
# On a GPU more: a batch must hold milliseconds of calls of large kernels, the request's own
# round trip being tens of µs; at most this share of the free device memory a worker.
DEVICE_REGION_BYTES = 8 << 30
DEVICE_REGION_SHARE = 16
# A reference call slower than this has the copy of its outputs priced alone (`copy_ns_per_call`).
SLOW_REFERENCE_S = 0.002
MAX_CALLS = 1024
# A GPU batch's gate sleeps at least this long, at most GATE_MAX_NS (`DeviceRegion`).
GATE_MIN_NS = 200_000
GATE_MAX_NS = 50_000_000
# The copies into the slots are timed this many times, the least counted (`copy_ns_per_call`):
# priced from the best of 3, a 1 MiB output's copy read 0.96-2.37 µs in one sweep on the H200.
COPY_RUNS = 10
# Output slots checked against the reference per batch, chosen after the worker answered.
CHECKED_PER_BATCH = 3
# A batch handed over one call at a time (`run_handed_over`): the control file holds two
# counters, the sets released and the calls done; a worker that sees no set released for this
# long gives up.
CONTROL_BYTES = 16
HANDOVER_WAIT_S = 60.0
# On a GPU its words lie behind the region (`DeviceRegion.start_handover`), set to UNBLOCKED to
# let every wait go (`release_handover`); its first sleep is this long (a batch's queueing by both
# processes: about 30 µs a call), and the evaluator looks for its end this often.
WORDS_BYTES = ALIGN
UNBLOCKED = 1 << 30
HANDOVER_SLEEP_NS = 2_000_000
HANDOVER_POLL_S = 0.0002


class BatchOutputError(RuntimeError):
    """An output of a timed call that is not a tensor of its slot's shape and dtype."""


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _nbytes(t) -> int:
    return t.numel() * t.element_size()


class Layout:
    """Where each call's input tensors and output slots lie in the region: all input sets first
    (set j at j * in_stride), then all output slots (call j's at out_base + j * out_stride), so
    that a batch's inputs and its outputs are two ranges, one write and one read each. The
    first set's arguments are ("tensor", offset, shape, dtype) or ("value", v), its outputs
    (offset from out_base, shape, dtype); every set of a timing job has the same shapes: one
    layout serves each batch."""

    def __init__(self, example_args: tuple, example_outputs, calls: int):
        import torch

        self.args, offset = [], 0
        for x in example_args:
            if torch.is_tensor(x):
                self.args.append(["tensor", offset, list(x.shape), str(x.dtype).replace("torch.", "")])
                offset += _aligned(_nbytes(x))
            else:
                self.args.append(["value", x])
        self.in_stride = max(offset, ALIGN)
        self.outs, offset = [], 0
        for e in as_tuple(example_outputs):
            self.outs.append([offset, list(e.shape), str(e.dtype).replace("torch.", "")])
            offset += _aligned(_nbytes(e))
        self.out_stride = max(offset, ALIGN)
        self.calls = calls
        self.out_base = calls * self.in_stride
        self.size = self.out_base + calls * self.out_stride

    def set_slots(self, call: int) -> list:
        """(offset, shape, dtype) of each input tensor of set `call`."""
        shift = call * self.in_stride
        return [(a[1] + shift, a[2], a[3]) for a in self.args if a[0] == "tensor"]

    def output_slots(self, call: int) -> list:
        """(offset, shape, dtype) of each output slot of call `call`."""
        shift = self.out_base + call * self.out_stride
        return [(o[0] + shift, o[1], o[2]) for o in self.outs]

    def arguments(self, tensors: list) -> tuple:
        """A call's arguments: `tensors` in the places of its tensors, its plain values in theirs."""
        given = iter(tensors)
        return tuple(next(given) if a[0] == "tensor" else a[1] for a in self.args)

    def input_views(self, torch, region) -> CallViews:
        """Per call, views of its input tensors in `region` (a flat uint8 tensor)."""
        return CallViews(self.calls, lambda call: _views(torch, region, self.set_slots(call)))

    def output_views(self, torch, region) -> CallViews:
        """Per call, views of its output slots in `region`."""
        return CallViews(self.calls, lambda call: _views(torch, region, self.output_slots(call)))

    _SENT = ("args", "outs", "calls", "in_stride", "out_stride", "size")  # what the worker is told

    def to_json(self) -> dict:
        return {key: getattr(self, key) for key in self._SENT}

    @classmethod
    def from_json(cls, data: dict) -> Layout:
        layout = cls.__new__(cls)
        for key in cls._SENT:
            setattr(layout, key, data[key])
        layout.out_base = layout.calls * layout.in_stride
        return layout


class CallViews(Sequence):
    """Per call, a view of it in a region (`make(call)`), made the first time that call is
    asked for: a region holds up to MAX_CALLS calls, a batch often uses a few of them."""

    def __init__(self, calls: int, make):
        self._calls, self._make, self._made = calls, make, {}

    def __len__(self) -> int:
        return self._calls

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._calls))]
        if not -self._calls <= index < self._calls:
            raise IndexError(index)
        index %= self._calls
        if index not in self._made:
            self._made[index] = self._make(index)
        return self._made[index]


def calls_that_fit(example_args: tuple, example_outputs, budget: int = REGION_BYTES) -> int:
    """How many calls' inputs and outputs a region of `budget` bytes holds (at least one)."""
    per_call = Layout(example_args, example_outputs, 1).size
    return max(1, min(MAX_CALLS, budget // per_call))


def region_bytes(torch, device: str) -> int:
    """The size of one worker's region on `device`."""
    if not device.startswith("cuda"):
        return REGION_BYTES
    free, _ = torch.cuda.mem_get_info(torch.device(device))
    return max(REGION_BYTES, min(DEVICE_REGION_BYTES, free // DEVICE_REGION_SHARE))


def _views(torch, region, offsets: list) -> list:
    """Tensors over `region` (a flat uint8 tensor) at (offset, shape, dtype) each."""
    out = []
    for offset, shape, dtype in offsets:
        kind = getattr(torch, dtype)
        out.append(region[offset:offset + math.prod(shape) * kind.itemsize].view(kind).view(shape))
    return out


def _copy_sets(torch, input_sets: list, views: CallViews) -> None:
    """Each set's tensors into its call's views."""
    for args, tensors in zip(input_sets, views):
        for x, view in zip((a for a in args if torch.is_tensor(a)), tensors):
            view.copy_(x)


class Region:
    """The evaluator's side of one worker's region: a copy of it in the evaluator's memory,
    written to and read from the file in whole ranges."""

    def __init__(self, torch, folder: Path, layout: Layout):
        self.torch = torch
        self.layout = layout
        self.path = folder / "batch-region"
        self.fd = scratch.create(self.path)
        os.ftruncate(self.fd, layout.size)
        self.control_path = folder / "batch-control"
        self.control_fd = scratch.create(self.control_path)
        os.ftruncate(self.control_fd, CONTROL_BYTES)
        self.caller = 0  # the pid of the worker process that runs the calls, once it is known
        self.copy = torch.zeros(layout.size, dtype=torch.uint8)
        self._bytes = memoryview((ctypes.c_char * layout.size).from_address(self.copy.data_ptr())).cast("B")
        self._inputs = layout.input_views(torch, self.copy)
        self._outputs = layout.output_views(torch, self.copy)
        # what every output slot holds before a batch: NaN in floating slots, to show unwritten ones
        one = torch.zeros(layout.out_stride, dtype=torch.uint8)
        for slot in _views(torch, one, layout.outs):
            slot.fill_(float("nan") if slot.is_floating_point() else 0)
        self._poison = ctypes.string_at(one.data_ptr(), layout.out_stride) * layout.calls

    def offer(self) -> dict:
        return {"file": str(self.path), "control": str(self.control_path), "layout": self.layout.to_json()}

    def write(self, input_sets: list) -> None:
        """This batch's input sets, and the pre-batch fill of their calls' output slots."""
        layout = self.layout
        _copy_sets(self.torch, input_sets, self._inputs)
        calls = len(input_sets)
        os.pwrite(self.fd, self._bytes[:calls * layout.in_stride], 0)
        os.pwrite(self.fd, self._poison[:calls * layout.out_stride], layout.out_base)

    def read(self, calls: int) -> None:
        """What the worker left in the first `calls` output slots (input sets are read one by
        one, for the calls the checks pick: `inputs`)."""
        layout = self.layout
        outputs = calls * layout.out_stride
        got = os.preadv(self.fd, [self._bytes[layout.out_base:layout.out_base + outputs]], layout.out_base)
        # what is missing reads as the fill it had before the batch, byte for byte: unwritten
        self._bytes[layout.out_base + got:layout.out_base + outputs] = self._poison[got:outputs]

    def start_handover(self, input_sets: list) -> None:
        """Before a batch handed over one call at a time (`run_handed_over`): no set released,
        the worker not yet waiting for one, its sets ready in the evaluator's copy (`hand_over`
        writes each out), its output slots filled (in the file and in the evaluator's copy, which
        keeps what each call left when it said it was done)."""
        layout = self.layout
        calls = len(input_sets)
        _copy_sets(self.torch, input_sets, self._inputs)
        os.pwrite(self.control_fd, (0).to_bytes(8, "little") + (-1).to_bytes(8, "little", signed=True), 0)
        os.pwrite(self.fd, self._poison[:calls * layout.out_stride], layout.out_base)
        self._bytes[layout.out_base:layout.out_base + calls * layout.out_stride] = \
            self._poison[:calls * layout.out_stride]

    def put(self, call: int) -> None:
        """Input set `call` into its slot: until now the slot held the last batch's."""
        stride = self.layout.in_stride
        os.pwrite(self.fd, self._bytes[call * stride:(call + 1) * stride], call * stride)

    def release(self, call: int) -> None:
        """Input set `call`, put in its slot, released to the worker."""
        os.pwrite(self.control_fd, (call + 1).to_bytes(8, "little"), 0)

    def end_handover(self) -> None:
        """The handed-over batch has ended (`run_handed_over` returns)."""
        os.pwrite(self.control_fd, (-1).to_bytes(8, "little", signed=True), 0)

    def calls_done(self) -> int:
        """How many calls of a handed-over batch the worker says are done (-1: it has not yet
        said it waits for the first set)."""
        said = os.pread(self.control_fd, 8, 8)
        return int.from_bytes(said, "little", signed=True) if len(said) == 8 else -1

    def take_output(self, call: int) -> None:
        """Call `call`'s output slots as they are now, into the evaluator's copy: what the checks
        of a handed-over batch read (what the worker writes there later is never seen)."""
        layout = self.layout
        start = layout.out_base + call * layout.out_stride
        got = os.preadv(self.fd, [self._bytes[start:start + layout.out_stride]], start)
        self._bytes[start + got:start + layout.out_stride] = self._poison[got:layout.out_stride]

    def picks(self, calls: int) -> list[int]:
        """The calls whose outputs are checked against the reference, chosen now."""
        return _sample_calls(calls)

    def outputs(self, call: int) -> tuple:
        return tuple(view.clone() for view in self._outputs[call])

    def inputs(self, call: int) -> tuple:
        """What the worker left in the input set of `call`."""
        stride = self.layout.in_stride
        got = os.preadv(self.fd, [self._bytes[call * stride:(call + 1) * stride]], call * stride)
        self._bytes[call * stride + got:(call + 1) * stride] = bytes(stride - got)  # past the end of a shrunk file
        return self.layout.arguments([view.clone() for view in self._inputs[call]])

    def unwritten(self, calls: int) -> int | None:
        """The first call (of the first `calls`) with a floating output still holding NaN, the
        value each slot held before the batch; None where every slot was written."""
        return _first(self._nan_left(calls))

    def _nan_left(self, calls: int, aside=None):
        """Per call of the first `calls`, whether a floating output of it holds NaN (None where
        no output is floating). One look per output of a call, over all the calls' slots of it
        at once (they lie `out_stride` apart); on a GPU, queued without waiting for it. `aside`:
        output slots copied out of the region, the first call's at its start."""
        torch, stride = self.torch, self.layout.out_stride
        buffer, shift = (self.copy, 0) if aside is None else (aside, self.layout.out_base)
        found = None
        for offset, shape, dtype in self.layout.output_slots(0):
            kind = getattr(torch, dtype)
            numel = math.prod(shape)
            if not kind.is_floating_point or not numel or not calls:
                continue
            offset -= shift
            span = buffer[offset:offset + (calls - 1) * stride + numel * kind.itemsize].view(kind)
            rows = span.as_strided((calls, numel), (stride // kind.itemsize, 1)).isnan().any(dim=1)
            found = rows if found is None else found | rows
        return found

    def close(self) -> None:
        os.close(self.fd)
        os.close(self.control_fd)
        for path in (self.path, self.control_path):
            path.unlink(missing_ok=True)


class DeviceRegion(Region):
    """A region in GPU memory: one allocation in a memory pool of its own, lent to the worker
    through CUDA IPC once (IPC lends the whole allocator segment: nothing else may lie in it),
    written and read by the evaluator in place. Unlike a file it cannot shrink; unlike a stopped
    process, GPU work the worker queued can still run while it is stopped.

    A batch runs from a full queue, behind a gate: before the request the evaluator's stream
    sleeps on the GPU (`torch.cuda._sleep`), then copies the batch's input sets into the region
    (staged in its own memory), then records the clock's first event and an interprocess event
    (the gate); the worker's stream waits on the gate before its calls and records an
    interprocess event of its own behind them. So the calls run back to back once the gate
    opens, whatever the host's launch rate, and the clock is the evaluator's pair of CUDA events
    around them: the GPU's time, not the two processes' round trip. The input sets are in place
    only once the gate opens: work started early (on a stream that skips the gate) sees the last
    batch's inputs. The sleep is twice how long the worker took to answer (`next_sleep_ns`); a
    worker that answered after the gate opened (it synchronised inside its calls, or its
    launches filled the queue) had its launches timed too, which reads slower, never faster
    (`opened_early`). In the same stream, right behind the clock's end, the evaluator takes what
    it checks: which slots still hold the NaN they were filled with, and copies of the outputs
    of a few calls chosen then. Work the worker left running behind its event has either written
    those outputs by then or fails the checks; a probe after the checks that still waits on it
    fails the batch (`BatchMeasurement._device_batch`)."""

    def __init__(self, torch, layout: Layout, device: str, graph: bool = False):
        from magpie.harness.exchange import dumps_shared

        self.torch = torch
        self.layout = layout
        self.caller = 0
        self.graph = graph  # each batch one replay of a CUDA graph of its calls (`Worker.batch_graph`)
        self.captured: set[int] = set()  # the batch sizes the worker has a graph of
        self.captured_handed_over: set[int] = set()  # and of batches handed over one call at a time
        self._pool = torch.cuda.MemPool()
        with torch.cuda.use_mem_pool(self._pool):
            # behind the calls' sets and slots, two words of a batch handed over one call at a
            # time (`start_handover`): [sets released, calls done]
            self.copy = torch.empty(layout.size + WORDS_BYTES, dtype=torch.uint8, device=device)
        self._words = self.copy[layout.size:layout.size + 8].view(torch.int32)
        self._unblock = torch.full((2,), UNBLOCKED, dtype=torch.int32).pin_memory()
        self._aside = None  # a handed-over batch's outputs, copied out as each call said it was done
        self._handover: tuple | None = None  # its clock's events and its first release's
        self.handover_sleep_ns = HANDOVER_SLEEP_NS
        self._inputs = layout.input_views(torch, self.copy)
        self._outputs = layout.output_views(torch, self.copy)
        self._lent = dumps_shared(self.copy)
        # the input sets wait here, in the evaluator's own memory, until the gate (`start`)
        self._staging = torch.empty(layout.out_base, dtype=torch.uint8, device=device)
        self._staged = layout.input_views(torch, self._staging)
        self._staged_bytes = 0
        self._done = torch.cuda.Event(interprocess=True)  # the worker records it behind a batch's calls
        self._gate = torch.cuda.Event(interprocess=True)  # the worker's calls wait on it
        self._lent_events = {"done_event": dumps_shared(self._done), "gate_event": dumps_shared(self._gate)}
        self._beacon = torch.zeros(1, device=device)
        self._clock: tuple | None = None
        self._taken: dict = {}
        self.sleep_ns = GATE_MIN_NS
        self._opened_early = False
        self._cycles_per_ns = self._sleep_rate()
        self.idle_probe_ns = min(self.probe_ns() for _ in range(5))

    def offer(self) -> dict:
        return {"ipc": self._lent, **self._lent_events, "layout": self.layout.to_json(), "words_at": self.layout.size}

    def write(self, input_sets: list) -> None:
        """The output slots filled with NaN now; the input sets staged, copied in as one range
        once the gate's sleep is over (`start`)."""
        _copy_sets(self.torch, input_sets, self._staged)
        self._staged_bytes = len(input_sets) * self.layout.in_stride
        for outs in self._outputs[:len(input_sets)]:
            for slot in outs:
                slot.fill_(float("nan") if slot.is_floating_point() else 0)
        self._words.zero_()
        self._taken = {}
        self.torch.cuda.synchronize()

    def start_handover(self, calls: int) -> None:
        """Queued before a batch handed over one call at a time is asked for: the sleep, the
        clock's first event, then per call its input set copied into its slot and released (the
        word the worker's stream waits on, `stream_words`), the wait for the worker's word that
        the call is done, and the call's outputs copied aside as they were then; the clock's
        last event. The worker cannot see a set before the call ahead of it said it was done,
        nor finish a call after: calls that cannot be done together, whose steps each cost the
        GPU's switch between the processes both ways too (`BatchMeasurement._alone`)."""
        from magpie.harness import stream_words

        torch, layout = self.torch, self.layout
        cuda = torch.cuda
        in_stride, out_stride, out_base = layout.in_stride, layout.out_stride, layout.out_base
        if self._aside is None or self._aside.numel() < calls * out_stride:
            self._aside = torch.empty(calls * out_stride, dtype=torch.uint8, device=self.copy.device)
        stream = cuda.current_stream()
        released, done = self._words.data_ptr(), self._words.data_ptr() + 4
        clock = (cuda.Event(enable_timing=True), cuda.Event(enable_timing=True))
        first_release = cuda.Event()
        cuda._sleep(int(self.handover_sleep_ns * self._cycles_per_ns))
        clock[0].record()
        for call in range(calls):
            self.copy[call * in_stride:(call + 1) * in_stride].copy_(
                self._staging[call * in_stride:(call + 1) * in_stride])
            stream_words.write(stream, released, call + 1)
            if not call:
                first_release.record()
            stream_words.wait_at_least(stream, done, call + 1)
            self._aside[call * out_stride:(call + 1) * out_stride].copy_(
                self.copy[out_base + call * out_stride:out_base + (call + 1) * out_stride])
        clock[1].record()
        self._handover = (clock, first_release, calls)

    def handover_answered(self, answer_ns: int) -> bool:
        """Once the worker answered that its calls are queued, `answer_ns` after
        `start_handover` began: whether the first set was released before (its queueing was
        timed too); the next sleep (`next_sleep_ns`)."""
        opened_early = self._handover[1].query()
        self.handover_sleep_ns = next_sleep_ns(answer_ns, opened_early, False, self.handover_sleep_ns)
        return opened_early

    def end_handover(self, deadline: float) -> float:
        """GPU ns of the batch handed over (`start_handover`) once its last event has run; what
        the checks read taken from the outputs copied aside. Past the monotonic `deadline`, the
        words are set so that nothing waits on them any more (a worker that never says its call
        is done would hold the evaluator's stream for good) and TimeoutError is raised."""
        clock, _, calls = self._handover
        while not clock[1].query():
            if time.monotonic() > deadline:
                self.release_handover()
                raise TimeoutError("a call handed over was not said to be done in time")
            time.sleep(HANDOVER_POLL_S)
        stride = self.layout.out_stride
        picks = _sample_calls(calls)
        self._taken = {"nan_left": self._nan_left(calls, self._aside), "picks": picks,
                       "outputs": {c: tuple(_views(self.torch, self._aside, [(o[0] + c * stride, o[1], o[2])
                                                                              for o in self.layout.outs]))
                                   for c in picks}}
        return clock[0].elapsed_time(clock[1]) * 1e6

    def release_handover(self) -> None:
        """Every wait of a batch handed over, the evaluator's and the worker's, let go: the words
        written from a stream of their own, by a copy (no kernel: its first launch could wait
        on the stream that waits on the words)."""
        torch = self.torch
        side = torch.cuda.Stream(self.copy.device)
        with torch.cuda.stream(side):
            self._words.copy_(self._unblock, non_blocking=True)
        side.synchronize()
        torch.cuda.synchronize(self.copy.device)

    def start(self) -> None:
        """Queued before the batch's request is sent: the sleep, the input sets' copy, the
        clock's first event, then the gate (the GPU may switch to the worker's process as soon
        as the gate opens: the clock has started by then)."""
        cuda = self.torch.cuda
        self._clock = (cuda.Event(enable_timing=True), cuda.Event(enable_timing=True))
        cuda._sleep(int(self.sleep_ns * self._cycles_per_ns))
        self.copy[:self._staged_bytes].copy_(self._staging[:self._staged_bytes])
        self._clock[0].record()
        self._gate.record()

    def answered(self, answer_ns: int) -> bool:
        """Once the worker answered, `answer_ns` after `start`: whether the gate had opened
        already (its launches were timed too); the next sleep (`next_sleep_ns`)."""
        opened_early = self._gate.query()
        self.sleep_ns = next_sleep_ns(answer_ns, opened_early, self._opened_early, self.sleep_ns)
        self._opened_early = opened_early
        return opened_early

    def _sleep_rate(self) -> float:
        """The GPU's sleep cycles per ns, from the quickest of a few timed sleeps (a faster clock
        sleeps less: the gate's sleep is sized at the quickest)."""
        cuda = self.torch.cuda
        cycles, rates = 1_000_000, []
        for _ in range(3):
            pair = (cuda.Event(enable_timing=True), cuda.Event(enable_timing=True))
            pair[0].record()
            cuda._sleep(cycles)
            pair[1].record()
            pair[1].synchronize()
            rates.append(cycles / (pair[0].elapsed_time(pair[1]) * 1e6))
        return max(rates)

    def stop_clock(self, calls: int) -> None:
        """Queued once the worker answered: the batch's last event behind the worker's, then
        what the checks read (`unwritten`, `picks`, `outputs`), taken at that point."""
        torch = self.torch
        torch.cuda.current_stream().wait_event(self._done)
        self._clock[1].record()
        picks = _sample_calls(calls)
        self._taken = {"nan_left": self._nan_left(calls), "picks": picks,
                       "outputs": {c: tuple(v.clone() for v in self._outputs[c]) for c in picks}}

    def taken_ns(self) -> float:
        """GPU time between the batch's two events."""
        self._clock[1].synchronize()
        return self._clock[0].elapsed_time(self._clock[1]) * 1e6

    def finish(self) -> None:
        """Returns once this process's own small kernel, queued now, has run: the GPU has
        finished, or yielded, what the worker queued before."""
        self._beacon.add_(1)
        self.torch.cuda.synchronize()

    def probe_ns(self) -> int:
        started = time.perf_counter_ns()
        self.finish()
        return time.perf_counter_ns() - started

    def read(self, calls: int) -> None:
        """The outputs are read in place."""

    def inputs(self, call: int) -> tuple:
        """The input set of `call` as the worker left it, in place (no copy: what the checks
        compare them with is read at once)."""
        return self.layout.arguments(list(self._inputs[call]))

    def picks(self, calls: int) -> list[int]:
        return self._taken["picks"]

    def outputs(self, call: int) -> tuple:
        return self._taken["outputs"][call]

    def unwritten(self, calls: int) -> int | None:
        return _first(self._taken["nan_left"])

    def close(self) -> None:
        del self._inputs, self._outputs, self.copy, self._taken, self._staged, self._staging, self._words, self._aside
        self.torch.cuda.synchronize()
        del self._pool


def next_sleep_ns(answer_ns: int, opened_early: bool, opened_early_before: bool, sleep_ns: int) -> int:
    """How long a gate sleeps before the next batch: twice the worker's last answer, within
    GATE_MIN_NS and GATE_MAX_NS; kept as it was where the gate opened early twice running
    (calls that synchronise wait for the gate themselves: their answers grow with every
    sleep, and no sleep would hold them)."""
    if opened_early and opened_early_before:
        return sleep_ns
    return min(GATE_MAX_NS, max(GATE_MIN_NS, 2 * answer_ns))


def _sample_calls(calls: int) -> list[int]:
    """CHECKED_PER_BATCH of a batch's calls (or all of fewer), chosen by the system's randomness."""
    return random.SystemRandom().sample(range(calls), min(calls, CHECKED_PER_BATCH))


def _first(flags) -> int | None:
    """The index of the first true flag, None where there is none (or no flags)."""
    if flags is None:
        return None
    found = flags.nonzero()
    return int(found[0, 0]) if len(found) else None


class WorkerViews:
    """The worker's side: tensors that are views of the region it mapped once."""

    def __init__(self, torch, offer: dict):
        self.done = self.gate = self.mark = self.control = self.words = None
        layout = Layout.from_json(offer["layout"])
        if "ipc" in offer:
            from magpie.harness.exchange import loads_shared

            region = loads_shared(offer["ipc"])
            # [sets released, calls done] of a batch handed over one call at a time (`run_handed_over_on_gpu`)
            self.words = region[offer["words_at"]:offer["words_at"] + 8].view(torch.int32)
            self.done = loads_shared(offer["done_event"])  # recorded behind each batch's calls
            self.gate = loads_shared(offer["gate_event"])  # waited on before them
            self.mark = torch.zeros(1, device=region.device)  # the kernel of a calibration batch's own
        else:
            region = torch.from_file(offer["file"], shared=True, size=int(layout.size), dtype=torch.uint8)
            # [sets released, calls done] of a batch handed over one call at a time (`run_handed_over`)
            self._control = torch.from_file(offer["control"], shared=True, size=2, dtype=torch.int64)
            self.control = (ctypes.c_int64 * 2).from_address(self._control.data_ptr())
        tensors, slots = layout.input_views(torch, region), layout.output_views(torch, region)
        self.inputs = CallViews(layout.calls, lambda call: layout.arguments(tensors[call]))
        self.outputs = CallViews(layout.calls, lambda call: tuple(slots[call]))


def run_batch(torch, fn, inputs: list, outputs: list) -> None:
    """One call per input set, in order, each output copied into its slot."""
    for args, slots in zip(inputs, outputs):
        produced = fn(*args)
        produced = produced if isinstance(produced, (tuple, list)) else (produced,)
        if len(produced) != len(slots):
            raise BatchOutputError(f"a timed call returned {len(produced)} outputs, expected {len(slots)}")
        for value, slot in zip(produced, slots):
            if not isinstance(value, torch.Tensor) or value.shape != slot.shape or value.dtype != slot.dtype:
                raise BatchOutputError("a timed call returned an output that is not a plain tensor of the "
                                       "reference's shape and dtype")
            slot.copy_(value)


def run_handed_over(torch, fn, inputs: Sequence, outputs: Sequence, control) -> None:
    """`run_batch` one call at a time, as the evaluator writes each input set and releases it
    (`control[0]`, the sets released) once the last call said it was done (`control[1]`, the
    calls done), taking that call's outputs as they were then (`Region.take_output`): calls that
    see their sets one by one cannot be done together. The worker is not told how many calls a
    batch holds; -1 in `control[0]` ends the batch. It looks for each release without
    sleeping, on a CPU of its own (`apart`): a call after a sleep runs from cold caches, which
    would cost handed-over calls more than batched ones, by how much depending on the code."""
    deadline = time.monotonic() + HANDOVER_WAIT_S
    control[1] = 0  # waiting for the first set
    call = 0
    while True:
        looked = 0
        while 0 <= control[0] <= call:
            looked += 1
            if not looked % 4096 and time.monotonic() > deadline:
                raise TimeoutError(f"no input set released in {HANDOVER_WAIT_S:g} s")
        if control[0] < 0:
            return
        run_batch(torch, fn, inputs[call:call + 1], outputs[call:call + 1])
        call += 1
        control[1] = call


def run_handed_over_on_gpu(torch, fn, inputs: Sequence, outputs: Sequence, words, calls: int) -> None:
    """`run_batch`'s calls queued one by one, each behind a wait for its input set's release
    and followed by the word that it is done (`DeviceRegion.start_handover`): the GPU runs a call
    once the evaluator's stream has put its set in place, and the evaluator's stream takes its
    outputs once it is done."""
    from magpie.harness import stream_words

    stream = torch.cuda.current_stream()
    released, done = words.data_ptr(), words.data_ptr() + 4
    for call in range(calls):
        stream_words.wait_at_least(stream, released, call + 1)
        run_batch(torch, fn, inputs[call:call + 1], outputs[call:call + 1])
        stream_words.write(stream, done, call + 1)


def _threads(pid: int) -> list[int]:
    """Every thread of `pid` and of its descendants."""
    found = []
    for process in descendants(pid):
        with contextlib.suppress(OSError):  # it ended meanwhile
            found.extend(int(tid) for tid in os.listdir(f"/proc/{process}/task"))
    return found


@contextlib.contextmanager
def apart(pids: list[int]):
    """While batches are handed over one call at a time: the calling thread on one allowed CPU,
    every thread of the processes `pids` and their descendants on another, their CPU masks
    restored after. Each side looks for the other's word without sleeping; on one CPU, or on
    CPUs the scheduler lets them share, each would wait out the other's time slice (on the
    2-CPU machine, 4-11 ms in one batch of four, instead of 10 µs). Yields the workers' CPU,
    or None, changing nothing, where fewer than two CPUs are allowed."""
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        yield None
        return
    masks = {0: os.sched_getaffinity(0)}
    for pid in pids:
        for tid in _threads(pid):
            with contextlib.suppress(OSError):  # a thread that ended meanwhile
                masks[tid] = os.sched_getaffinity(tid)
                os.sched_setaffinity(tid, {allowed[1]})
    os.sched_setaffinity(0, {allowed[0]})
    try:
        yield allowed[1]
    finally:
        for tid, mask in masks.items():
            with contextlib.suppress(OSError):
                os.sched_setaffinity(tid, mask)


def moved_threads(pid: int, cpu: int) -> list[int]:
    """The threads of `pid` and its descendants whose CPU mask is no longer {cpu} (`apart`)."""
    moved = []
    for tid in _threads(pid):
        with contextlib.suppress(OSError):
            if os.sched_getaffinity(tid) != {cpu}:
                moved.append(tid)
    return moved


def copy_ns_per_call(torch, reference, sets: list, example_outputs, graph: bool) -> float:
    """On a GPU, what `run_batch` costs a call beside the call itself where the calls keep the
    GPU busy: the copy of its outputs into their slots, in GPU time (the loop's host time
    overlaps the GPU's work), timed here in the evaluator by its own events, the least of
    COPY_RUNS runs after one. Copies of outputs of new memory each, made as the batch makes
    them: replayed as a graph in graph mode (a captured 1 GiB copy ran at 2.6 TB/s on the
    H200, the copy engine's speed presumably, where an eager one in a batch ran at 4.2), else
    eager; with events, as the copy follows a real call, also the reference's calls on `sets`
    with and without the copies (an output just written is partly in the L2 still), and the
    lesser of the two: what is taken off a call must not exceed what its copy costs."""
    calls = len(sets)
    slots = [tuple(torch.empty_like(e) for e in as_tuple(example_outputs)) for _ in range(calls)]

    def best(run) -> float:
        run()  # the clocks of a GPU that idled ramp up: the first run is not counted
        least = float("inf")
        for _ in range(COPY_RUNS):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            end.synchronize()
            least = min(least, start.elapsed_time(end) * 1e6)
        return least

    def calls_only():
        for args in sets:
            reference(args)

    def with_copies():
        for args, targets in zip(sets, slots):
            for value, slot in zip(as_tuple(reference(args)), targets):
                slot.copy_(value)

    after_calls = float("inf")
    if not graph:
        started = time.perf_counter()
        calls_only()  # first calls: lazy initialisation
        torch.cuda.synchronize()
        if (time.perf_counter() - started) / calls < SLOW_REFERENCE_S:
            after_calls = max(0.0, best(with_copies) - best(calls_only)) / calls
    sources = [tuple(e.clone() for e in as_tuple(example_outputs)) for _ in range(calls)]

    def copies(count: int):
        for values, targets in zip(sources[:count], slots[:count]):
            for value, slot in zip(values, targets):
                slot.copy_(value)

    # all the copies and half of them: what a run costs besides its copies (a replay's several
    # µs, as much as a small copy) drops out of their difference
    half = max(1, calls // 2)
    runs = {}
    for count in {half, calls}:
        if graph:
            runs[count] = torch.cuda.CUDAGraph()
            with torch.cuda.graph(runs[count]):
                copies(count)
            runs[count] = runs[count].replay
        else:
            runs[count] = functools.partial(copies, count)
    if half == calls:
        alone = best(runs[calls]) / calls
    else:
        alone = max(0.0, best(runs[calls]) - best(runs[half])) / (calls - half)
    return min(after_calls, alone)


class HarnessPrice:
    """What `run_batch` costs a call beside the call itself, measured here in the evaluator
    around a call that only hands back outputs of the reference's shapes (so the copy into the
    slot is in), with the workers' torch threads (`threads`): the least of every run so far
    (`measure`, once before the rounds and again in each), so that what is taken off never
    exceeds it and one quiet moment of the measurement finds it. With one thread, in this
    thread's CPU time (a busy machine's waits would inflate a wall clock's); with more, in wall
    time: the calling thread of a copy split over threads spins at its end until the others are
    done, and counts that spin as its CPU time while they wait for a CPU. The evaluator's own
    default of a thread a CPU so priced a 256 KiB copy at 2.9 ms a call on the 2-core machine
    with two CPU hogs beside the build, where one thread read 35 µs (the honest calls it was
    taken off read 0.001 µs and failed the launch floor)."""

    def __init__(self, torch, example_outputs, calls: int, threads: int = 1):
        self.torch = torch
        outs = tuple(e.clone() for e in as_tuple(example_outputs))
        self._result = outs if isinstance(example_outputs, (tuple, list)) else outs[0]
        self._slots = [tuple(torch.empty_like(e) for e in outs) for _ in range(calls)]
        self.threads = threads
        self.runs_ns: list[float] = []  # per call, every run's

    def measure(self, runs: int) -> float:
        """`runs` more runs; the least per call of all so far."""
        torch = self.torch
        clock = time.thread_time_ns if self.threads == 1 else time.perf_counter_ns
        inputs = [()] * len(self._slots)
        own_threads = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        try:
            for _ in range(runs):
                start = clock()
                run_batch(torch, lambda: self._result, inputs, self._slots)
                self.runs_ns.append((clock() - start) / len(self._slots))
        finally:
            torch.set_num_threads(own_threads)
        return min(self.runs_ns)


# Whether the kernel keeps per-thread scheduler statistics (CONFIG_SCHED_INFO): without them
# a batch is timed by the wall clock alone.
SCHEDSTAT = os.path.exists("/proc/thread-self/schedstat")


def _schedstat(path: str) -> tuple[int, int]:
    """(ns on a CPU, ns runnable but waiting for one) of a thread, from the kernel."""
    try:
        with open(path) as stat:
            on_cpu, waiting = stat.read().split()[:2]
        return int(on_cpu), int(waiting)
    except (OSError, ValueError):  # the thread ended, or the kernel keeps no scheduler statistics
        return 0, 0


def process_named(root: int, own_pid: int) -> int:
    """The process below `root` that calls itself `own_pid` in its PID namespace (the worker,
    which says its pid): its pid here; `root` where none does."""
    for pid in descendants(root):
        try:
            with open(f"/proc/{pid}/status") as status:
                line = next((x for x in status if x.startswith("NSpid:")), "")
        except OSError:
            continue
        if line.split()[-1:] == [str(own_pid)]:
            return pid
    return root


# A process's CPU clock in clock_gettime's terms (the kernel's MAKE_PROCESS_CPUCLOCK(pid, SCHED)):
# the run time of every thread it has had, ended ones included.
_CPUCLOCK_SCHED = 2
CLOCK_TICK_NS = 1e9 / os.sysconf("SC_CLK_TCK")


def _process_cpu(pid: int) -> tuple[tuple[int, str], int, int] | None:
    """((pid, start time), CPU clock ns, reaped children's clock ticks) of a process: its clock
    holds the run time of every thread it has had; what the children it reaped spent the
    kernel keeps in clock ticks only. None once it is gone."""
    try:
        own = time.clock_gettime_ns(((~pid) << 3) | _CPUCLOCK_SCHED)
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        reaped = int(fields[13]) + int(fields[14])
    except (OSError, ValueError, IndexError):
        return None
    return (pid, fields[19]), own, reaped


class TreeTimes:
    """A snapshot of scheduler times: the CPU time and the waits of the thread that runs the
    calls (the worker's main thread, `main`), and the CPU time of every process of the
    worker's tree (`_process_cpu`), by process (a pid and its start time)."""

    def __init__(self, root: int, main: int):
        self.main_cpu, self.waiting = _schedstat(f"/proc/{main}/task/{main}/schedstat")
        self.cpu: dict[tuple[int, str], int] = {}
        self.reaped_ticks = 0
        for pid in descendants(root):
            if found := _process_cpu(pid):
                key, own, reaped = found
                self.cpu[key] = own + round(reaped * CLOCK_TICK_NS)
                self.reaped_ticks += reaped

    def cpu_since(self, before: TreeTimes) -> int:
        """CPU ns the tree spent since `before`: a thread that ended meanwhile still counts (its
        process's clock keeps it), a process started since counts whole, one that ended since
        counts whole in the process that reaped it (more than since `before`: slower, never
        faster)."""
        return sum(ns - before.cpu.get(key, 0) for key, ns in self.cpu.items())

    def processes_changed(self, before: TreeTimes) -> bool:
        """Whether a process of the tree started, ended or was reaped since `before`: the time
        of one that ended is known in clock ticks only (10 ms), in whoever reaped it, which a
        batch's median could leave out."""
        return self.cpu.keys() != before.cpu.keys() or self.reaped_ticks != before.reaped_ticks


class CallWaits:
    """How long the worker's calling thread and the evaluator's own have waited for a CPU, from
    the kernel's scheduler statistics, read around each call handed over
    (`BatchMeasurement._handover_batch`) through descriptors kept open (a read costs about 0.5 µs, an
    open and read 7 µs)."""

    def __init__(self, worker: int):
        paths = (f"/proc/{worker}/task/{worker}/schedstat", "/proc/thread-self/schedstat") if SCHEDSTAT else ()
        self._fds = [os.open(path, os.O_RDONLY | os.O_CLOEXEC) for path in paths]

    def read(self) -> int:
        waited = 0
        for fd in self._fds:
            with contextlib.suppress(OSError, ValueError, IndexError):  # the worker ended meanwhile
                waited += int(os.pread(fd, 128, 0).split()[1])
        return waited

    def close(self) -> None:
        for fd in self._fds:
            os.close(fd)


# Waits for a CPU under this in a call handed over (a wake-up's, an interrupt's) stay in its time.
CALL_WAIT_NS = 20_000


def handed_over_call_ns(wall_ns: int, waited_ns: int) -> int:
    """A call handed over: its wall time, less what the worker's calling thread and the
    evaluator waited for a CPU meanwhile (`CallWaits`) where that is CALL_WAIT_NS or more:
    another process's time slice on either CPU (with two CPU hogs beside the build a 2 ms call
    read up to 9 ms). The kernel counts a wait when the thread runs again, so one that began
    before the set's release is taken off whole: such a call reads short (a tenth of the 2 ms
    calls read 0 there), for either role, never long. Both sides spin between calls, so the
    worker's CPU time over the call is no floor: it holds its wait for the evaluator to see its
    word."""
    return wall_ns if waited_ns < CALL_WAIT_NS else max(0, wall_ns - waited_ns)


def calls_handed_over_ns(walls: list[int], less_waits: list[int], others_ns: int) -> list[int]:
    """A batch's calls handed over, each with its waits for a CPU taken off (`less_waits`,
    `handed_over_call_ns`), unless the worker's own other threads and processes ran (`others_ns`
    of CPU time) for half of what was taken off or more: then the waits may be its own doing (a
    child that makes the call on the calling thread's CPU while that thread waits for it), and
    the calls keep their wall times (`walls`)."""
    taken_off = sum(walls) - sum(less_waits)
    return less_waits if taken_off > 0 and others_ns < taken_off / 2 else walls


class MachineShare:
    """How busy the machine kept a measurement: of the time the evaluator's thread and the
    workers' calling threads could run, the share they spent waiting for a CPU (the kernel's
    scheduler statistics), from its creation until `share`. On the 2-core machine a quiet
    measurement's threads wait a few percent of it; beside two CPU hogs, about half."""

    def __init__(self, callers: list[int]):
        self._paths = ["/proc/thread-self/schedstat", *(f"/proc/{pid}/task/{pid}/schedstat" for pid in callers)]
        self._start = [_schedstat(path) for path in self._paths]

    def share(self) -> float | None:
        """None where the kernel keeps no scheduler statistics. A thread that ended meanwhile
        reads (0, 0): left out."""
        if not SCHEDSTAT:
            return None
        on_cpu = waiting = 0
        for path, (cpu_then, wait_then) in zip(self._paths, self._start):
            cpu_now, wait_now = _schedstat(path)
            if cpu_now >= cpu_then and wait_now >= wait_then:
                on_cpu += cpu_now - cpu_then
                waiting += wait_now - wait_then
        return waiting / (on_cpu + waiting) if on_cpu + waiting > 0 else 0.0


def own_wait() -> int:
    """ns the calling thread has spent runnable but waiting for a CPU."""
    return _schedstat("/proc/thread-self/schedstat")[1]


def busy_wall_ns(wall_ns: float, cpu_ns: float, waited_ns: float) -> float:
    """The wall time of a batch less the waits the kernel saw (`waited_ns`: the calling
    thread's and the evaluator's own), but never more than the wall time less the CPU time of
    all the worker's processes (`cpu_ns`), which bounds the time none of them ran from below:
    work done on other threads while one waits, or after the answer while the evaluator waits,
    is not taken off, and no batch counts less than the CPU time its worker spent."""
    idle = max(0.0, wall_ns - cpu_ns)
    return wall_ns - min(waited_ns, idle)
