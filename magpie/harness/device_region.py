"""A vouched batch's region in GPU memory (`DeviceRegion`, whose docstring says how a batch
runs behind its gate), and how long the gate sleeps before the next batch (`next_sleep_ns`)."""

from __future__ import annotations

import time
from typing import Any

from magpie.harness.regions import ALIGN, Layout, Region, copy_sets, first_flagged, sample_calls, views

# A GPU batch's gate sleeps at least this long, at most GATE_MAX_NS (`DeviceRegion`).
GATE_MIN_NS = 200_000
GATE_MAX_NS = 50_000_000
# A batch handed over one call at a time has its words behind the region
# (`DeviceRegion.start_handover`), set to UNBLOCKED to let every wait go (`release_handover`); its
# first sleep is this long (a batch's queueing by both processes: about 30 µs a call), and the
# evaluator looks for its end this often.
WORDS_BYTES = ALIGN
UNBLOCKED = 1 << 30
HANDOVER_SLEEP_NS = 2_000_000
HANDOVER_POLL_S = 0.0002


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
        self._words = self.copy[layout.size : layout.size + 8].view(torch.int32)
        self._unblock = torch.full((2,), UNBLOCKED, dtype=torch.int32).pin_memory()
        self._aside: Any = None  # a handed-over batch's outputs, copied out as each call said it was done
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
        copy_sets(self.torch, input_sets, self._staged)
        self._staged_bytes = len(input_sets) * self.layout.in_stride
        for outs in self._outputs[: len(input_sets)]:
            for slot in outs:
                slot.fill_(float("nan") if slot.is_floating_point() else 0)
        self._words.zero_()
        self._taken = {}
        self.torch.cuda.synchronize()

    # a GPU batch is handed over by its count of calls (the evaluator's stream releases each set), a CPU
    # batch by its sets (written one by one as the worker asks): one name, one step of `BatchMeasurement`
    def start_handover(self, calls: int) -> None:  # type: ignore[override]
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
            self.copy[call * in_stride : (call + 1) * in_stride].copy_(
                self._staging[call * in_stride : (call + 1) * in_stride]
            )
            stream_words.write(stream, released, call + 1)
            if not call:
                first_release.record()
            stream_words.wait_at_least(stream, done, call + 1)
            self._aside[call * out_stride : (call + 1) * out_stride].copy_(
                self.copy[out_base + call * out_stride : out_base + (call + 1) * out_stride]
            )
        clock[1].record()
        self._handover = (clock, first_release, calls)

    def handover_answered(self, answer_ns: int) -> bool:
        """Once the worker answered that its calls are queued, `answer_ns` after
        `start_handover` began: whether the first set was released before (its queueing was
        timed too); the next sleep (`next_sleep_ns`)."""
        assert self._handover is not None  # `start_handover` queued it
        opened_early = self._handover[1].query()
        self.handover_sleep_ns = next_sleep_ns(answer_ns, opened_early, False, self.handover_sleep_ns)
        return opened_early

    def end_handover(self, deadline: float) -> float:  # type: ignore[override]
        """GPU ns of the batch handed over (`start_handover`) once its last event has run; what
        the checks read taken from the outputs copied aside. Past the monotonic `deadline`, the
        words are set so that nothing waits on them any more (a worker that never says its call
        is done would hold the evaluator's stream for good) and TimeoutError is raised."""
        assert self._handover is not None  # `start_handover` queued it
        clock, _, calls = self._handover
        while not clock[1].query():
            if time.monotonic() > deadline:
                self.release_handover()
                raise TimeoutError("a call handed over was not said to be done in time")
            time.sleep(HANDOVER_POLL_S)
        stride = self.layout.out_stride
        picks = sample_calls(calls)
        self._taken = {
            "nan_left": self._nan_left(calls, self._aside),
            "picks": picks,
            "outputs": {
                c: tuple(views(self.torch, self._aside, [(o[0] + c * stride, o[1], o[2]) for o in self.layout.outs]))
                for c in picks
            },
        }
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
        self.copy[: self._staged_bytes].copy_(self._staging[: self._staged_bytes])
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
        assert self._clock is not None  # `start` queued its first event
        self._clock[1].record()
        picks = sample_calls(calls)
        self._taken = {
            "nan_left": self._nan_left(calls),
            "picks": picks,
            "outputs": {c: tuple(v.clone() for v in self._outputs[c]) for c in picks},
        }

    def taken_ns(self) -> float:
        """GPU time between the batch's two events."""
        assert self._clock is not None  # `start` queued its first event
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
        return first_flagged(self._taken["nan_left"])

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
