"""Can a GPU hand a worker its input sets one call at a time, and what does a call cost then?

Two processes on one GPU, as magpie's evaluator and worker: the evaluator's stream copies
input set k into a region both map (CUDA IPC), writes "released k" into a flag word with a
stream memory operation (`cuStreamWriteValue32`), waits on the GPU for the worker's
"done k" word (`cuStreamWaitValue32`) and copies call k's outputs aside. The worker queues
all its calls at once, each behind a wait for its release and followed by its "done" word.
No host takes part once both have queued: what a batch takes is the GPU's, between the
evaluator's two events. A worker cannot do two calls together: the second's inputs are not
there before the first's outputs were taken.

Prints, per kernel and batch size, the per-call time of batches handed over one call at a
time and of batches queued behind one gate (magpie's batches today), with their spread
over repeats; writes them as JSON to the path given.

    python3 bench/gpu_handover.py OUT.json
"""

from __future__ import annotations

import ctypes
import json
import os
import statistics
import sys
import time

import torch
import torch.multiprocessing as mp

WAIT_GEQ = 0x0
REPEATS = 24
SIZES = (1, 8, 64)


def _driver():
    cuda = ctypes.CDLL("libcuda.so.1")
    for name in ("cuStreamWaitValue32_v2", "cuStreamWriteValue32_v2"):
        fn = getattr(cuda, name)
        fn.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint]
        fn.restype = ctypes.c_int
    cuda.cuMemHostRegister_v2.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
    cuda.cuMemHostGetDevicePointer_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_void_p, ctypes.c_uint]
    cuda.cuMemHostUnregister.argtypes = [ctypes.c_void_p]
    return cuda


def _check(result: int, what: str) -> None:
    if result:
        raise RuntimeError(f"{what}: CUresult {result}")


def wait_value(cuda, stream, address: int, value: int) -> None:
    _check(cuda.cuStreamWaitValue32_v2(stream.cuda_stream, address, value, WAIT_GEQ), "wait value")


def write_value(cuda, stream, address: int, value: int) -> None:
    _check(cuda.cuStreamWriteValue32_v2(stream.cuda_stream, address, value, 0), "write value")


KERNELS = {
    "relu_8x8": ((8, 8), lambda x, out: torch.clamp_min(x, 0, out=out)),
    "ten_ops_8x8": ((8, 8), lambda x, out: out.copy_(((((x * 2 + 1).relu() * 3 - 1).sin() + x).cos() * x).abs())),
    "relu_4M": ((4096, 1024), lambda x, out: torch.clamp_min(x, 0, out=out)),
    "mm_1024": ((1024, 1024), lambda x, out: torch.mm(x, x, out=out)),
}


FLAG_FILE = "/dev/shm/magpie_gpu_handover_probe"


def host_word():
    """A word of host memory both processes map (the evaluator's GPU writes "released" there,
    the worker's host reads it: a worker that queues each call only once released)."""
    import mmap

    fd = os.open(FLAG_FILE, os.O_CREAT | os.O_RDWR)
    os.ftruncate(fd, 4096)
    mapped = mmap.mmap(fd, 4096)
    return mapped, ctypes.c_uint32.from_buffer(mapped, 0)


def worker(conn, region, flags, name):
    torch.cuda.set_device(0)
    cuda = _driver()
    shape, fn = KERNELS[name]
    stream = torch.cuda.Stream()
    n = shape[0] * shape[1]
    x, out = region[:n].view(shape), region[n : 2 * n].view(shape)
    released, done = flags.data_ptr(), flags.data_ptr() + 128
    mapped, word = host_word()
    fn(x, out)  # loaded now: a kernel's first launch behind a wait on a value would wait for that wait
    torch.cuda.synchronize()
    conn.send("ready")
    while True:
        msg = conn.recv()
        if msg is None:
            break
        mode, base, calls = msg
        if mode == "host":  # each call queued once the host sees it released: its context idles between
            conn.send("queued")
            with torch.cuda.stream(stream):
                for k in range(calls):
                    deadline = time.monotonic() + 10
                    while word.value < base + k + 1:
                        if time.monotonic() > deadline:
                            raise RuntimeError("never released")
                    fn(x, out)
                    write_value(cuda, stream, done, base + k + 1)
            conn.send("finished")
            continue
        with torch.cuda.stream(stream):
            if mode == "handover":
                for k in range(calls):
                    wait_value(cuda, stream, released, base + k + 1)
                    fn(x, out)
                    write_value(cuda, stream, done, base + k + 1)
            else:  # behind one gate, the calls back to back
                wait_value(cuda, stream, released, base + 1)
                for _ in range(calls):
                    fn(x, out)
                write_value(cuda, stream, done, base + 1)
        conn.send("queued")


