"""What it costs to show a worker one input set at a time, on the CPU: the hand-over that would
keep a batch's calls from being done together (docs/security.md, "the batch loop is the
candidate's to change"). A forked worker runs `relu(x) * 2` on 33x65 fp32 sets that lie in
shared memory, and the evaluator reads the worker's CPU clock (`clock_gettime` of its pid) as
magpie reads its process's. Ways of running a batch of N calls:

- `batch`: every set written first, one signal, the N calls in a loop (magpie today);
- `fused`: the same, done as one operation over all N sets (the cheat a batch allows);
- `pipe`: one set at a time, each side blocking on a pipe for the other;
- `spin`: one set at a time, the worker spinning up to SPIN_US on a shared counter before it
  blocks on a pipe, the evaluator spinning on the worker's counter.

For each, a call's share of: the worker's CPU time over the whole batch; for `pipe`, its CPU
time within the windows from each set's release to its call's end (the worker blocked at
both ends, where its clock is up to date); for `spin`, the wall time of those windows less
the worker's waits for a CPU (a running process's
clock is brought up to date only at a tick or when it stops, so it cannot time a window);
and the batch's wall time. Each way runs idle and beside as
many busy processes as cores. Usage: python bench/handover.py [--calls 200] [--batches 30]
"""

from __future__ import annotations

import argparse
import ctypes
import mmap
import os
import select
import statistics
import sys
import time

import torch

SHAPE = (33, 65)
SPIN_US = 50
CPUCLOCK_SCHED = 2


def cpu_ns(pid: int) -> int:
    """The worker's CPU clock: brought up to date only when it stops running (or at a tick), so
    read while it is blocked."""
    return time.clock_gettime_ns(((~pid) << 3) | CPUCLOCK_SCHED)


def waited_ns(path: str) -> int:
    """How long a thread has been runnable but waiting for a CPU (up to date once each wait
    has ended), from its schedstat file."""
    with open(path) as stat:
        return int(stat.read().split()[1])


class Shared:
    """Input and output slots and two counters in memory both processes map."""

    def __init__(self, calls: int):
        per = SHAPE[0] * SHAPE[1]
        self.words = mmap.mmap(-1, 4 * 8)
        self.go = ctypes.c_int64.from_buffer(self.words, 0)  # the last call released
        self.done = ctypes.c_int64.from_buffer(self.words, 8)  # the last call finished
        self.asleep = ctypes.c_int64.from_buffer(self.words, 16)  # the worker blocks on its pipe
        self.data = mmap.mmap(-1, 2 * calls * per * 4)
        flat = torch.frombuffer(self.data, dtype=torch.float32)
        self.inputs = flat[: calls * per].view(calls, *SHAPE)
        self.outputs = flat[calls * per :].view(calls, *SHAPE)


def worker(shared: Shared, way: str, order_read: int, wake_read: int, done_write: int) -> None:
    torch.set_num_threads(1)
    while True:
        order = os.read(order_read, 16)
        if not order:
            os._exit(0)
        calls = int(order)
        if way in ("batch", "fused"):
            if way == "batch":
                for k in range(calls):
                    shared.outputs[k].copy_(torch.relu(shared.inputs[k]) * 2)
            else:
                torch.mul(torch.relu(shared.inputs[:calls]), 2, out=shared.outputs[:calls])
            os.write(done_write, b"d")
            continue
        for k in range(calls):
            if way == "pipe":
                while shared.go.value < k + 1:
                    os.read(wake_read, 1)
            else:
                wait_spinning(shared, k, wake_read)
            shared.outputs[k].copy_(torch.relu(shared.inputs[k]) * 2)
            shared.done.value = k + 1
            if way == "pipe":
                os.write(done_write, b"d")


def wait_spinning(shared: Shared, k: int, wake_read: int) -> None:
    """Until call k is released: spin a while, then say so and block (a wake-up both sides can
    miss without a fence is caught by the millisecond the block lasts at most)."""
    until = time.perf_counter_ns() + SPIN_US * 1000
    while shared.go.value < k + 1:
        if time.perf_counter_ns() > until:
            shared.asleep.value = 1
            while shared.go.value < k + 1:
                if select.select([wake_read], [], [], 0.001)[0]:
                    os.read(wake_read, 64)
            shared.asleep.value = 0
            return


