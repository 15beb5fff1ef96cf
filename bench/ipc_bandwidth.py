"""Where does a vouched GPU batch's time go? The vouched GPU timing (`timing.vouched`) runs a
candidate's calls on input sets and output slots in one allocation the evaluator lends through
CUDA IPC, writes new inputs before each batch, and times each batch from its request until its
own probe kernel has run. On the H200 it read relu(x)*2 on 4096² fp32 (66 µs by the profiler)
at 114 µs a call. This replays that protocol between two processes, without magpie, and varies
one thing at a time: memory lent by the evaluator or the borrower's own; inputs written anew
before each batch or left as they were; the copy of each output into its slot or none. For each
it reports, per call, the borrower's own CUDA-event time of the batch and the lender's clock
from request to probe less the least empty batch.
Usage: python bench/ipc_bandwidth.py [OUT.json]"""

from __future__ import annotations

import json
import statistics
import sys
import time

import torch
import torch.multiprocessing as mp

ELEMENTS = 4096 * 4096
CALLS = 16
BATCHES = 12


def borrower(region, conn) -> None:
    lent_inputs = [region[i * ELEMENTS : (i + 1) * ELEMENTS] for i in range(CALLS)]
    lent_slots = [region[(CALLS + i) * ELEMENTS : (CALLS + i + 1) * ELEMENTS] for i in range(CALLS)]
    own = torch.empty(2 * CALLS * ELEMENTS, device="cuda")
    own_inputs = [own[i * ELEMENTS : (i + 1) * ELEMENTS] for i in range(CALLS)]
    own_slots = [own[(CALLS + i) * ELEMENTS : (CALLS + i + 1) * ELEMENTS] for i in range(CALLS)]
    while True:
        request = conn.recv()
        if request is None:
            return
        if request["op"] == "write_own":
            for x in own_inputs:
                x.normal_()
            for s in own_slots:
                s.fill_(float("nan"))
            torch.cuda.synchronize()
            conn.send({})
            continue
        inputs, slots = (lent_inputs, lent_slots) if request["memory"] == "lent" else (own_inputs, own_slots)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        began = time.perf_counter_ns()
        start.record()
        for x, slot in zip(inputs[: request["calls"]], slots[: request["calls"]]):
            out = torch.relu(x) * 2.0
            if request["copy"]:
                slot.copy_(out)
        end.record()
        queued = time.perf_counter_ns()
        torch.cuda.synchronize()
        conn.send(
            {
                "gpu_ns": start.elapsed_time(end) * 1e6,
                "loop_ns": queued - began,
                "sync_ns": time.perf_counter_ns() - queued,
            }
        )


def main() -> int:
    ctx = mp.get_context("spawn")
    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        region = torch.empty(2 * CALLS * ELEMENTS, device="cuda")
    inputs = [region[i * ELEMENTS : (i + 1) * ELEMENTS] for i in range(CALLS)]
    slots = [region[(CALLS + i) * ELEMENTS : (CALLS + i + 1) * ELEMENTS] for i in range(CALLS)]
    beacon = torch.zeros(1, device="cuda")
    here, there = ctx.Pipe()
    process = ctx.Process(target=borrower, args=(region, there))
    process.start()

    def request(**body) -> tuple[int, dict]:
        started = time.perf_counter_ns()
        here.send(body)
        answer = here.recv()
        beacon.add_(1)
        torch.cuda.synchronize()
        return time.perf_counter_ns() - started, answer

    def write(memory: str) -> None:
        if memory == "own":
            request(op="write_own")
            return
        for x in inputs:
            x.normal_()
        for s in slots:
            s.fill_(float("nan"))
        torch.cuda.synchronize()

    for memory in ("lent", "own"):
        write(memory)
        request(op="batch", memory=memory, calls=CALLS, copy=True)  # first calls: lazy initialisation
    empty = min(request(op="batch", memory="lent", calls=0, copy=False)[0] for _ in range(10))
    rows = {}
    for memory in ("lent", "own"):
        for fresh in (True, False):
            for copy in (True, False):
                spans, gpu, loop, sync = [], [], [], []
                write(memory)
                for _ in range(BATCHES):
                    if fresh:
                        write(memory)
                    span, answer = request(op="batch", memory=memory, calls=CALLS, copy=copy)
                    spans.append((span - empty) / CALLS / 1000)
                    gpu.append(answer["gpu_ns"] / CALLS / 1000)
                    loop.append(answer["loop_ns"] / CALLS / 1000)
                    sync.append(answer["sync_ns"] / CALLS / 1000)
                key = f"{memory} memory, {'new' if fresh else 'same'} inputs, {'copy' if copy else 'no copy'}"
                rows[key] = {
                    "lender_us_per_call": statistics.median(spans),
                    "borrower_events_us_per_call": statistics.median(gpu),
                    "borrower_loop_us_per_call": statistics.median(loop),
                    "borrower_sync_us_per_call": statistics.median(sync),
                }
                print(key, {k: round(v, 1) for k, v in rows[key].items()}, flush=True)
    here.send(None)
    process.join()
    result = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "elements": ELEMENTS,
        "calls_per_batch": CALLS,
        "empty_batch_us": empty / 1000,
        "us_per_call": rows,
    }
    print(json.dumps(result, indent=1))
    if sys.argv[1:]:
        with open(sys.argv[1], "w") as out:
            json.dump(result, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
