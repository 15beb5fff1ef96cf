"""Words of GPU memory that a stream waits on or writes, queued like a kernel (CUDA's stream
memory operations). A GPU batch handed over one call at a time (`DeviceRegion.start_handover`,
`batches.run_handed_over_on_gpu`) runs on them with neither host taking part: the evaluator's
stream releases each input set by writing a word the worker's stream waits on, and waits on the
word the worker's stream writes behind the call.

On the H200 (driver 580) a step costs the GPU's switch between the two processes both ways,
about 0.28 ms, within ±0.3 µs over a batch of 64 (`bench/gpu_handover.py`)."""

from __future__ import annotations

import ctypes
import functools

_WAIT_AT_LEAST = 0x0  # CU_STREAM_WAIT_VALUE_GEQ
_WRITE_FENCED = 0x0  # CU_STREAM_WRITE_VALUE_DEFAULT: earlier writes are seen before the word


@functools.cache
def _driver():
    """The CUDA driver's two stream memory operations, or None where there is no CUDA driver
    (a ROCm build of torch)."""
    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    for name in ("cuStreamWaitValue32_v2", "cuStreamWriteValue32_v2"):
        op = getattr(driver, name, None)
        if op is None:
            return None
        op.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint]
        op.restype = ctypes.c_int
    return driver


def available() -> bool:
    return _driver() is not None


def _check(result: int, what: str) -> None:
    if result:
        raise RuntimeError(f"queueing a {what} on a GPU stream failed (CUresult {result})")


def wait_at_least(stream, address: int, value: int) -> None:
    """`stream` (a torch CUDA stream) goes on once the 32-bit word at `address` is `value` or more."""
    _check(_driver().cuStreamWaitValue32_v2(stream.cuda_stream, address, value, _WAIT_AT_LEAST), "wait on a word")


def write(stream, address: int, value: int) -> None:
    """`stream` writes `value` into the 32-bit word at `address`, after everything queued before it."""
    _check(_driver().cuStreamWriteValue32_v2(stream.cuda_stream, address, value, _WRITE_FENCED), "word's write")


@functools.cache
def capturable(device_index: int) -> bool:
    """Whether this driver captures a wait on a word and a word's write in a CUDA graph (a GPU
    batch handed over one call at a time is then one replay of a graph, as a batch is in graph
    mode: `Worker.handover_graph`). Tried once per process and device, in a graph of its own."""
    import torch

    try:
        word = torch.zeros(1, dtype=torch.int32, device=torch.device("cuda", device_index))
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            stream = torch.cuda.current_stream()
            write(stream, word.data_ptr(), 1)
            wait_at_least(stream, word.data_ptr(), 1)
        graph.replay()
        return int(word.item()) == 1
    except RuntimeError:
        return False
