"""GPU memory the evaluator lends a worker, by the GPU driver's own IPC handles.

Not torch's sharing of CUDA tensors: for each tensor lent, torch makes a reference-count file
in /dev/shm that the borrower must open and write, so a sandbox had to leave shared memory
itself open to code under test (other programs' files and semaphores lie there, and what is
written there outlives the build). Here the lender makes an allocation's handle
(cuIpcGetMemHandle) and keeps the allocation alive until it releases what it lent; the
borrower maps each allocation once (cuIpcOpenMemHandle), builds its tensors as views of it,
and unmaps it when the last of them is gone. No file is involved.

A payload is a pickle whose CUDA tensors are records (persistent ids): the
allocation's handle, where the tensor starts in it, its dtype, shape and strides, its GPU. A
worker whose sandbox opens one GPU sees it as device 0, where the evaluator may know it as
another: what it is lent is mapped on the GPU it sees. Lending runs in the evaluator only;
what a worker sends back is never unpickled by it.
"""

from __future__ import annotations

import base64
import ctypes
import functools
import io
import pickle

# CUipcMemHandle (and HIP's hipIpcMemHandle_t): 64 opaque bytes
HANDLE_BYTES = 64
# cuIpcOpenMemHandle's CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS (hipIpcMemLazyEnablePeerAccess)
LAZY_PEER_ACCESS = 1


class LendingError(RuntimeError):
    pass


class _Handle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * HANDLE_BYTES)]


class _Driver:
    """The five calls lending needs, from NVIDIA's driver (libcuda) or AMD's HIP runtime, which
    name them alike and take the same arguments (HIP's unverified: no AMD GPU here)."""

    NAMES = {"cuda": ("libcuda.so.1", "cuMemGetAddressRange_v2", "cuIpcGetMemHandle", "cuIpcOpenMemHandle_v2",
                      "cuIpcCloseMemHandle", "cuCtxSynchronize"),
             "hip": ("libamdhip64.so", "hipMemGetAddressRange", "hipIpcGetMemHandle", "hipIpcOpenMemHandle",
                     "hipIpcCloseMemHandle", "hipDeviceSynchronize")}

    def __init__(self, vendor: str):
        library, address_range, get_handle, open_handle, close_handle, synchronize = self.NAMES[vendor]
        lib = ctypes.CDLL(library)
        self.vendor = vendor
        self.address_range = getattr(lib, address_range)
        self.address_range.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_size_t),
                                       ctypes.c_uint64]
        self.get_handle = getattr(lib, get_handle)
        self.get_handle.argtypes = [ctypes.POINTER(_Handle), ctypes.c_uint64]
        self.open_handle = getattr(lib, open_handle)
        self.open_handle.argtypes = [ctypes.POINTER(ctypes.c_uint64), _Handle, ctypes.c_uint]
        self.close_handle = getattr(lib, close_handle)
        self.close_handle.argtypes = [ctypes.c_uint64]
        self.synchronize = getattr(lib, synchronize)
        self.synchronize.argtypes = []

    def check(self, status: int, what: str) -> None:
        if status != 0:
            raise LendingError(f"{what} failed ({self.vendor} error {status})")


@functools.lru_cache(maxsize=1)
def _driver() -> _Driver:
    import torch

    return _Driver("hip" if getattr(torch.version, "hip", None) else "cuda")


# -- the evaluator's side ----------------------------------------------------------------
class _Lender(pickle.Pickler):
    def __init__(self, out, torch):
        super().__init__(out, protocol=pickle.HIGHEST_PROTOCOL)
        self.torch = torch

    def persistent_id(self, obj):
        torch = self.torch
        if not (torch.is_tensor(obj) and obj.is_cuda):
            return None
        layout = (str(obj.dtype).removeprefix("torch."), tuple(obj.shape), tuple(obj.stride()))
        if obj.numel() == 0:
            return ("empty", obj.device.index or 0, *layout)
        driver = _driver()
        with torch.cuda.device(obj.device):
            base, size, handle = ctypes.c_uint64(), ctypes.c_size_t(), _Handle()
            driver.check(driver.address_range(ctypes.byref(base), ctypes.byref(size), obj.data_ptr()),
                         "finding a lent tensor's allocation")
            driver.check(driver.get_handle(ctypes.byref(handle), base.value), "making an allocation's IPC handle")
        return ("tensor", obj.device.index or 0, bytes(handle), size.value, obj.data_ptr() - base.value,
                *layout)


