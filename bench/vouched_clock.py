"""Which clock can the evaluator hold over a worker's GPU batch? Two protocols, between two
processes, without magpie: "probe" (the evaluator's host clock from the request until its own
small kernel, queued after the answer, has run: what `timing.vouched` does) and "event" (the
evaluator's own CUDA events: one recorded before the request, one after its stream waited on
an interprocess event the worker records behind its calls). For each, per call, the batch less
the median calibration batch (one small kernel of the worker's own), against the worker's own
CUDA events, on a large kernel (eager) and a small one (eager and as a CUDA graph).
Usage: python bench/vouched_clock.py [OUT.json]"""

from __future__ import annotations

import json
import statistics
import sys
import time

import torch
import torch.multiprocessing as mp

WORKLOADS = {
    "large eager": (4096 * 4096, 16, False),
    "small eager": (33 * 65, 200, False),
    "small graph": (33 * 65, 200, True),
}
BATCHES = 15
CALIBRATIONS = 9


def worker(conn, handle) -> None:
    done = torch.cuda.Event.from_ipc_handle(torch.cuda.current_device(), handle)
    mark = torch.zeros(1, device="cuda")
    state = {}
    while True:
        request = conn.recv()
        if request is None:
            return
        if request["op"] == "setup":
            elements, calls, graph = request["workload"]
            inputs = [torch.randn(elements, device="cuda") for _ in range(calls)]
            slots = [torch.empty(elements, device="cuda") for _ in range(calls)]

            def run():
                for x, slot in zip(inputs, slots):  # noqa: B023 (run() is called within the iteration)
                    slot.copy_(torch.relu(x) * 2.0)

            run()
            torch.cuda.synchronize()
            if graph:
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    run()
                state["run"] = g.replay
            else:
                state["run"] = run
            conn.send({})
            continue
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        if request["op"] == "calibrate":
            mark.add_(1)
        else:
            state["run"]()
        end.record()
        done.record()
        if request["protocol"] == "probe":
            torch.cuda.synchronize()
            conn.send({})
        else:
            conn.send({})
            torch.cuda.synchronize()
        conn.send({"gpu_ns": start.elapsed_time(end) * 1e6})


def main() -> int:
    ctx = mp.get_context("spawn")
    done = torch.cuda.Event(interprocess=True)
    beacon = torch.zeros(1, device="cuda")
    here, there = ctx.Pipe()
    process = ctx.Process(target=worker, args=(there, done.ipc_handle()))
    process.start()
    stream = torch.cuda.current_stream()

    def batch(op: str, protocol: str) -> tuple[float, float]:
        """(ns the evaluator's clock gave the batch, ns the worker's events gave it)"""
        if protocol == "probe":
            started = time.perf_counter_ns()
            here.send({"op": op, "protocol": protocol})
            here.recv()
            beacon.add_(1)
            torch.cuda.synchronize()
            taken = time.perf_counter_ns() - started
        else:
            t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0.record()
            t0.synchronize()
            here.send({"op": op, "protocol": protocol})
            here.recv()
            stream.wait_event(done)
            t1.record()
            t1.synchronize()
            taken = t0.elapsed_time(t1) * 1e6
        return taken, here.recv()["gpu_ns"]

    rows = {}
    for name, workload in WORKLOADS.items():
        here.send({"op": "setup", "workload": workload})
        here.recv()
        calls = workload[1]
        for protocol in ("probe", "event"):
            for _ in range(3):
                batch("run", protocol)
            fixed = statistics.median(batch("calibrate", protocol)[0] for _ in range(CALIBRATIONS))
            taken = [batch("run", protocol) for _ in range(BATCHES)]
            per_call = sorted((t - fixed) / calls / 1000 for t, _ in taken)
            own = statistics.median(g / calls / 1000 for _, g in taken)
            rows[f"{name}, {protocol}"] = {
                "fixed_us": fixed / 1000,
                "evaluator_us_per_call": statistics.median(per_call),
                "p20": per_call[len(per_call) // 5],
                "p80": per_call[4 * len(per_call) // 5],
                "worker_events_us_per_call": own,
            }
            print(f"{name}, {protocol}", {k: round(v, 2) for k, v in rows[f"{name}, {protocol}"].items()}, flush=True)
    here.send(None)
    process.join()
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}
    if sys.argv[1:]:
        with open(sys.argv[1], "w") as out:
            json.dump(result, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
