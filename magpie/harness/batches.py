"""Timing the evaluator vouches for (on the CPU; on a GPU where `timing.vouched` asks, in
device memory, `device_region.DeviceRegion`): batches of calls on input sets the worker has never seen,
whose outputs land where the evaluator reads them.

A timer inside the worker's process can be replaced by the code it times, and nothing seen
from outside bounds how fast the work inside went unless the number of calls is proven too.
So the number that ranks is the evaluator's own clock over a request, divided by the calls
it asked for, and the calls are proven by their outputs:

- a `regions.Region`, a file in the worker's scratch folder, holds one batch's input sets and a slot
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
and the children it reaped (`cputime.TreeTimes`), which no waiting stretches and no code in the worker
can lower but by doing less; with more threads, the wall time from the request until
the worker has stopped, less the time the kernel reports that its calling thread and the
evaluator waited for a CPU while none of its threads ran (`busy_wall_ns`). The worker's own
handling of the request (tens of µs) stays in, spread over a batch of milliseconds.

Here: the worker's side (`WorkerViews`, the batch loops `run_batch`, `run_handed_over`,
`run_handed_over_on_gpu`, which a candidate's code can replace and the checks are built
against), the harness's price (`HarnessPrice`, `copy_ns_per_call`) and what a call handed
over or a batch's wall time counts once the waits for a CPU are taken off.
"""

from __future__ import annotations

import ctypes
import functools
import time
from collections.abc import Sequence
from typing import Any

from magpie.harness.checks import as_tuple
from magpie.harness.regions import CallViews, Layout

# A reference call slower than this has the copy of its outputs priced alone (`copy_ns_per_call`).
SLOW_REFERENCE_S = 0.002
# The copies into the slots are timed this many times, the least counted (`copy_ns_per_call`):
# priced from the best of 3, a 1 MiB output's copy read 0.96-2.37 µs in one sweep on the H200.
COPY_RUNS = 10
# A worker that sees no set of a batch handed over one call at a time released for this long
# gives up (`run_handed_over`).
HANDOVER_WAIT_S = 60.0


class BatchOutputError(RuntimeError):
    """An output of a timed call that is not a tensor of its slot's shape and dtype."""


class WorkerViews:
    """The worker's side: tensors that are views of the region it mapped once."""

    def __init__(self, torch, offer: dict):
        # a GPU region's events, calibration kernel and words; a CPU region's control: None elsewhere
        self.done: Any = None
        self.gate: Any = None
        self.mark: Any = None
        self.control: Any = None
        self.words: Any = None
        layout = Layout.from_json(offer["layout"])
        if "ipc" in offer:
            from magpie.harness.exchange import loads_shared

            region = loads_shared(offer["ipc"])
            # [sets released, calls done] of a batch handed over one call at a time (`run_handed_over_on_gpu`)
            self.words = region[offer["words_at"] : offer["words_at"] + 8].view(torch.int32)
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


def run_batch(torch, fn, inputs: Sequence, outputs: Sequence) -> None:
    """One call per input set, in order, each output copied into its slot."""
    for args, slots in zip(inputs, outputs):
        produced = fn(*args)
        produced = produced if isinstance(produced, (tuple, list)) else (produced,)
        if len(produced) != len(slots):
            raise BatchOutputError(f"a timed call returned {len(produced)} outputs, expected {len(slots)}")
        for value, slot in zip(produced, slots):
            if not isinstance(value, torch.Tensor) or value.shape != slot.shape or value.dtype != slot.dtype:
                raise BatchOutputError(
                    "a timed call returned an output that is not a plain tensor of the reference's shape and dtype"
                )
            slot.copy_(value)


def run_handed_over(torch, fn, inputs: Sequence, outputs: Sequence, control) -> None:
    """`run_batch` one call at a time, as the evaluator writes each input set and releases it
    (`control[0]`, the sets released) once the last call said it was done (`control[1]`, the
    calls done), taking that call's outputs as they were then (`Region.take_output`): calls that
    see their sets one by one cannot be done together. The worker is not told how many calls a
    batch holds; -1 in `control[0]` ends the batch. It looks for each release without
    sleeping, on a CPU of its own (`cputime.apart`): a call after a sleep runs from cold caches, which
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
        run_batch(torch, fn, inputs[call : call + 1], outputs[call : call + 1])
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
        run_batch(torch, fn, inputs[call : call + 1], outputs[call : call + 1])
        stream_words.write(stream, done, call + 1)


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


def busy_wall_ns(wall_ns: float, cpu_ns: float, waited_ns: float) -> float:
    """The wall time of a batch less the waits the kernel saw (`waited_ns`: the calling
    thread's and the evaluator's own), but never more than the wall time less the CPU time of
    all the worker's processes (`cpu_ns`), which bounds the time none of them ran from below:
    work done on other threads while one waits, or after the answer while the evaluator waits,
    is not taken off, and no batch counts less than the CPU time its worker spent."""
    idle = max(0.0, wall_ns - cpu_ns)
    return wall_ns - min(waited_ns, idle)