def lend(torch, value) -> str:
    """value (lists, tuples, dicts of CUDA tensors and plain values) as a payload a
    worker maps with `borrow`. What the tensors hold must be written by then: the evaluator's
    work on their GPU is waited for here, since the worker's streams cannot wait on it."""
    torch.cuda.synchronize()
    out = io.BytesIO()
    _Lender(out, torch).dump(value)
    return base64.b64encode(out.getvalue()).decode()


# -- the worker's side -------------------------------------------------------------------
class _Mapping:
    """One allocation mapped into this process; unmapped when the last tensor viewing it is
    gone (each holds it through its `_View`), once the GPU's work on it is done."""

    def __init__(self, handle: bytes):
        driver = _driver()
        self.pointer = ctypes.c_uint64()
        driver.check(driver.open_handle(ctypes.byref(self.pointer), _Handle.from_buffer_copy(handle), LAZY_PEER_ACCESS),
                     "mapping memory the evaluator lent")
        self._driver = driver

    def __del__(self):
        try:
            self._driver.synchronize()
            self._driver.close_handle(self.pointer.value)
        except Exception:  # noqa: BLE001 - at interpreter exit the library may be gone; the process's end unmaps it
            pass


class _View:
    """Bytes of a mapped allocation, as torch.as_tensor takes them (the CUDA array interface)."""

    def __init__(self, mapping: _Mapping, offset: int, length: int):
        self.mapping = mapping
        self.__cuda_array_interface__ = {"shape": (length,), "typestr": "|u1", "version": 2,
                                         "data": (mapping.pointer.value + offset, False)}


class _Borrower(pickle.Unpickler):
    def __init__(self, data: bytes, torch):
        super().__init__(io.BytesIO(data))
        self.torch = torch
        self.one_gpu = torch.cuda.device_count() == 1
        self.mappings: dict[bytes, _Mapping] = {}  # an allocation is mapped once a process

    def device(self, lent_on: int) -> int:
        """The GPU this process knows as the one the lender called lent_on."""
        return 0 if self.one_gpu else lent_on

    def persistent_load(self, record):
        kind, lent_on, *rest = record
        if kind == "empty":
            dtype, shape, stride = rest
            return self.torch.empty_strided(shape, stride, dtype=getattr(self.torch, dtype),
                                            device=f"cuda:{self.device(lent_on)}")
        if kind == "tensor":
            return self.tensor(self.device(lent_on), *rest)
        raise pickle.UnpicklingError(f"nothing lent is a {kind!r}")

    def tensor(self, device: int, handle: bytes, size: int, offset: int, dtype: str, shape: tuple, stride: tuple):
        torch = self.torch
        dtype = getattr(torch, dtype)
        length = extent(shape, stride) * dtype.itemsize
        if offset < 0 or offset + length > size:
            raise pickle.UnpicklingError("a lent tensor lies outside its allocation")
        with torch.cuda.device(device):
            if handle not in self.mappings:
                self.mappings[handle] = _Mapping(handle)
            raw = torch.as_tensor(_View(self.mappings[handle], offset, length))
        return raw.view(dtype).as_strided(shape, stride)


def extent(shape: tuple, stride: tuple) -> int:
    """How many elements a tensor of this shape and these strides spans, from its first (none
    when it has none)."""
    if 0 in shape:
        return 0
    return 1 + sum((n - 1) * s for n, s in zip(shape, stride))


def borrow(torch, payload: str):
    """What the evaluator lent (`lend`), mapped into this process."""
    torch.cuda.synchronize()  # a context of its own current before the driver is called
    return _Borrower(base64.b64decode(payload), torch).load()