def evaluator_batch(shared: Shared, way: str, pid: int, pipes: dict, sets) -> dict:
    calls = len(sets)
    shared.go.value = shared.done.value = 0
    window_cpu = window_wall = 0
    workers_waits = f"/proc/{pid}/task/{pid}/schedstat"
    started_wall, started_cpu, started_wait = time.perf_counter_ns(), cpu_ns(pid), waited_ns(workers_waits)
    if way in ("batch", "fused"):
        shared.inputs[:calls].copy_(sets)
        os.write(pipes["order"], str(calls).encode())
        os.read(pipes["done"], 1)
    else:
        os.write(pipes["order"], str(calls).encode())
        for k in range(calls):
            shared.inputs[k].copy_(sets[k])
            released_cpu, released_wall = cpu_ns(pid), time.perf_counter_ns()
            shared.go.value = k + 1
            if way == "pipe":
                os.write(pipes["wake"], b"g")
                os.read(pipes["done"], 1)
            else:
                if shared.asleep.value:
                    os.write(pipes["wake"], b"g")
                while shared.done.value < k + 1:
                    pass
            window_wall += time.perf_counter_ns() - released_wall
            window_cpu += cpu_ns(pid) - released_cpu
    wall = time.perf_counter_ns() - started_wall
    time.sleep(0.0005)  # the worker blocks for its next order: its clock is up to date
    return {
        "cpu": cpu_ns(pid) - started_cpu,
        "wall": wall,
        "window_cpu": window_cpu if way == "pipe" else None,
        "window_busy": window_wall - (waited_ns(workers_waits) - started_wait) if way == "spin" else None,
    }


def measure(way: str, calls: int, batches: int) -> dict:
    shared = Shared(calls)
    order_read, order_write = os.pipe()
    wake_read, wake_write = os.pipe()
    done_read, done_write = os.pipe()
    pid = os.fork()
    if pid == 0:
        for fd in (order_write, wake_write, done_read):
            os.close(fd)
        worker(shared, way, order_read, wake_read, done_write)
    for fd in (order_read, wake_read, done_write):
        os.close(fd)
    pipes = {"order": order_write, "wake": wake_write, "done": done_read}
    generator = torch.Generator().manual_seed(0)
    per_call: dict[str, list[float]] = {}
    for b in range(batches + 1):
        sets = torch.randn(calls, *SHAPE, generator=generator)
        taken = evaluator_batch(shared, way, pid, pipes, sets)
        if not torch.equal(shared.outputs[:calls], torch.relu(sets) * 2):
            raise SystemExit(f"{way}: wrong outputs")
        if b:  # the first batch warms up
            for key, ns in taken.items():
                if ns is not None:
                    per_call.setdefault(key, []).append(ns / calls / 1000)
    os.close(order_write)
    os.close(wake_write)
    os.waitpid(pid, 0)
    return {key: statistics.median(values) for key, values in per_call.items()}


def hogs(count: int) -> list[int]:
    pids = []
    for _ in range(count):
        pid = os.fork()
        if pid == 0:
            while True:
                pass
        pids.append(pid)
    return pids


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--batches", type=int, default=30)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(
        f"{'way':6s} {'load':5s} {'CPU':>8s} {'window CPU':>11s} {'window busy':>12s} {'wall':>8s}"
        f"   µs a call, medians of {args.batches} batches of {args.calls}"
    )
    for load in ("idle", "busy"):
        started = hogs(os.cpu_count() or 1) if load == "busy" else []
        try:
            for way in ("batch", "fused", "pipe", "spin"):
                got = measure(way, args.calls, args.batches)
                cells = [f"{got[key]:.2f}" if key in got else "" for key in ("cpu", "window_cpu", "window_busy")]
                print(
                    f"{way:6s} {load:5s} {cells[0]:>8s} {cells[1]:>11s} {cells[2]:>12s} {got['wall']:8.2f}", flush=True
                )
        finally:
            for pid in started:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