def main(path: str) -> None:
    ctx = mp.get_context("spawn")
    cuda = _driver()
    results = {
        "date": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "device": torch.cuda.get_device_name(),
        "repeats": REPEATS,
        "kernels": {},
    }
    for name, (shape, fn) in KERNELS.items():
        n = shape[0] * shape[1]
        region = torch.zeros(2 * n, device="cuda")
        flags = torch.zeros(64, dtype=torch.int32, device="cuda")
        staged = torch.randn(max(SIZES), n, device="cuda")
        aside = torch.empty(max(SIZES), n, device="cuda")
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=worker, args=(child, region, flags, name))
        proc.start()
        if not parent.poll(60) or parent.recv() != "ready":
            raise RuntimeError(f"the worker did not start ({name})")
        stream = torch.cuda.Stream()
        released, done = flags.data_ptr(), flags.data_ptr() + 128
        mapped, word = host_word()
        address = ctypes.addressof(ctypes.c_char.from_buffer(mapped))
        _check(cuda.cuMemHostRegister_v2(ctypes.c_void_p(address), 4096, 0x03), "register the host word")
        device_word = ctypes.c_uint64()
        _check(
            cuda.cuMemHostGetDevicePointer_v2(ctypes.byref(device_word), ctypes.c_void_p(address), 0),
            "the host word's device address",
        )
        region[:n].copy_(staged[0])  # loaded before any wait on a value, as in the worker
        aside[0].copy_(region[n:])
        torch.cuda._sleep(1000)
        torch.cuda.synchronize()
        counter = 0
        rows = {}
        for mode in ("handover", "host", "gate"):
            for calls in SIZES:
                per_call = []
                for _ in range(REPEATS):
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    parent.send((mode, counter, calls))  # its calls queued first, each behind its release
                    if not parent.poll(30) or parent.recv() != "queued":
                        print(f"the worker did not queue its calls ({name}, {mode}, {calls})", flush=True)
                        proc.kill()
                        os._exit(3)
                    with torch.cuda.stream(stream):
                        torch.cuda._sleep(8_000_000)  # the evaluator's chain queued before it starts
                        start.record()
                        if mode in ("handover", "host"):
                            for k in range(calls):
                                region[:n].copy_(staged[k])
                                write_value(
                                    cuda, stream, device_word.value if mode == "host" else released, counter + k + 1
                                )
                                wait_value(cuda, stream, done, counter + k + 1)
                                aside[k].copy_(region[n:])
                        else:
                            region[:n].copy_(staged[0])
                            write_value(cuda, stream, released, counter + 1)
                            wait_value(cuda, stream, done, counter + 1)
                            aside[0].copy_(region[n:])
                        end.record()
                    deadline = time.monotonic() + 10
                    while not end.query():
                        if time.monotonic() > deadline:
                            print(f"{name} {mode} {calls}: the batch did not end in 10 s", flush=True)
                            proc.kill()
                            os._exit(3)
                    if mode == "host" and (not parent.poll(30) or parent.recv() != "finished"):
                        print(f"the worker did not finish ({name}, {mode}, {calls})", flush=True)
                        proc.kill()
                        os._exit(3)
                    per_call.append(start.elapsed_time(end) * 1000 / calls)
                    counter += 1 if mode == "gate" else calls
                ok = None
                if mode != "gate":  # the last call's outputs, taken aside, are its inputs' relu etc.
                    expected = torch.empty(shape, device="cuda")
                    fn(staged[calls - 1].view(shape), expected)
                    ok = bool(torch.allclose(aside[calls - 1].view(shape), expected, equal_nan=True))
                q = statistics.quantiles(per_call, n=10)
                rows[f"{mode} {calls}"] = {
                    "median_us": statistics.median(per_call),
                    "p10_us": q[0],
                    "p90_us": q[-1],
                    "outputs_right": ok,
                }
                print(
                    f"{name:12s} {mode:8s} {calls:3d} calls: {statistics.median(per_call):9.2f} µs a call "
                    f"(p10 {q[0]:.2f}, p90 {q[-1]:.2f}) outputs right: {ok}",
                    flush=True,
                )
        parent.send(None)
        proc.join()
        _check(cuda.cuMemHostUnregister(ctypes.c_void_p(address)), "unregister the host word")
        del word
        mapped.close()
        os.unlink(FLAG_FILE)
        results["kernels"][name] = rows
        with open(path, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
