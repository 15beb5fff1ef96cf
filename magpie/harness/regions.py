"""Where a vouched batch's input sets and output slots lie (`harness.batches` says why): the
`Layout` of one call's slots and the strides between calls, each call's views made when a
batch first uses it (`CallViews`), and the evaluator's side of a worker's region on the CPU
(`Region`): a file in the worker's scratch folder that the worker maps once and the evaluator
writes and reads with pread/pwrite only (a worker that shrank the file could make a mapping
fault in the judge's process), with a control file for batches handed over one call at a time."""

from __future__ import annotations

import ctypes
import math
import os
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from magpie.harness.checks import as_tuple
from magpie.supervision import scratch

ALIGN = 64
# A batch's input sets and outputs fit in this; a set larger than it is timed one call a batch.
REGION_BYTES = 128 << 20
# On a GPU more: a batch must hold milliseconds of calls of large kernels, the request's own
# round trip being tens of µs; at most this share of the free device memory a worker.
DEVICE_REGION_BYTES = 8 << 30
DEVICE_REGION_SHARE = 16
MAX_CALLS = 1024
# Output slots checked against the reference per batch, chosen after the worker answered.
CHECKED_PER_BATCH = 3
# A batch handed over one call at a time (`batches.run_handed_over`): the control file holds two
# counters, the sets released and the calls done.
CONTROL_BYTES = 16


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

        self.args: list[list[Any]] = []
        offset = 0
        for x in example_args:
            if torch.is_tensor(x):
                self.args.append(["tensor", offset, list(x.shape), str(x.dtype).replace("torch.", "")])
                offset += _aligned(_nbytes(x))
            else:
                self.args.append(["value", x])
        self.in_stride = max(offset, ALIGN)
        self.outs: list[list[Any]] = []
        offset = 0
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
        return CallViews(self.calls, lambda call: views(torch, region, self.set_slots(call)))

    def output_views(self, torch, region) -> CallViews:
        """Per call, views of its output slots in `region`."""
        return CallViews(self.calls, lambda call: views(torch, region, self.output_slots(call)))

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
        self._calls, self._make = calls, make
        self._made: dict[int, Any] = {}

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


def views(torch, region, offsets: list) -> list:
    """Tensors over `region` (a flat uint8 tensor) at (offset, shape, dtype) each."""
    out = []
    for offset, shape, dtype in offsets:
        kind = getattr(torch, dtype)
        out.append(region[offset : offset + math.prod(shape) * kind.itemsize].view(kind).view(shape))
    return out


def copy_sets(torch, input_sets: list, views: CallViews) -> None:
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
        for slot in views(torch, one, layout.outs):
            slot.fill_(float("nan") if slot.is_floating_point() else 0)
        self._poison = ctypes.string_at(one.data_ptr(), layout.out_stride) * layout.calls

    def offer(self) -> dict:
        return {"file": str(self.path), "control": str(self.control_path), "layout": self.layout.to_json()}

    def write(self, input_sets: list) -> None:
        """This batch's input sets, and the pre-batch fill of their calls' output slots."""
        layout = self.layout
        copy_sets(self.torch, input_sets, self._inputs)
        calls = len(input_sets)
        os.pwrite(self.fd, self._bytes[: calls * layout.in_stride], 0)
        os.pwrite(self.fd, self._poison[: calls * layout.out_stride], layout.out_base)

    def read(self, calls: int) -> None:
        """What the worker left in the first `calls` output slots (input sets are read one by
        one, for the calls the checks pick: `inputs`)."""
        layout = self.layout
        outputs = calls * layout.out_stride
        got = os.preadv(self.fd, [self._bytes[layout.out_base : layout.out_base + outputs]], layout.out_base)
        # what is missing reads as the fill it had before the batch, byte for byte: unwritten
        self._bytes[layout.out_base + got : layout.out_base + outputs] = self._poison[got:outputs]

    def start_handover(self, input_sets: list) -> None:
        """Before a batch handed over one call at a time (`run_handed_over`): no set released,
        the worker not yet waiting for one, its sets ready in the evaluator's copy (`hand_over`
        writes each out), its output slots filled (in the file and in the evaluator's copy, which
        keeps what each call left when it said it was done)."""
        layout = self.layout
        calls = len(input_sets)
        copy_sets(self.torch, input_sets, self._inputs)
        os.pwrite(self.control_fd, (0).to_bytes(8, "little") + (-1).to_bytes(8, "little", signed=True), 0)
        os.pwrite(self.fd, self._poison[: calls * layout.out_stride], layout.out_base)
        self._bytes[layout.out_base : layout.out_base + calls * layout.out_stride] = self._poison[
            : calls * layout.out_stride
        ]

    def put(self, call: int) -> None:
        """Input set `call` into its slot: until now the slot held the last batch's."""
        stride = self.layout.in_stride
        os.pwrite(self.fd, self._bytes[call * stride : (call + 1) * stride], call * stride)

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
        got = os.preadv(self.fd, [self._bytes[start : start + layout.out_stride]], start)
        self._bytes[start + got : start + layout.out_stride] = self._poison[got : layout.out_stride]

    def picks(self, calls: int) -> list[int]:
        """The calls whose outputs are checked against the reference, chosen now."""
        return sample_calls(calls)

    def outputs(self, call: int) -> tuple:
        return tuple(view.clone() for view in self._outputs[call])

    def inputs(self, call: int) -> tuple:
        """What the worker left in the input set of `call`."""
        stride = self.layout.in_stride
        got = os.preadv(self.fd, [self._bytes[call * stride : (call + 1) * stride]], call * stride)
        self._bytes[call * stride + got : (call + 1) * stride] = bytes(stride - got)  # past the end of a shrunk file
        return self.layout.arguments([view.clone() for view in self._inputs[call]])

    def unwritten(self, calls: int) -> int | None:
        """The first call (of the first `calls`) with a floating output still holding NaN, the
        value each slot held before the batch; None where every slot was written."""
        return first_flagged(self._nan_left(calls))

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
            span = buffer[offset : offset + (calls - 1) * stride + numel * kind.itemsize].view(kind)
            rows = span.as_strided((calls, numel), (stride // kind.itemsize, 1)).isnan().any(dim=1)
            found = rows if found is None else found | rows
        return found

    def close(self) -> None:
        os.close(self.fd)
        os.close(self.control_fd)
        for path in (self.path, self.control_path):
            path.unlink(missing_ok=True)


def sample_calls(calls: int) -> list[int]:
    """CHECKED_PER_BATCH of a batch's calls (or all of fewer), chosen by the system's randomness."""
    return random.SystemRandom().sample(range(calls), min(calls, CHECKED_PER_BATCH))


def first_flagged(flags) -> int | None:
    """The index of the first true flag, None where there is none (or no flags)."""
    if flags is None:
        return None
    found = flags.nonzero()
    return int(found[0, 0]) if len(found) else None
