"""Words of GPU memory that a stream waits on or writes, queued like a kernel (CUDA's stream
memory operations), in memory the evaluator lent the worker. Every GPU batch runs between two
(`DeviceRegion.start`): the worker's stream waits for the gate word the evaluator's writes, and
the evaluator's waits for the done word the worker's writes behind the calls. A batch handed over
one call at a time (`DeviceRegion.start_handover`, `batches.run_handed_over_on_gpu`) runs on
them with neither host taking part: the evaluator's stream releases each input set by writing a
word the worker's stream waits on, and waits on the word the worker's stream writes behind the
call. Interprocess events would do the first, but the driver keeps their state in files in
/dev/shm that the worker must open, which its sandbox would then have to leave open.

On the H200 (driver 580) a step costs the GPU's switch between the two processes both ways,
about 0.28 ms, within ±0.3 µs over a batch of 64 (`bench/gpu_handover.py`)."""
from __future__ import annotations

import ctypes
import functools

_WAIT_AT_LEAST = 0x0  # CU_STREAM_WAIT_VALUE_GEQ (hipStreamWaitValueGte)
_WRITE_FENCED = 0x0  # CU_STREAM_WRITE_VALUE_DEFAULT: earlier writes are seen before the word
_ALL_BITS = 0xFFFFFFFF  # HIP's wait compares the word under a mask


@functools.cache
def _operations():
    """(wait, write) on a stream: the CUDA driver's stream memory operations, or HIP's (a ROCm
    build of torch; unverified, no AMD GPU here); None where neither library is there."""
    args = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint]
    for library, wait_name, write_name, wait_extra in (
            ("libcuda.so.1", "cuStreamWaitValue32_v2", "cuStreamWriteValue32_v2", []),
            ("libamdhip64.so", "hipStreamWaitValue32", "hipStreamWriteValue32", [ctypes.c_uint32])):
        try:
            lib = ctypes.CDLL(library)
        except OSError:
            continue
        wait, write = getattr(lib, wait_name, None), getattr(lib, write_name, None)
        if wait is None or write is None:
            continue
        wait.argtypes, write.argtypes = args + wait_extra, args
        wait.restype = write.restype = ctypes.c_int
        if wait_extra:
            return (lambda stream, address, value, flags: wait(stream, address, value, flags, _ALL_BITS)), write
        return wait, write
    return None


def available() -> bool:
    return _operations() is not None


def _check(result: int, what: str) -> None:
    if result:
        raise RuntimeError(f"queueing a {what} on a GPU stream failed (error {result})")


def wait_at_least(stream, address: int, value: int) -> None:
    """`stream` (a torch CUDA stream) goes on once the 32-bit word at `address` is `value` or more."""
    _check(_operations()[0](stream.cuda_stream, address, value, _WAIT_AT_LEAST), "wait on a word")


def write(stream, address: int, value: int) -> None:
    """`stream` writes `value` into the 32-bit word at `address`, after everything queued before it."""
    _check(_operations()[1](stream.cuda_stream, address, value, _WRITE_FENCED), "word's write")
