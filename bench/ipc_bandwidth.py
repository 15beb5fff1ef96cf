"""Is memory lent through CUDA IPC slower to the process that maps it? The vouched GPU timing
(`timing.vouched`) runs candidates on inputs and output slots in memory the evaluator lends
through CUDA IPC, and read a 66 µs kernel at 114 µs on the H200. This times the same kernel
and copy, with CUDA events in the borrowing process, on lent memory and on memory of its own.
Usage: python bench/ipc_bandwidth.py [OUT.json]"""

from __future__ import annotations

import json
import sys

import torch
import torch.multiprocessing as mp

ELEMENTS = 4096 * 4096
SETS = 16


def timed_us(fn, repeats: int = 20) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / SETS)
    times.sort()
    return times[len(times) // 2]


def borrower(lent, slots, answer) -> None:
    own = [x.clone() for x in lent]
    own_slots = [s.clone() for s in slots]

    def kernel(inputs, outputs, copy: bool):
        def run():
            for x, slot in zip(inputs, outputs):
                out = torch.relu(x) * 2.0
                if copy:
                    slot.copy_(out)
        return run

    answer.put({f"{where} {what}": timed_us(kernel(inputs, outputs, copy))
                for where, inputs, outputs in (("lent", lent, slots), ("own", own, own_slots))
                for what, copy in (("kernel", False), ("kernel+copy", True))})


def main() -> int:
    ctx = mp.get_context("spawn")
    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        lent = [torch.randn(ELEMENTS, device="cuda") for _ in range(SETS)]
        slots = [torch.empty(ELEMENTS, device="cuda") for _ in range(SETS)]
    answer = ctx.Queue()
    process = ctx.Process(target=borrower, args=(lent, slots, answer))
    process.start()
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "elements": ELEMENTS,
              "us_per_call": answer.get(timeout=300)}
    process.join()
    print(json.dumps(result, indent=1))
    if sys.argv[1:]:
        with open(sys.argv[1], "w") as out:
            json.dump(result, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
